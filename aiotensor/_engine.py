"""The hot path: from an op's arguments to owned tensors, and fetches back, in one place.

:class:`Engine` holds a session's lifecycle state and everything an op goes through:
placement, arguments to buffers, safe points, memory, inline-or-submit, cancellation,
error mapping, registration and fetch. :meth:`Engine.op` is the path of one op (the
session methods, module-level ops and one-node expressions); :meth:`Engine.call` runs
any kernel (a :class:`~aiotensor._program.Program`, a fused function, an op sent to
the pool); :meth:`Engine.evaluate` compiles expressions into one program (``_compile``).
The session (``_session.py``) is a facade over it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _defaults, _fpwarn
from ._backends._allocator import out_for
from ._backends._base import Backend
from ._blocked_run import result_buffer
from ._compile import NEED_KEY, compile_program, compiled, program_need
from ._cost import HOLD_PER_OP_S, HOLD_THRESHOLDS, OVERHEAD_NS, PER_BYTE, SLICED_MAX, estimate_us
from ._errors import (
    AioTensorError,
    BackendError,
    InvalidArgumentError,
    InvalidDeviceError,
    NoSessionError,
    SessionClosedError,
    WrongEventLoopError,
)
from ._expr import Expr
from ._interpreter import Budget
from ._kernels import KernelResult, as_numeric, finalize, forgotten_await, info, kernel_error, normalize
from ._loopload import BUSY_INLINE_US, offload, stays_inline
from ._opdef import OPS, Cost, OpDef, namespace
from ._ops._apply import label as apply_label
from ._placement import program_cost
from ._program import Program, Step
from ._registry import Registry
from ._tensor import Tensor, make_tensor

if TYPE_CHECKING:
    from ._cleanup import CleanupPolicy
    from ._protocols import EngineLike, SessionLike
    from ._types import NDArray

__all__ = ["Engine", "State", "engine_of", "evaluating_engine", "expr_tensors", "owner_of", "session_engine"]

logger = logging.getLogger("aiotensor")

_ndarray = np.ndarray
_ufunc = np.ufunc
_NO_ERRSTATE = contextlib.nullcontext()
_fpwarn.install()
_UNKNOWN = Cost.UNKNOWN
_get_loop = asyncio.get_running_loop
#: The device variable of an engine no ``with s.device(...)`` has used: never set.
_UNPLACED: contextvars.ContextVar[str | None] = contextvars.ContextVar("aiotensor_device_unplaced", default=None)
_clock = time.perf_counter
_new = object.__new__
_base_run_inline = Backend.run_inline
# Ops the lean path of Engine.op takes: plain element-wise ops of one output, kernels of numpy's.
_ELEMENTWISE = frozenset(d for d in OPS.values() if d.elementwise and d.kernel_for(np) is not None)
# Their cost model's ns per byte, by op (an enum's hash is a Python call: too slow here).
_PER_BYTE_OF = {d: PER_BYTE[d.cost] for d in _ELEMENTWISE}


class State(enum.Enum):
    """A session's lifecycle: unopened -> (opening ->) open -> closing -> closed."""

    UNOPENED = "unopened"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_OPEN = State.OPEN
# Module constants: an enum member looked up on its class costs ~80 ns (EnumType.__getattr__).
_UNOPENED, _OPENING, _CLOSING, _CLOSED = State.UNOPENED, State.OPENING, State.CLOSING, State.CLOSED


class _HasExpr(Exception):
    """An argument is an expression: the op becomes an expression node."""


class Engine:
    """Runs the ops and fetches of one session (see the module docstring)."""

    def __init__(
        self,
        session: SessionLike,  # the AsyncEagerSession facade (a layer above)
        backend: Backend,
        policy: CleanupPolicy,
        registry: Registry,
        *,
        inline_us: float,
        log_placement: bool,
        soft_placement: bool,
        parent: Engine | None,
    ) -> None:
        # The session facade, strongly while this engine is not closed; weakly after (see
        # _let_go): the two refer to each other, and a cycle would leave every closed
        # session (a web service's one per request) to the garbage collector.
        self._session: SessionLike | None = session
        self._session_ref: weakref.ref[SessionLike] | None = None
        self.backend = backend
        self.policy = policy
        self.registry = registry
        self.ancestors: tuple[Engine, ...] = () if parent is None else (parent, *parent.ancestors)
        self.state = _UNOPENED
        self.inflight = 0
        self._inline_us = backend.inline_limit_us(inline_us)
        self._xp_name = backend.namespace
        self._xp = namespace(backend.namespace)
        # A backend that keeps the base class's run_inline lets the engine call kernels itself.
        self._plain_inline = type(backend).run_inline is _base_run_inline
        # Seconds the inline ops since this engine last suspended have held the loop, and
        # how many make the next op yield first (see HOLD_THRESHOLDS).
        self._held = 0.0
        self._hold_s = HOLD_THRESHOLDS * self._inline_us / 1e6 if self._inline_us > 0 else math.inf
        self._log = log_placement
        # Whether op() may take its lean path (see there): kernels inline, numpy, no limit to check.
        self._lean = (
            self._inline_us > 0
            and self._plain_inline
            and self._xp is np
            and registry.memory_limit is None
            and not log_placement
        )
        # The cost model's estimate (``_cost``) of an element-wise op is OVERHEAD_NS plus
        # bytes touched x ns per byte: it runs inline when the second term fits in this
        # (above the second, only while the loop is not busy: see _loopload).
        self._inline_ns = self._inline_us * 1000.0 - OVERHEAD_NS
        self._busy_ns = BUSY_INLINE_US * 1000.0 - OVERHEAD_NS
        # The lean path's device (a remote backend may know its devices only once started).
        self._device = backend.default_device if self._lean else ""
        self._soft = soft_placement
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lean_loop: asyncio.AbstractEventLoop | None = None  # _loop while lean and open
        self._loop_thread = 0
        self._opening: asyncio.Task[None] | None = None
        self._idle: asyncio.Event | None = None
        self._closed_event: asyncio.Event | None = None
        # The requested device of ``with s.device(...)``: a variable of its own is made by
        # the first such block (use_device); until then one that is never set.
        self.device_var: contextvars.ContextVar[str | None] = _UNPLACED
        #: Whether ``device_var`` was ever set (a ``with s.device(...)``): until then the lean
        #: paths need not read it.
        self.placed = False

    @property
    def session(self) -> SessionLike:
        """The session facade this engine serves (SessionClosedError once it closed and was dropped)."""
        s = self._session
        if s is None:
            s = None if self._session_ref is None else self._session_ref()
            if s is None:
                raise SessionClosedError("the session was closed, and nothing refers to it any more")
        return s

    def _let_go(self) -> None:
        # Closed: hold the session weakly, breaking the session <-> engine cycle, so a
        # closed session and all it holds (registry, policy) go when its last reference
        # does, not at the next garbage collection (20-100 µs a request in a busy service,
        # most of it full collections of what the cycles kept past the young generation).
        s = self._session
        if s is not None:
            self._session_ref = weakref.ref(s)
            self._session = None

    # -- lifecycle ------------------------------------------------------------------
    async def open(self) -> None:
        """Open the session if it is not open yet; raise if it is closed."""
        state = self.state
        if state is _OPEN:
            return
        if state is _UNOPENED:
            try:
                loop = _get_loop()
            except RuntimeError:  # e.g. trio, directly or through anyio
                raise WrongEventLoopError(
                    f"{self.session!r} needs a running asyncio event loop (asyncio or uvloop, also through"
                    " anyio's asyncio backend); none runs in this thread. trio is not supported: kernel"
                    " results come back as asyncio futures and IN_BACKGROUND frees from an asyncio task."
                ) from None
            if not self.backend.needs_start:
                # Nothing to await (the local backend): open now, without a task or a
                # trip through the loop, which is most of a request session's cost.
                self._bind(loop)
                self.policy.start(self.registry, loop)
                self._set_open()
                return
            self.state = _OPENING
            self._opening = loop.create_task(self._start())
        elif state is not _OPENING:
            raise SessionClosedError(f"{self.session!r} is closed")
        assert self._opening is not None
        await asyncio.shield(self._opening)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        # The events close() waits on are made when it has to wait: most sessions never do.

    async def _start(self) -> None:
        loop = _get_loop()
        self._bind(loop)
        try:
            await self.backend.start()
        except BaseException:
            self.state = _CLOSED
            self._let_go()
            if self._closed_event is not None:
                self._closed_event.set()
            raise
        self.policy.start(self.registry, loop)
        if self.state is _OPENING:
            self._set_open()

    def _set_open(self) -> None:
        self.state = _OPEN
        # One identity test on the lean path stands for "lean, open, and on its loop".
        self._lean_loop = self._loop if self._lean else None

    def _wrong_loop(self) -> WrongEventLoopError:
        return WrongEventLoopError(
            f"{self.session!r} is bound to the event loop it first ran on (thread {self._loop_thread});"
            " it was used from another loop or thread. Create one session per event loop."
        )

    def check_loop(self) -> None:
        """Raise WrongEventLoopError unless called on the session's loop."""
        try:
            loop = _get_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise self._wrong_loop()

    async def close(self, close_backend: Callable[[], Any] | None) -> None:
        """Refuse new ops, let in-flight ops settle, stop cleanup and free every buffer (idempotent)."""
        state = self.state
        if state is _CLOSED:
            return
        if state is _CLOSING:
            if self._closed_event is None:
                self._closed_event = asyncio.Event()
            await self._closed_event.wait()
            return
        if state is _UNOPENED:
            self.state = _CLOSED
            _defaults.replace_interactive(self.session, None)
            self._let_go()
            if close_backend is not None:
                await close_backend()
            return
        if state is _OPENING:
            assert self._opening is not None
            with contextlib.suppress(Exception):
                await asyncio.shield(self._opening)
            if self.state is _CLOSED:
                return
        if _get_loop() is not self._loop:  # (check_loop, inline: a running loop is certain in a coroutine)
            raise self._wrong_loop()
        self.state = _CLOSING
        self._lean_loop = None
        try:
            if self.inflight:
                self._idle = asyncio.Event()  # set by the last kernel to settle
                await self._idle.wait()
        finally:
            stopping = self.policy.stop()
            self.registry.close()
            self.state = _CLOSED
            _defaults.replace_interactive(self.session, None)
            self._let_go()
            if self._closed_event is not None:
                self._closed_event.set()
            try:
                if stopping is not None:
                    await asyncio.wait([stopping])
            finally:  # also when that wait is cancelled (anyio cancels every await in a scope)
                if close_backend is not None:
                    await close_backend()

    def finalize_unclosed(self) -> bool:
        """The session was dropped open: free everything on its loop. False if it was not open."""
        if self.state not in (_OPEN, _CLOSING):
            return False
        policy, registry, loop = self.policy, self.registry, self._loop

        def finalize() -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                policy.stop()
            registry.close()

        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finalize)
                return True
        finalize()
        return True

    @property
    def inline_us(self) -> float:
        """How long (estimated µs) a kernel may run inline on the loop; 0: never."""
        return self._inline_us

    async def _yield_held(self) -> None:
        # Inline work (ops, fused calls, expressions, small fetches) never suspends: once
        # a run of it has held the loop for the budget (HOLD_THRESHOLDS), the next piece
        # lets other tasks have the loop once. What the run dropped is freed first, so
        # the cleanup task need not wake for it.
        self._held = 0.0
        if self.policy.inline_point is not None:
            self.policy.inline_point()
        await asyncio.sleep(0)

    # -- placement and arguments ------------------------------------------------------
    def use_device(self, name: str) -> contextvars.Token[str | None]:
        """Request device ``name`` in the current context (``with s.device(name)``); reset with the token."""
        if not self.placed:
            self.device_var = contextvars.ContextVar("aiotensor_device", default=None)
            self.placed = True  # from now on, ops read device_var
        return self.device_var.set(name)

    def place(self, op: str) -> str:
        """The device ``op`` runs on."""
        requested = self.device_var.get()
        if requested is None:  # the common case: no list of devices needed
            return self.backend.default_device
        devices = self.backend.devices()
        if requested in devices:
            return requested
        if self._soft:
            return devices[0]
        raise InvalidDeviceError(
            f"{op}: no device {requested!r}; this session has {devices}."
            f" Set SessionConfig(allow_soft_placement=True) to fall back to {devices[0]!r}"
        )

    def buffer(self, t: Tensor, op: str) -> Any:
        """The buffer of ``t``, which this session may read (its own or an ancestor's)."""
        owner = t._engine
        if owner is not self and owner not in self.ancestors:
            raise InvalidArgumentError(
                f"{op}: tensor {t.name!r} belongs to another session ({owner.session!r}); "
                "use it in its own session, or read it from a child session (parent=)"
            )
        try:
            return t._registry._buffers[t._rid][0]
        except KeyError:
            raise SessionClosedError(f"{op}: tensor {t.name!r} was freed because its session closed") from None

    def _seq(self, x: list[Any] | tuple[Any, ...], op: str) -> Any:
        # Tensors are looked for one level deep (concat's list, an index tuple), not in
        # nested data: walking a 512 x 64 list of floats on the loop for nothing is slow.
        out = None
        for i, e in enumerate(x):
            te = type(e)
            if te is Tensor:
                if out is None:
                    out = list(x[:i])
                out.append(self.buffer(e, op))
            elif te is Expr:
                raise _HasExpr
            elif out is not None:
                out.append(e)
        return x if out is None else type(x)(out)

    # -- one op -------------------------------------------------------------------------
    async def op(
        self, d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None, nbytes: int | None, name: str | None
    ) -> Any:
        """Run op ``d`` on prepared arguments; its tensor (a list for ``split``, a tuple for multi-output ``apply``)."""
        if self._held >= self._hold_s:
            await self._yield_held()  # before anything is reserved or run
            if kwargs is None and d in _ELEMENTWISE:
                # Every caller of an element-wise op tried the lean path before calling
                # here (it refuses while a yield is due): once more after the yield.
                t = self.lean(d, args, name)
                if t is not None:
                    return t
        if self.state is not _OPEN:
            await self.open()
        if _get_loop() is not self._loop:
            raise self._wrong_loop()
        if name is not None and type(name) is not str:
            raise InvalidArgumentError(f"{d.name}: name must be a str, got {type(name).__name__}")
        label = d.name if not d.user else apply_label(args[0])
        n = d.data
        checked = 0
        bufs = []
        try:
            for i, a in enumerate(args):
                ta = type(a)
                if ta is Tensor:
                    bufs.append(self.buffer(a, label))
                elif ta is Expr:
                    raise _HasExpr
                else:
                    if i < n:
                        checked = n
                    bufs.append(self._seq(a, label) if ta is list or ta is tuple else a)
            kw = {k: self._value(v, label) for k, v in kwargs.items()} if kwargs else {}
        except _HasExpr:
            node = Expr(d, args, kwargs, nbytes)
            (result,) = await self.evaluate([node], name)
            return result
        device = self.place(label) if self.placed else self.backend.default_device
        limit = self._inline_us
        est = estimate_us(d, bufs, kw, nbytes) if limit and d.cost is not _UNKNOWN else math.inf  # type: ignore[arg-type]
        if est <= limit and (est <= BUSY_INLINE_US or not offload(est)):  # (_loopload: a busy loop offloads)
            if nbytes is None and d.returns == "one" and self.registry.memory_limit is None:
                # Nothing to reserve or wait for: run and own it without another coroutine frame.
                policy = self.policy
                if policy.safe_point is not None:
                    policy.safe_point()
                if policy.inline_point is not None:
                    policy.inline_point()
                out = self._run_inline(d, label, bufs, kw, checked, args)
                if type(out) is not KernelResult:
                    return self._register(out, label, name, device)
                return (await self._own(out, label, name, None, device))[0]
            return await self._inline(d, label, bufs, kw, nbytes, name, checked, args, device)
        if not kw and d in _ELEMENTWISE and self.registry.cache is not None:
            kw = self._recycled_out(d, bufs)
        step = Step(d, checked, self._xp_name, getattr(args[0], "__name__", None) if d.user else None)
        described = args[1:] if d.user else args  # apply: the function is in the label
        tensors, multi = await self.call(
            label, step, tuple(bufs), kw, described, user=d.user, nbytes=nbytes, name=name, blas=d.blas
        )
        return _shape_result(d, tensors, multi)

    def lean(self, d: OpDef, args: tuple[Any, ...], name: str | None) -> Tensor | None:
        """The lean path of an element-wise op (``d`` in ``_ELEMENTWISE``), synchronously; None to take :meth:`op`.

        Session methods, module-level functions and one-node expressions of such ops
        call it before :meth:`op`, saving a coroutine frame on the hottest path;
        :meth:`op` tries it again only after it yielded the loop.
        """
        if not (
            self._lean_loop is not None  # (first: no running loop at all raises in _get_loop)
            and _get_loop() is self._lean_loop
            and self._held < self._hold_s
            and (name is None or type(name) is str)
            and (not self.placed or self.device_var.get() is None)
        ):
            return None
        # The hottest path: an element-wise op on tensors of one shape and numbers, cheap
        # enough to run inline, in a session without a memory limit. Each step is the
        # general path's below, without its calls; anything unusual falls through to it.
        bufs = []
        shape = None
        total = largest = 0
        for a in args:
            ta = type(a)
            if ta is Tensor:
                owner = a._engine
                if owner is not self and owner not in self.ancestors:
                    break
                try:
                    entry = a._registry._buffers[a._rid]
                except KeyError:
                    break
                if shape is not None and a._shape != shape:
                    break
                shape = a._shape
                n = a._nbytes
                total += n
                if n > largest:
                    largest = n
                bufs.append(entry[0])
            elif ta is float or ta is int:
                bufs.append(a)
            else:
                break
        else:
            cost_ns = (total + largest) * _PER_BYTE_OF[d]
            if shape is not None and cost_ns <= self._inline_ns and (cost_ns <= self._busy_ns or stays_inline()):
                policy = self.policy
                safe_point = policy.safe_point
                if safe_point is not None:
                    safe_point()
                if policy.inline_point is not None:
                    policy.inline_point()
                kernel = d._np_kernel
                registry = self.registry
                cache = registry.cache
                start = _clock()
                try:
                    if cache is not None and largest >= cache.min_bytes and cache.cached_bytes:
                        recycled = out_for(cache, kernel, bufs) if type(kernel) is _ufunc else None
                        out = kernel(*bufs) if recycled is None else kernel(*bufs, out=recycled)  # type: ignore[misc]
                    else:
                        out = kernel(*bufs)  # type: ignore[misc]
                except RuntimeWarning:  # numpy's, an exception here (_fpwarn): reported at the caller's line
                    out = _fpwarn.rerun(d.name, kernel, bufs, None)
                except Exception as exc:
                    self._held += HOLD_PER_OP_S  # a failing op holds the loop too: a loop of them yields
                    error = kernel_error(d.name, args, exc, False)
                    raise error from error.__cause__
                took = _clock() - start
                registry.kernel_seconds += took
                self._held += took + HOLD_PER_OP_S
                # A ufunc's output is a fresh array (or its out=, a cached buffer that owns its
                # memory): only other kernels may return an input as it is. setflags(False),
                # positional: a quarter of the cost of ``out.flags.writeable = False``.
                if type(out) is _ndarray and (type(kernel) is _ufunc or (out.base is None and out.flags.writeable)):
                    out.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
                    nbytes = out.nbytes
                    # make_tensor, written out: one call less on the hottest path.
                    t = _new(Tensor)
                    t._engine = self
                    t._registry = registry
                    t._rid = registry.add(out, nbytes)
                    t._shape = shape  # (tensors of this shape and numbers: the output's; out.shape is a new tuple)
                    t._dtype = out.dtype
                    t._nbytes = nbytes
                    t._label = name or d.label
                    t._device = self._device
                    if safe_point is not None:
                        safe_point()
                    return t
                # A numpy scalar (0-d inputs), an input returned as it is: owned as _own would
                # (no memory limit to fit here), as the op's one result.
                result = normalize(out)
                tensors = [
                    self._wrap(b.handle, b.shape, b.dtype, b.nbytes, d.name, name, i, result.multi, self._device)
                    for i, b in enumerate(result.buffers)
                ]
                if safe_point is not None:
                    safe_point()
                return tensors[0]
        return None

    def _recycled_out(self, d: OpDef, bufs: list[Any]) -> dict[str, Any]:
        # A large element-wise ufunc on the pool writes into a buffer the session freed
        # (``out=``): no page faults, and the resident set stays flat (see ``_allocator``).
        cache = self.registry.cache
        kernel = d._np_kernel
        if cache is None or type(kernel) is not _ufunc or self._xp is not np:
            return {}
        if not cache.cached_bytes:
            return {}
        if max((b.nbytes for b in bufs if type(b) is _ndarray), default=0) < cache.min_bytes:
            return {}
        recycled = out_for(cache, kernel, bufs)
        return {} if recycled is None else {"out": recycled}

    def _value(self, v: Any, op: str) -> Any:
        tv = type(v)
        if tv is Tensor:
            return self.buffer(v, op)
        if tv is Expr:
            raise _HasExpr
        if tv is list or tv is tuple:
            return self._seq(v, op)
        return v

    async def _inline(
        self,
        d: OpDef,
        label: str,
        bufs: list[Any],
        kw: dict[str, Any],
        nbytes: int | None,
        name: str | None,
        checked: int,
        args: tuple[Any, ...],
        device: str,
    ) -> Any:
        registry, policy = self.registry, self.policy
        safe_point = policy.safe_point
        if safe_point is not None:
            safe_point()
        if policy.inline_point is not None:
            policy.inline_point()
        limited = registry.memory_limit is not None
        if nbytes is not None or limited:
            await self._reserve(label, nbytes)
        try:
            out = self._run_inline(d, label, bufs, kw, checked, args)
        finally:
            if nbytes is not None:
                registry.unreserve(nbytes)
        if type(out) is KernelResult:  # views, scalars, split, multi-output apply: the general shape
            tensors = await self._own(out, label, name, nbytes, device)
            return _shape_result(d, tensors, out.multi)
        if limited:
            await self._fit_result(label, KernelResult([info(out)], False), nbytes)
        return self._register(out, label, name, device)

    def _run_inline(
        self, d: OpDef, label: str, bufs: list[Any], kw: dict[str, Any], checked: int, args: tuple[Any, ...]
    ) -> Any:
        """Run ``d``'s kernel here: a fresh owned read-only ndarray, or a KernelResult for the rest."""
        kernel = d._np_kernel if self._xp is np else None
        if kernel is None:
            kernel = d.kernel_for(self._xp)
        try:
            if checked:
                bufs[:checked] = [as_numeric(b) for b in bufs[:checked]]
            start = _clock()
            try:
                out = kernel(*bufs, **kw) if kw else kernel(*bufs)
            except RuntimeWarning:  # numpy's, an exception here (_fpwarn): reported at the caller's line
                out = _fpwarn.rerun(label, kernel, bufs, kw)
            took = _clock() - start
            self.registry.kernel_seconds += took
            self._held += took + HOLD_PER_OP_S
            if d.returns == "one" and type(out) is _ndarray and out.base is None:
                if out.flags.writeable:  # a fresh output: own it as it is
                    out.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
                    return out
                return finalize(out)  # an input returned as it is
            return normalize(out)
        except Exception as exc:
            self._held += HOLD_PER_OP_S  # a failing op holds the loop too: a loop of them yields
            error = kernel_error(label, args, exc, d.user)
            raise error from error.__cause__

    def _register(self, out: NDArray, label: str, name: str | None, device: str) -> Tensor:
        registry = self.registry
        nbytes = out.nbytes
        # make_tensor, written out (as in lean): one call less for every inline result.
        t = _new(Tensor)
        t._engine = self
        t._registry = registry
        t._rid = registry.add(out, nbytes)
        t._shape = out.shape
        t._dtype = out.dtype
        t._nbytes = nbytes
        t._label = name or (label, -1)
        t._device = device
        safe_point = self.policy.safe_point
        if safe_point is not None:
            safe_point()
        if self._log:
            logger.info("%s: %s on %s", label, t.name, device)
        return t

    # -- any kernel ---------------------------------------------------------------------
    async def call(
        self,
        label: str,
        kernel: Callable[..., Any],
        bufs: tuple[Any, ...],
        kw: dict[str, Any],
        described: tuple[Any, ...],
        *,
        user: bool,
        nbytes: int | None = None,
        name: str | None = None,
        est_us: float = math.inf,
        budget: Budget | None = None,
        need: int | None = None,
        blas: bool = False,
    ) -> tuple[list[Tensor], bool]:
        """Run ``kernel(*bufs, **kw)`` inline (when ``est_us`` allows) or on the backend; own its outputs.

        ``described`` are the arguments as the caller gave them, for error messages.
        ``budget`` (a :class:`~aiotensor._interpreter.Budget`) gets the bytes its
        intermediates may hold under ``memory_limit``, reserved for the run
        (:meth:`_hold`): ``need`` bytes when the caller knows them, else what is free.
        A :class:`~aiotensor._program.Program` estimated at most ``SLICED_MAX``
        thresholds runs on the loop in slices (:meth:`_run_sliced`).
        """
        if self._held >= self._hold_s and est_us <= SLICED_MAX * self._inline_us:
            await self._yield_held()  # this kernel would not suspend either
        lean_loop = self._lean_loop
        if lean_loop is not None and _get_loop() is lean_loop and (not self.placed or self.device_var.get() is None):
            device = self._device  # open, on its loop, the default device: the checks below in one
        else:
            if self.state is not _OPEN:
                await self.open()
            self.check_loop()
            device = self.place(label)
        registry, policy = self.registry, self.policy
        safe_point = policy.safe_point
        if safe_point is not None:
            safe_point()
        inline = est_us <= self._inline_us and self._inline_us > 0
        sliced = not inline and est_us <= SLICED_MAX * self._inline_us and isinstance(kernel, Program)
        if (inline or sliced) and est_us > BUSY_INLINE_US and offload(est_us):
            inline = sliced = False  # a busy loop (_loopload) sends it to the pool
        if (inline or sliced) and policy.inline_point is not None:
            policy.inline_point()  # runs on the loop without suspending: free what was dropped first
        if inline and nbytes is None and registry.memory_limit is None and self._plain_inline:
            # The common inline case: nothing to reserve or fit.
            return self._run_owned(label, kernel, bufs, kw, described, user, name, budget, device)
        held = 0
        if registry.memory_limit is not None and budget is not None:
            budget.limit, held = await self._hold(label, need)
        if nbytes is not None or (registry.memory_limit is not None and budget is None):
            try:
                await self._reserve(label, nbytes)
            except BaseException:
                if held:
                    registry.unreserve(held)
                raise
        try:
            if inline:
                start = _clock()
                result = self.backend.run_inline(kernel, bufs, kw)
                took = _clock() - start
                registry.kernel_seconds += took
                self._held += took + HOLD_PER_OP_S
            elif sliced:
                result = await self._run_sliced(label, cast(Program, kernel), bufs)
            else:
                self._held = 0.0
                if not kw and getattr(kernel, "spawning", None) is not None and self.backend.in_process:
                    kw = result_buffer(registry.cache, bufs)  # a blocked run's result into a freed buffer
                try:
                    # blas= only when set: a backend written before it existed still runs the rest.
                    submit = self.backend.submit
                    fp = _fpwarn.collecting()  # numpy's warnings on the worker, reported at the caller's line
                    with fp[0] if fp is not None else _NO_ERRSTATE:  # (the worker gets a copy of this context)
                        pending = (
                            submit(kernel, bufs, kw, device=device, blas=True)
                            if blas
                            else submit(kernel, bufs, kw, device=device)
                        )
                except RuntimeError as exc:
                    raise BackendError(f"{label}: the backend cannot run kernels: {exc}") from exc
                result = await self._await_kernel(pending)
                if fp is not None and fp[1].errors:
                    _fpwarn.reissue(label, fp[1].errors)
        except (asyncio.CancelledError, AioTensorError):
            raise
        except Exception as exc:
            error = kernel_error(label, described, exc, user)
            raise error from error.__cause__
        finally:
            if nbytes is not None:
                registry.unreserve(nbytes)
            if held:
                registry.unreserve(held)  # (the results' bytes are checked again as they are owned)
            if budget is not None:
                self._settle(budget)
        if self.state is not _OPEN:
            for buf in result.buffers:
                self.backend.release(buf.handle)
            raise SessionClosedError(f"{label}: the session was closed while the op ran")
        return await self._own(result, label, name, nbytes, device), result.multi

    async def _run_sliced(self, label: str, program: Program, bufs: tuple[Any, ...]) -> KernelResult:
        # The program on this thread, a slice at a time: each slice ends after the step
        # that takes it past the inline threshold. Slices count towards the hold budget
        # of inline ops, and other tasks get the loop between two once it is spent: a
        # yield per slice cost a 10-op 256x256 chain ~10% on asyncio.
        run = program.sliced(*bufs)
        registry = self.registry
        span = self._inline_us / 1e6
        while True:
            start = _clock()
            done = run.advance(start + span)
            took = _clock() - start
            registry.kernel_seconds += took
            self._held += took
            if done:
                return normalize(run.result)
            if self._held >= self._hold_s:
                await self._yield_held()
                if self.state is not _OPEN:
                    raise SessionClosedError(f"{label}: the session was closed while the op ran")

    def call_inline(
        self,
        label: str,
        kernel: Callable[..., Any],
        bufs: tuple[Any, ...],
        kw: dict[str, Any],
        described: tuple[Any, ...],
        *,
        user: bool,
        est_us: float,
        budget: Budget | None = None,
    ) -> tuple[list[Tensor], bool] | None:
        """:meth:`call`'s common case without a coroutine frame, or ``None`` (then await :meth:`call`).

        It applies to a lean session (open, on its loop, numpy, no memory limit) on its
        default device, for a kernel whose ``est_us`` is within the inline threshold
        (and, above ``BUSY_INLINE_US``, while the loop is not busy: else :meth:`call`
        sends it to the pool), while the run of inline work has not spent its hold
        budget (then :meth:`call` yields first).
        """
        lean_loop = self._lean_loop
        if (
            est_us > self._inline_us
            or self._held >= self._hold_s  # time to yield: call() does
            or lean_loop is None
            or _get_loop() is not lean_loop
            or (self.placed and self.device_var.get() is not None)
            or (est_us > BUSY_INLINE_US and not stays_inline())  # (last: it counts the kernel as kept)
        ):
            return None
        policy = self.policy
        if policy.safe_point is not None:
            policy.safe_point()
        if policy.inline_point is not None:
            policy.inline_point()
        return self._run_owned(label, kernel, bufs, kw, described, user, None, budget, self._device)

    def _run_owned(
        self,
        label: str,
        kernel: Callable[..., Any],
        bufs: tuple[Any, ...],
        kw: dict[str, Any],
        described: tuple[Any, ...],
        user: bool,
        name: str | None,
        budget: Budget | None,
        device: str,
    ) -> tuple[list[Tensor], bool]:
        # Run a kernel here and own its outputs, in a session without a memory limit to
        # fit them under: a fresh array is owned as it is.
        registry = self.registry
        try:
            start = _clock()
            try:
                out = kernel(*bufs, **kw) if kw else kernel(*bufs)
            except RuntimeWarning:  # numpy's, an exception here (_fpwarn): reported at the caller's line
                out = _fpwarn.rerun(label, kernel, bufs, kw)
            took = _clock() - start
            registry.kernel_seconds += took
            self._held += took + HOLD_PER_OP_S
            fresh = type(out) is _ndarray and out.base is None and out.flags.writeable
            result = None if fresh else normalize(out)
        except (asyncio.CancelledError, AioTensorError):
            self._held += HOLD_PER_OP_S  # (an op inside a fused function failed)
            raise
        except Exception as exc:
            self._held += HOLD_PER_OP_S
            error = kernel_error(label, described, exc, user)
            raise error from error.__cause__
        finally:
            if budget is not None and budget.count > budget.escaped:
                self._settle(budget)  # before the result is registered: peak counts it once
        if result is None:
            out.setflags(False)  # (positional: cheaper; numpy accepts it)
            return [self._register(out, label, name, device)], False
        return self._take(result, label, name, device), result.multi

    def _settle(self, budget: Budget) -> None:
        registry = self.registry
        if budget.count > budget.escaped and not registry.closed:
            # Intermediates never reached the registry: record them as allocated and
            # freed, and their peak in peak_bytes.
            registry.count_unregistered(budget.count - budget.escaped)
            registry.peak_bytes = max(registry.peak_bytes, registry.live_bytes + budget.peak)

    async def _own(
        self, result: KernelResult, label: str, name: str | None, reserved: int | None, device: str
    ) -> list[Tensor]:
        # A kernel's buffers become the session's: checked against the limit, registered,
        # given handles; then the safe point after the op.
        if self.registry.memory_limit is not None:
            await self._fit_result(label, result, reserved)
        return self._take(result, label, name, device)

    def _take(self, result: KernelResult, label: str, name: str | None, device: str) -> list[Tensor]:
        # _own once the result fits: registered, given handles; then the safe point after the op.
        tensors = [
            self._wrap(b.handle, b.shape, b.dtype, b.nbytes, label, name, i, result.multi, device)
            for i, b in enumerate(result.buffers)
        ]
        safe_point = self.policy.safe_point
        if safe_point is not None:
            safe_point()
        if self._log:
            logger.info("%s: %s on %s", label, tensors[0].name, device)
        return tensors

    async def _hold(self, label: str, need: int | None) -> tuple[int, int]:
        # (the budget of a multi-op kernel's values, the bytes reserved for it). A known
        # ``need`` is reserved for the run, so that concurrent computations cannot
        # together exceed memory_limit: waited for (memory_wait), or held as far as it
        # fits (it is an upper bound: the run's budget raises if it really does not
        # fit). An unknown one (a fused function's first run for its shapes) gets what
        # is free once admitted, reserving nothing (it would starve every other op).
        # Either way the buffer cache gives way first.
        registry = self.registry
        limit = registry.memory_limit
        assert limit is not None
        reclaim = self.policy.reclaims
        if reclaim:
            registry.collect()  # pending buffers first: their room is the cheapest
        gate = registry.gate
        if gate is not None:
            wanted = None if need is None else min(need, limit)
            await gate.acquire(wanted, label, reclaim=reclaim)  # reserves ``wanted`` once it fits
            if self.state is not _OPEN:
                if wanted is not None:
                    registry.unreserve(wanted)
                raise SessionClosedError(f"{label}: the session was closed while the op waited for memory")
            if wanted is not None:
                return wanted, wanted
        free = max(0, limit - registry.live_bytes - registry.reserved)
        hold = free if need is None else min(need, free)
        registry.make_room(hold)  # the cache gives way first
        if need is None:
            return hold, 0
        registry.reserved += hold
        return hold, hold

    async def _reserve(self, label: str, nbytes: int | None) -> None:
        registry = self.registry
        gate = registry.gate
        if gate is not None:
            # memory_wait: queue for room under memory_limit (see _memory.py).
            await gate.acquire(nbytes, label, reclaim=self.policy.reclaims)
            if self.state is not _OPEN:
                if nbytes is not None:
                    registry.unreserve(nbytes)
                raise SessionClosedError(f"{label}: the session was closed while the op waited for memory")
        elif nbytes is not None:
            registry.reserve(nbytes, label, reclaim=self.policy.reclaims)

    async def _await_kernel(self, pending: Any) -> KernelResult:
        self.inflight += 1
        try:
            result: KernelResult = await pending
            # Timed on the worker by aiotensor's pool; other backends' pending kernels have no clock.
            self.registry.kernel_seconds += getattr(pending, "seconds", 0.0)
            return result
        except asyncio.CancelledError:
            pending.abandon(self._adopt)
            task = asyncio.current_task()
            if task is not None and not task.cancelling():
                # Nobody cancelled the caller: the backend cancelled the kernel (e.g. its
                # executor was shut down with cancel_futures). A bare CancelledError would
                # look like a cancellation of the caller's task and end it silently.
                raise BackendError("the backend cancelled the kernel (was its executor shut down?)") from None
            raise
        finally:
            self.inflight -= 1
            if not self.inflight and self._idle is not None:
                self._idle.set()

    def _wrap(
        self,
        buf: Any,
        shape: tuple[int, ...],
        dtype: Any,
        nbytes: int,
        op: str,
        name: str | None,
        i: int,
        multi: bool,
        device: str,
    ) -> Tensor:
        registry = self.registry
        rid = registry.add(buf, nbytes)
        label: str | tuple[str, int] = (op, -1) if name is None else ((name, i) if multi else name)
        return make_tensor(self, registry, rid, shape, dtype, nbytes, label, device)

    def _adopt(self, result: KernelResult) -> None:
        # A kernel finished after its caller was cancelled: own the result as if its
        # handle had been dropped at once, so the strategy frees it (or close does).
        registry = self.registry
        for buf in result.buffers:
            if registry.closed:
                self.backend.release(buf.handle)
            else:
                registry.notify_dropped(registry.add(buf.handle, buf.nbytes))

    async def _fit_result(self, op: str, result: KernelResult, reserved: int | None) -> None:
        # Checked before the buffers get handles: a result rejected after wrapping left
        # a handle whose later drop queued an already-freed id (stats().pending was off).
        registry = self.registry
        nbytes = sum(buf.nbytes for buf in result.buffers)
        gate = registry.gate
        if gate is not None and reserved is not None and nbytes <= reserved:
            return  # its room was reserved before the kernel ran
        try:
            if gate is None:
                registry.check_result(nbytes, op, reclaim=self.policy.reclaims)
            else:
                await gate.fit_result(nbytes, op, reclaim=self.policy.reclaims)
                if self.state is not _OPEN:
                    raise SessionClosedError(f"{op}: the session was closed while the op waited for memory")
        except BaseException:
            for buf in result.buffers:
                self.backend.release(buf.handle)
            raise

    # -- expressions ----------------------------------------------------------------------
    def evaluate_expr(self, expr: Expr) -> Any:
        """``await expr``: its tensor at once when its program runs inline, else a coroutine giving it.

        ``Expr.__await__`` calls this. In a lean session, a program within the inline
        threshold runs here through :meth:`call_inline`, as fused calls do, with no
        coroutine of :meth:`_run_program` and :meth:`call` around it. Otherwise (one
        node, a session that is not lean, a program over the threshold, a spent hold
        budget, a freed tensor) the coroutine takes the general path, with its checks
        and errors, on the program compiled here.
        """
        if expr._n == 1:  # one node: the op path (see evaluate)
            return self._evaluate_one(expr)
        expr._used = True
        program, leaves, costs = compiled(expr, _is_tensor, self._xp_name, Expr)
        engine = evaluating_engine(leaves)
        lean_loop = engine._lean_loop
        if lean_loop is not None and _get_loop() is lean_loop:
            bufs = []
            for t in leaves:
                owner = t._engine
                if owner is not engine and owner not in engine.ancestors:
                    break  # unreadable: the general path raises, naming the tensor
                entry = t._registry._buffers.get(t._rid)
                if entry is None:
                    break
                bufs.append(entry[0])
            else:
                inline_us = engine._inline_us
                est = costs.get(inline_us)
                if est is None:
                    est = costs[inline_us] = program_cost(program, leaves, inline_us)
                done = engine.call_inline(
                    expr._d.name, program, tuple(bufs), {}, tuple(leaves), user=False, est_us=est, budget=program.budget
                )
                if done is not None:  # (None: nothing ran, the program is still fresh)
                    return done[0][0] if expr._d.returns == "one" else _shape_result(expr._d, *done)
        return engine._run_expr(program, leaves, expr, costs)

    async def _evaluate_one(self, expr: Expr) -> Tensor:
        (t,) = await self.evaluate([expr], None, choose=True)
        return t  # type: ignore[no-any-return]

    async def _run_expr(self, program: Program, leaves: list[Tensor], expr: Expr, costs: dict[float, float]) -> Any:
        tensors = await self._run_program(program, leaves, [expr], None, costs)
        return tensors[0]

    async def evaluate(self, roots: list[Expr], name: str | None = None, *, choose: bool = False) -> list[Any]:
        """Evaluate expressions in one program; only their results are registered."""
        for r in roots:
            r._used = True
        costs: dict[float, float] = {}
        if len(roots) == 1:
            r = roots[0]
            if r._n == 1:
                # One node on tensors and values: the op path, without compiling anything.
                engine = (
                    evaluating_engine([x for x in _flat(r._args, r._kwargs) if type(x) is Tensor]) if choose else self
                )
                if r._kwargs is None and r._d in _ELEMENTWISE:
                    t = engine.lean(r._d, r._args, name)  # (op() expects its caller to have tried)
                    if t is not None:
                        return [t]
                return [await engine.op(r._d, r._args, r._kwargs, r._nbytes, name)]
            program, leaves, costs = compiled(r, _is_tensor, self._xp_name, Expr)
        else:
            program, leaves = compile_program(roots, _is_tensor, self._xp_name, Expr)
        engine = evaluating_engine(leaves) if choose else self
        return await engine._run_program(program, leaves, roots, name, costs)

    async def _run_program(
        self, program: Program, leaves: list[Tensor], roots: list[Expr], name: str | None, costs: dict[float, float]
    ) -> list[Any]:
        if self.state is not _OPEN:
            await self.open()
        self.check_loop()
        label = roots[0]._d.name if len(roots) == 1 else "run"
        bufs = tuple([self.buffer(t, label) for t in leaves])
        est = costs.get(self._inline_us)
        if est is None:
            est = costs[self._inline_us] = program_cost(program, leaves, self._inline_us)
        need = None
        limit = self.registry.memory_limit
        if limit is not None:
            found = costs.get(NEED_KEY)
            if found is None:
                bound = program_need(program, leaves)
                found = costs[NEED_KEY] = math.inf if bound is None else float(bound)
            if found != math.inf:
                # An upper bound: never more than what the limit leaves beside the leaves it reads.
                need = int(min(found, max(0, limit - sum(t._nbytes for t in leaves))))
        tensors, multi = await self.call(
            label,
            program,
            bufs,
            {},
            tuple(leaves),
            user=False,
            name=name,
            est_us=est,
            budget=program.budget,
            need=need,
            blas=program.blas,
        )
        if len(roots) == 1 and roots[0]._d.returns != "one":
            return [_shape_result(roots[0]._d, tensors, multi)]
        return tensors

    async def run_values(self, fetches: list[Any], api: str, *, explicit: bool = True) -> list[NDArray]:
        """The numpy values of tensors and expressions; results made for them are freed at once.

        ``explicit``: this session was named (``s.run``, ``e.eval(session=s)``) and
        evaluates; else :func:`evaluating_engine` chooses (``e.eval()``).
        """
        exprs = [f for f in fetches if type(f) is Expr]
        made: dict[int, Any] = {}  # id(expression) -> its tensor, or its list/tuple of tensors
        engine = self
        if exprs:
            unique = list({id(e): e for e in exprs}.values())
            results = await self._evaluate_each(unique, choose=not explicit)
            made = {id(e): r for e, r in zip(unique, results, strict=True)}
            if not explicit:
                first = _flat_results(results)
                if first:
                    engine = owner_of(first[0])  # the session that evaluated them reads them
        try:
            flat: list[Tensor] = []
            spans: list[tuple[int, int, type | None]] = []  # per fetch: its values in ``flat``, its sequence type
            for f in fetches:
                value = made[id(f)] if type(f) is Expr else f
                kind = type(value) if isinstance(value, list | tuple) else None  # (named tuples too)
                items = list(value) if kind is not None else [value]
                spans.append((len(flat), len(flat) + len(items), kind))
                flat += items
            values = await engine.fetch(flat, api)
            return [values[a] if kind is None else _same_kind(kind, values[a:b]) for a, b, kind in spans]
        finally:
            for t in _flat_results(list(made.values())):
                self.discard(t)

    async def _evaluate_each(self, roots: list[Expr], *, choose: bool) -> list[Any]:
        # One program for the roots of one result each; a root of several (split, an
        # apply returning a tuple) in a program of its own, so its results stay together.
        single = [r for r in roots if r._d.returns == "one"]
        out: dict[int, Any] = {}
        if single:
            out.update(zip(map(id, single), await self.evaluate(single, choose=choose), strict=True))
        for r in roots:
            if r._d.returns != "one":
                (out[id(r)],) = await self.evaluate([r], choose=choose)
        return [out[id(r)] for r in roots]

    async def evaluate_arguments(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any], list[Tensor]]:
        """A call's arguments with their expressions (one level into lists) evaluated here, in one program.

        For the fused and batched calls this session runs (chosen by
        :func:`evaluating_engine`, expressions' tensors included). Returns the new
        arguments and the tensors made, which the caller discards after the call.
        """
        exprs: dict[int, Expr] = {}
        for a in (*args, *kwargs.values()):
            for x in a if type(a) in (list, tuple) else (a,):
                if type(x) is Expr:
                    exprs[id(x)] = x
        if not exprs:
            return args, kwargs, []
        results = await self._evaluate_each(list(exprs.values()), choose=False)
        value = dict(zip(exprs, results, strict=True))
        made = _flat_results(results)

        def swap(a: Any) -> Any:
            if type(a) is Expr:
                return value[id(a)]
            if type(a) in (list, tuple):
                return type(a)(swap(x) for x in a)
            return a

        return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}, made

    def discard(self, t: Tensor) -> None:
        """Free a result nobody else holds (``eval``/``run`` of an expression), whatever the strategy."""
        registry = t._registry
        if not registry.closed:
            registry.free(t._rid)
        t._registry = _NO_REGISTRY  # type: ignore[assignment]  # its __del__ queues nothing

    # -- fetches ------------------------------------------------------------------------
    async def fetch(self, tensors: list[Tensor], api: str) -> list[NDArray]:
        """Copies of the tensors' values, owned by the caller."""
        if self.state is not _OPEN:
            await self.open()
        self.check_loop()
        handles = [self.buffer(t, api) for t in tensors]
        if self._held >= self._hold_s:
            await self._yield_held()  # a small fetch copies on the loop without suspending
        safe_point = self.policy.safe_point
        if safe_point is not None:
            safe_point()
        values = await self.backend.fetch(handles)
        # Counted whether or not the backend suspended (it does not say): at worst the
        # next yield comes one fetch early.
        self._held += HOLD_PER_OP_S
        if safe_point is not None:
            safe_point()
        return values

    def peek(self, t: Tensor) -> NDArray:
        """A read-only view of a local buffer, without suspending."""
        if t._registry.closed:
            raise SessionClosedError(f"tensor {t.name!r} was freed because its session closed")
        arr = self.backend.peek(self.buffer(t, "__array__"))
        if arr is None:
            raise AioTensorError(f"tensor {t.name!r} lives on a remote backend; use `await t.numpy()` to fetch it")
        return arr


class _NoRegistry:
    """Where a discarded handle's drop goes: nowhere (its buffer was freed already)."""

    def notify_dropped(self, rid: int) -> None:
        pass


_NO_REGISTRY = _NoRegistry()


def _is_tensor(x: Any) -> bool:
    return type(x) is Tensor


def _flat(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
    out: list[Any] = []
    for a in (*args, *(kwargs or {}).values()):
        if type(a) in (list, tuple):
            out.extend(a)
        else:
            out.append(a)
    return out


def _same_kind(kind: type, values: list[Any]) -> Any:
    # The values of a list, tuple or named tuple of tensors, in the same kind of sequence.
    make = getattr(kind, "_make", None)
    return make(values) if make is not None else kind(values)


def _flat_results(results: list[Any]) -> list[Tensor]:
    out: list[Tensor] = []
    for r in results:
        if isinstance(r, list | tuple):
            out.extend(r)
        else:
            out.append(r)
    return out


def _shape_result(d: OpDef, tensors: list[Tensor], multi: bool) -> Any:
    if d.returns == "list":
        return tensors if d.result is None else d.result(tensors)
    if d.returns == "any" and multi:
        return tuple(tensors)
    return tensors[0]


def session_engine(session: object) -> Engine:
    """The engine of a session facade (the default session is stored untyped in ``_defaults``)."""
    return cast(Engine, cast("SessionLike", session)._engine)


def owner_of(t: Tensor) -> Engine:
    """The engine that owns ``t`` (a tensor sees it as an :class:`~aiotensor._protocols.EngineLike`)."""
    return cast(Engine, t._engine)


def evaluating_engine(tensors: Iterable[Tensor], explicit: Engine | None = None) -> Engine:
    """THE rule for which session evaluates (docs/semantics.md, "Which session evaluates").

    Every front end asks it: ``await e``, ``e.eval()``, module-level ops, fused and
    batched calls (and, through them, an expression given to an op). ``explicit``, a
    session named by the caller (``s.run(e)``, ``e.eval(session=s)``, ``s.add(e, 1)``,
    ``s.function(fn)``), evaluates. Otherwise the most derived of the tensors' sessions
    (a child may read its parent's tensors), unless the default session
    (``with s.as_default():``, an ``InteractiveSession``) is that session or a child of
    it: then the default, so a request session reading app weights owns the result.
    With no tensor at all (``xp.zeros(3)``), the default session; with none either,
    :class:`NoSessionError`. Tensors of unrelated sessions are not refused here: the
    session chosen refuses the ones it cannot read ("belongs to another session").
    """
    if explicit is not None:
        return explicit
    found: EngineLike | None = None
    for t in tensors:
        owner = t._engine
        if found is None or (owner is not found and found in owner.ancestors):
            found = owner  # the most derived so far
    return _or_default(found)


def _or_default(found: EngineLike | None) -> Engine:
    # evaluating_engine's second half: the default session takes over from ``found``
    # (the most derived of the tensors' engines) when it is that one or a child of it.
    default = _defaults.get_default_session()
    if default is not None:
        engine = session_engine(default)
        if found is None or engine is found or found in engine.ancestors:
            return engine
    if found is None:
        raise NoSessionError(
            "no session to evaluate in: pass a tensor argument or session=, use `with session.as_default():`,"
            " or create an InteractiveSession"
        )
    return cast(Engine, found)


def engine_of(args: tuple[Any, ...], kwargs: dict[str, Any] | None, op: str = "this op") -> Engine:
    """The engine a module-level op (or an unbound fused function) runs in: :func:`evaluating_engine`.

    Over its tensor arguments, one level into lists, and the tensors of its expression
    arguments, so an op given an expression is evaluated where the expression would be.
    ``op`` names the caller in the error for a coroutine argument (a forgotten ``await``).
    """
    # evaluating_engine over the arguments' tensors, without building their list (the
    # hot path of module-level ops): the same most-derived test, the same default.
    found: EngineLike | None = None
    for arg in (*args, *kwargs.values()) if kwargs else args:
        for item in arg if type(arg) in (list, tuple) else (arg,):
            ti = type(item)
            if ti is Tensor:
                owner = item._engine
                if found is None or (owner is not found and found in owner.ancestors):
                    found = owner
            elif ti is Expr:
                for t in expr_tensors(item):
                    owner = t._engine
                    if found is None or (owner is not found and found in owner.ancestors):
                        found = owner
    if found is None and _defaults.get_default_session() is None:
        awaited = forgotten_await(op, args, kwargs)  # no tensor: maybe a forgotten await
        if awaited is not None:
            raise awaited
    return _or_default(found)


def expr_tensors(expr: Expr) -> list[Tensor]:
    """The tensors an expression reads (its signature's list, or a walk of its graph)."""
    if expr._sig is not None:
        return list(expr._lv)
    found: list[Tensor] = []
    stack: list[Any] = [expr]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        for x in _flat(node._args, node._kwargs):
            if type(x) is Expr:
                if id(x) not in seen:
                    seen.add(id(x))
                    stack.append(x)
            elif type(x) is Tensor:
                found.append(x)
    return found
