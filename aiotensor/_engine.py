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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _defaults, _fpwarn
from ._allocator import out_for
from ._backend import Backend
from ._compile import compile_program, compiled, program_cost
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
from ._kernels import KernelResult, as_numeric, finalize, info, kernel_error, normalize
from ._opdef import OPS, Cost, OpDef, namespace
from ._ops._apply import label as apply_label
from ._program import Program, Step
from ._registry import Registry
from ._tensor import Tensor, make_tensor

if TYPE_CHECKING:
    from ._cleanup import CleanupPolicy
    from ._types import NDArray

__all__ = ["Engine", "State", "engine_of"]

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
        session: Any,  # the AsyncEagerSession facade (a layer above)
        backend: Backend,
        policy: CleanupPolicy,
        registry: Registry,
        *,
        inline_us: float,
        log_placement: bool,
        soft_placement: bool,
        parent: Engine | None,
    ) -> None:
        self.session = session
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
        # bytes touched x ns per byte: it runs inline when the second term fits in this.
        self._inline_ns = self._inline_us * 1000.0 - OVERHEAD_NS
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
            t = self.lean(d, args, name)  # (again after a yield: the lean path refuses during one)
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
        device = self.place(label)
        limit = self._inline_us
        if limit and d.cost is not _UNKNOWN and estimate_us(d, bufs, kw, nbytes) <= limit:  # type: ignore[arg-type]
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

        Session methods and module-level functions of such ops call it before
        :meth:`op`, saving a coroutine frame on the hottest path.
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
            if shape is not None and (total + largest) * _PER_BYTE_OF[d] <= self._inline_ns:
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
        budget: Any = None,
        blas: bool = False,
    ) -> tuple[list[Tensor], bool]:
        """Run ``kernel(*bufs, **kw)`` inline (when ``est_us`` allows) or on the backend; own its outputs.

        ``described`` are the arguments as the caller gave them, for error messages.
        ``budget`` (a :class:`~aiotensor._program.Budget`) gets the bytes its
        intermediates may hold, computed after the safe point and any memory wait.
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
        if (inline or sliced) and policy.inline_point is not None:
            policy.inline_point()  # runs on the loop without suspending: free what was dropped first
        if inline and nbytes is None and registry.memory_limit is None and self._plain_inline:
            # The common inline case: nothing to reserve or fit.
            return self._run_owned(label, kernel, bufs, kw, described, user, name, budget, device)
        if nbytes is not None or registry.memory_limit is not None:
            await self._reserve(label, nbytes)
        if registry.memory_limit is not None and budget is not None:
            if policy.reclaims:
                registry.collect()  # pending buffers first: the budget is what is free now
            budget.limit = max(0, registry.memory_limit - registry.live_bytes - registry.reserved)
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
        budget: Any = None,
    ) -> tuple[list[Tensor], bool] | None:
        """:meth:`call`'s common case without a coroutine frame, or ``None`` (then await :meth:`call`).

        It applies to a lean session (open, on its loop, numpy, no memory limit) on its
        default device, for a kernel whose ``est_us`` is within the inline threshold,
        while the run of inline work has not spent its hold budget (then :meth:`call`
        yields first).
        """
        lean_loop = self._lean_loop
        if (
            est_us > self._inline_us
            or self._held >= self._hold_s  # time to yield: call() does
            or lean_loop is None
            or _get_loop() is not lean_loop
            or (self.placed and self.device_var.get() is not None)
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
        budget: Any,
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

    def _settle(self, budget: Any) -> None:
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
    def _engine_for(self, leaves: list[Tensor]) -> Engine:
        # The engine that may read every leaf: the most derived of their sessions, or the
        # default session when it is a child of theirs (a request session reading weights).
        found = self
        for t in leaves:
            owner = t._engine
            if owner is found or owner in found.ancestors:
                continue
            if found in owner.ancestors:
                found = owner
                continue
            raise InvalidArgumentError(
                f"an expression mixes tensors of unrelated sessions ({found.session!r} and {owner.session!r})"
            )
        default = _defaults.get_default_session()
        if default is not None and found in default._engine.ancestors:  # type: ignore[attr-defined]
            engine: Engine = default._engine  # type: ignore[attr-defined]
            return engine
        return found

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
        engine = self._engine_for(leaves)  # (which may read every leaf: no check per buffer below)
        lean_loop = engine._lean_loop
        if lean_loop is not None and _get_loop() is lean_loop:
            bufs = []
            for t in leaves:
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
                    return done[0][0] if expr._d.returns == "one" else _shape_result(expr._d, done[0], True)
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
                    self._engine_for([x for x in _flat(r._args, r._kwargs) if type(x) is Tensor]) if choose else self
                )
                return [await engine.op(r._d, r._args, r._kwargs, r._nbytes, name)]
            program, leaves, costs = compiled(r, _is_tensor, self._xp_name, Expr)
        else:
            program, leaves = compile_program(roots, _is_tensor, self._xp_name, Expr)
        engine = self._engine_for(leaves) if choose else self
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
        tensors, _ = await self.call(
            label,
            program,
            bufs,
            {},
            tuple(leaves),
            user=False,
            name=name,
            est_us=est,
            budget=program.budget,
            blas=program.blas,
        )
        if len(roots) == 1 and roots[0]._d.returns != "one":
            return [_shape_result(roots[0]._d, tensors, True)]
        return tensors

    async def run_values(self, fetches: list[Any], api: str) -> list[NDArray]:
        """The numpy values of tensors and expressions; results made for them are freed at once."""
        exprs = [f for f in fetches if type(f) is Expr]
        made: dict[int, Tensor] = {}
        if exprs:
            unique = list({id(e): e for e in exprs}.values())
            tensors = await self.evaluate(unique, choose=False)
            made = {id(e): t for e, t in zip(unique, tensors, strict=True)}
        try:
            return await self.fetch([made[id(f)] if type(f) is Expr else f for f in fetches], api)
        finally:
            for t in made.values():
                self.discard(t)

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


def _shape_result(d: OpDef, tensors: list[Tensor], multi: bool) -> Any:
    if d.returns == "list":
        return tensors
    if d.returns == "any" and multi:
        return tuple(tensors)
    return tensors[0]


def engine_of(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Engine:
    """The engine a module-level op runs in: its tensors' session, else the default session.

    A child session may read its parent's tensors: the child is preferred, and so is a
    default session that is a child of the tensors' session (a request session reading
    app weights), so the result does not live as long as the parent.
    """
    found: Engine | None = None
    for arg in (*args, *kwargs.values()) if kwargs else args:
        for item in arg if type(arg) in (list, tuple) else (arg,):
            ti = type(item)
            if ti is Expr:
                item = item._leaf()
            elif ti is not Tensor:
                continue
            owner = item._engine
            if found is None or (owner is not found and found in owner.ancestors):
                found = owner
    default = _defaults.get_default_session()
    if found is None or (default is not None and found in default._engine.ancestors):  # type: ignore[attr-defined]
        if default is None:
            raise NoSessionError(
                "no session for this op: pass a tensor argument, use `with session.as_default():`,"
                " or create an InteractiveSession"
            )
        engine: Engine = default._engine  # type: ignore[attr-defined]
        return engine
    return found
