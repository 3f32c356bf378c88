"""The engine of a session: one op application, and the methods of its other concerns bound in one class.

:class:`Engine` holds a session's state and applies ops: :meth:`Engine.op` is the path
of one op (session methods, module-level ops, one-node expressions), from prepared
arguments through placement, arguments to buffers, inline or a kernel call, to owned,
registered tensors. The rest of what an engine does lives in the modules of this
package as plain functions on the engine, bound here as its methods (no extra call):
``_lean`` (the lean path of element-wise ops), ``_call`` (any kernel, inline or on the
backend, and owning its outputs), ``_admission`` (memory: reservations and the hold of
a multi-op kernel), ``_expressions`` (expressions compiled and run as programs),
``_fetch``, ``_lifecycle`` (open, close, finalize, the loop checks), and
``_session_rule`` (which session evaluates). The session (``_session.py``) is a facade
over it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _fpwarn
from .._backends._allocator import out_for
from .._backends._base import Backend, LocalBackend
from .._cost import HOLD_PER_OP_S, HOLD_THRESHOLDS, OVERHEAD_NS, estimate_us, gil_free_us
from .._errors import InvalidArgumentError, InvalidDeviceError, SessionClosedError
from .._expr import Expr
from .._kernels import KernelResult, as_numeric, finalize, info, kernel_error, normalize
from .._loopload import BUSY_INLINE_US, offload
from .._opdef import Cost, OpDef, namespace
from .._ops._apply import label as apply_label
from .._programs._program import Step
from .._registry import Registry
from .._tensor import Tensor
from . import _admission, _call, _expressions, _fetch, _lean, _lifecycle
from ._call import _shape_result
from ._lean import _ELEMENTWISE, LEAN
from ._lifecycle import _OPEN, _UNOPENED, on_loop

if TYPE_CHECKING:
    from .._cleanup import CleanupPolicy
    from .._protocols import SessionLike
    from .._types import NDArray

__all__ = ["Engine"]

logger = logging.getLogger("aiotensor")
_ndarray = np.ndarray
_ufunc = np.ufunc
_UNKNOWN = Cost.UNKNOWN
_clock = time.perf_counter
_new = object.__new__
_fpwarn.install()


class _HasExpr(Exception):
    """An argument is an expression: the op becomes an expression node."""


#: The device variable of an engine no ``with s.device(...)`` has used: never set.
_UNPLACED: contextvars.ContextVar[str | None] = contextvars.ContextVar("aiotensor_device_unplaced", default=None)
_base_run_inline = Backend.run_inline
_local_fetch = LocalBackend.fetch


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
        # A backend that keeps LocalBackend's fetch: the engine copies small values itself.
        self._local_fetch = type(backend).fetch is _local_fetch
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

    @property
    def inline_us(self) -> float:
        """How long (estimated µs) a kernel may run inline on the loop; 0: never."""
        return self._inline_us

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
            if kwargs is None and d in LEAN:
                # Every caller of an op of the lean path tried it before calling
                # here (it refuses while a yield is due): once more after the yield.
                t = self.lean(d, args, name)
                if t is not None:
                    return t
        if self.state is not _OPEN:
            await self.open()
        if not on_loop(self._loop):
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
        est = estimate_us(d, bufs, kw, nbytes) if limit and d.cost is not _UNKNOWN else math.inf
        if est <= limit and (est <= BUSY_INLINE_US or not offload(est, gil_free_us(d, bufs, kw, est))):
            # (_loopload: a busy loop offloads what runs long enough without the GIL)
            if nbytes is None and d.returns == "one" and self.registry.memory_limit is None:
                # Nothing to reserve or wait for: run and own it without another coroutine frame.
                policy = self.policy
                if self.registry._dropped:  # (the hooks free what is queued there: nothing queued, no call)
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

    def _recycled_out(self, d: OpDef, bufs: list[Any]) -> dict[str, Any]:
        # A large element-wise ufunc on the pool writes into a buffer the session freed
        # (``out=``): no page faults, and the resident set stays flat (see ``_allocator``).
        cache = self.registry.cache
        kernel = d._np_kernel
        if cache is None or type(kernel) is not _ufunc or self._xp is not np:
            return {}
        dropped = self.registry._dropped
        if not dropped and not cache.cached_bytes:
            return {}
        largest = 0
        for b in bufs:  # (a loop: a quarter of max() over a generator, on small pool ops too)
            if type(b) is _ndarray and b.nbytes > largest:
                largest = b.nbytes
        if largest < cache.min_bytes:
            return {}  # (small ops: what was dropped is freed as before, by the strategy)
        if dropped:  # a result dropped since: its buffer, still in cache, is the one to reuse
            self._free_dropped()
            if not cache.cached_bytes:
                return {}
        recycled = out_for(cache, kernel, bufs)
        return {} if recycled is None else {"out": recycled}

    def _free_dropped(self) -> None:
        # What the registry queued as dropped, freed now by the strategy's own hooks (a
        # strategy that frees at close only has none) before a recycled buffer is taken:
        # else a result dropped just before the next call reaches the cache only during
        # that call, and calls alternate between two buffers, one of them out of cache.
        policy = self.policy
        if policy.safe_point is not None:
            policy.safe_point()
        if policy.inline_point is not None:
            policy.inline_point()

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
        if safe_point is not None and registry._dropped:  # (nothing queued: nothing to free)
            safe_point()
        if self._log:
            logger.info("%s: %s on %s", label, t.name, device)
        return t

    # -- the other concerns: plain functions on the engine in their modules, bound here --
    # the lean path of element-wise ops (_lean.py)
    lean = _lean.lean
    adopt = _lean.adopt
    # any kernel: inline or on the backend, its outputs owned (_call.py)
    call = _call.call
    _run_sliced = _call._run_sliced
    call_inline = _call.call_inline
    _run_owned = _call._run_owned
    _settle = _call._settle
    _own = _call._own
    _take = _call._take
    _await_kernel = _call._await_kernel
    _wrap = _call._wrap
    _adopt = _call._adopt
    # memory: reservations, holds, fits (_admission.py)
    _hold = _admission.hold
    _reserve = _admission.reserve
    _fit_result = _admission.fit_result
    # expressions (_expressions.py)
    evaluate_expr = _expressions.evaluate_expr
    _evaluate_one = _expressions._evaluate_one
    _run_expr = _expressions._run_expr
    evaluate = _expressions.evaluate
    _run_program = _expressions._run_program
    run_values = _expressions.run_values
    _evaluate_each = _expressions._evaluate_each
    evaluate_arguments = _expressions.evaluate_arguments
    # values back to the caller (_fetch.py)
    discard = _fetch.discard
    fetch = _fetch.fetch
    fetch_now = _fetch.fetch_now
    peek = _fetch.peek
    # lifecycle and the loop (_lifecycle.py)
    _let_go = _lifecycle._let_go
    open = _lifecycle.open
    open_now = _lifecycle.open_now
    _open_on = _lifecycle._open_on
    _bind = _lifecycle._bind
    _start = _lifecycle._start
    _set_open = _lifecycle._set_open
    _wrong_loop = _lifecycle._wrong_loop
    check_loop = _lifecycle.check_loop
    close = _lifecycle.close
    close_now = _lifecycle.close_now
    finalize_unclosed = _lifecycle.finalize_unclosed
    _yield_held = _lifecycle._yield_held
