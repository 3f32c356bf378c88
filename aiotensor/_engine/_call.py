"""Any kernel (an op sent to the pool, a program, a fused function): run inline or on the backend, its outputs owned.

``Engine.call`` is the general path: placement, safe point, memory, inline (at once, or
a program in slices on the loop) or ``backend.submit``, cancellation, error mapping;
``Engine.call_inline`` its common case without a coroutine. The outputs become the
session's (``_own``: fit under the limit, register, handles).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import operator
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .. import _fpwarn
from .._cost import HOLD_PER_OP_S, SLICED_MAX
from .._errors import AioTensorError, BackendError, SessionClosedError
from .._kernels import KernelResult, kernel_error, normalize
from .._loopload import BUSY_INLINE_US, offload, stays_inline
from .._opdef import OpDef
from .._programs._blocked_split import result_buffer
from .._programs._interpreter import Budget
from .._programs._program import Program
from .._tensor import Tensor, make_tensor
from ._lifecycle import _OPEN, on_loop

if TYPE_CHECKING:
    from ._core import Engine

__all__ = ["call", "call_inline"]

logger = logging.getLogger("aiotensor")
_ndarray = np.ndarray
_NO_ERRSTATE = contextlib.nullcontext()
_clock = time.perf_counter
_new = object.__new__
_handle_of = operator.itemgetter(0)  # (a BufferInfo's fields, read in C loops)
_nbytes_of = operator.itemgetter(3)


def _shape_result(d: OpDef, tensors: list[Tensor], multi: bool) -> Any:
    if d.returns == "list":
        return tensors if d.result is None else d.result(tensors)
    if d.returns == "any" and multi:
        return tuple(tensors)
    return tensors[0]


async def call(
    self: Engine,
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
    free_us: float = math.inf,
) -> tuple[list[Tensor], bool]:
    """Run ``kernel(*bufs, **kw)`` inline (when ``est_us`` allows) or on the backend; own its outputs.

    ``described`` are the arguments as the caller gave them, for error messages.
    ``budget`` (a :class:`~aiotensor._programs._interpreter.Budget`) gets the bytes its
    intermediates may hold under ``memory_limit``, reserved for the run
    (:meth:`_hold`): ``need`` bytes when the caller knows them, else what is free.
    A :class:`~aiotensor._programs._program.Program` estimated at most ``SLICED_MAX``
    thresholds runs on the loop in slices (:meth:`_run_sliced`). ``free_us``: the
    kernel's GIL-free µs net of transfers (``_loopload.net_free_us``; unknown: ``inf``),
    which busy-loop placement weighs.
    """
    if self._held >= self._hold_s and est_us <= SLICED_MAX * self._inline_us:
        await self._yield_held()  # this kernel would not suspend either
    lean_loop = self._lean_loop
    if lean_loop is not None and on_loop(lean_loop) and (not self.placed or self.device_var.get() is None):
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
    if (inline or sliced) and est_us > BUSY_INLINE_US and offload(est_us, free_us):
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
            try:
                result = self.backend.run_inline(kernel, bufs, kw)
            except RuntimeWarning:  # numpy's, made an exception by the caller's filters: at the caller's line
                result = _fpwarn.rerun(label, self.backend.run_inline, (kernel, bufs, kw), None)
            took = _clock() - start
            registry.kernel_seconds += took
            self._held += took + HOLD_PER_OP_S
        elif sliced:
            try:
                result = await self._run_sliced(label, cast(Program, kernel), bufs)
            except RuntimeWarning:  # (as above: the whole program again, collecting)
                result = normalize(_fpwarn.rerun(label, kernel, bufs, None))
        else:
            self._held = 0.0
            if not kw and getattr(kernel, "spawning", None) is not None and self.backend.in_process:
                if registry._dropped and policy.inline_point is not None:
                    policy.inline_point()  # (a result dropped since: its buffer, still in cache, is reused)
                kw = result_buffer(registry.cache, bufs)  # a blocked run's result into a freed buffer
            # numpy's warnings on the worker, reported at the caller's line (_fpwarn)
            backend = self.backend
            try:
                if backend.runs_in_context:
                    pending, errors = _fpwarn.submit_in_context(backend.submit, kernel, bufs, kw, device, blas)
                else:
                    fp = _fpwarn.collecting()
                    with fp[0] if fp is not None else _NO_ERRSTATE:  # (the worker gets a copy of this context)
                        # blas= only when set: a backend written before it existed still runs the rest.
                        pending = (
                            backend.submit(kernel, bufs, kw, device=device, blas=True)
                            if blas
                            else backend.submit(kernel, bufs, kw, device=device)
                        )
                    errors = fp[1].errors if fp is not None else None  # (filled as the kernel runs)
            except RuntimeError as exc:
                raise BackendError(f"{label}: the backend cannot run kernels: {exc}") from exc
            result = await self._await_kernel(pending)
            if errors:
                try:
                    _fpwarn.reissue(label, errors)
                except BaseException:  # a warnings filter made it an error: the result is nobody's
                    # (freed now: a remote one would otherwise wait for the garbage collector
                    # to free the traceback's frames that hold its handles)
                    for buf in result.buffers:
                        self.backend.release(buf.handle)
                    raise
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
    if registry.memory_limit is None:  # nothing to fit: _own without its coroutine
        return self._take(result, label, name, device), result.multi
    return await self._own(result, label, name, nbytes, device), result.multi


async def _run_sliced(self: Engine, label: str, program: Program, bufs: tuple[Any, ...]) -> KernelResult:
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
    self: Engine,
    label: str,
    kernel: Callable[..., Any],
    bufs: tuple[Any, ...],
    kw: dict[str, Any],
    described: tuple[Any, ...],
    *,
    user: bool,
    est_us: float,
    budget: Budget | None = None,
    free_us: float = math.inf,
) -> tuple[list[Tensor], bool] | None:
    """:meth:`call`'s common case without a coroutine frame, or ``None`` (then await :meth:`call`).

    It applies to a lean session (open, on its loop, numpy, no memory limit) on its
    default device, for a kernel whose ``est_us`` is within the inline threshold
    (and, above ``BUSY_INLINE_US``, while the loop is not busy or ``free_us``, its GIL-free
    µs, would not pay for the hop: else :meth:`call` sends it to the pool), while the run
    of inline work has not spent its hold budget (then :meth:`call` yields first).
    """
    lean_loop = self._lean_loop
    if (
        est_us > self._inline_us
        or self._held >= self._hold_s  # time to yield: call() does
        or lean_loop is None
        or not on_loop(lean_loop)
        or (self.placed and self.device_var.get() is not None)
        or (est_us > BUSY_INLINE_US and not stays_inline(free_us, lean_loop))  # (last: it counts the kernel as kept)
    ):
        return None
    policy = self.policy
    if policy.safe_point is not None:
        policy.safe_point()
    if policy.inline_point is not None:
        policy.inline_point()
    return self._run_owned(label, kernel, bufs, kw, described, user, None, budget, self._device)


def _run_owned(
    self: Engine,
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


def _settle(self: Engine, budget: Budget) -> None:
    registry = self.registry
    if budget.count > budget.escaped and not registry.closed:
        # Intermediates never reached the registry: record them as allocated and
        # freed, and their peak in peak_bytes.
        registry.count_unregistered(budget.count - budget.escaped)
        registry.peak_bytes = max(registry.peak_bytes, registry.live_bytes + budget.peak)


async def _own(
    self: Engine, result: KernelResult, label: str, name: str | None, reserved: int | None, device: str
) -> list[Tensor]:
    # A kernel's buffers become the session's: checked against the limit, registered,
    # given handles; then the safe point after the op.
    if self.registry.memory_limit is not None:
        await self._fit_result(label, result, reserved)
    return self._take(result, label, name, device)


def _take(self: Engine, result: KernelResult, label: str, name: str | None, device: str) -> list[Tensor]:
    # _own once the result fits: registered, given handles; then the safe point after the op.
    registry = self.registry
    buffers = result.buffers
    multi = result.multi
    # Registered at once when there are several (a batch's results), each given a handle
    # as make_tensor does, written out: three calls fewer per buffer.
    if len(buffers) == 1:
        b = buffers[0]
        rid = registry.add(b[0], b[3])
    else:
        rid = registry.add_all(list(zip(map(_handle_of, buffers), map(_nbytes_of, buffers), strict=True)))
    tag: str | tuple[str, int] = (label, -1) if name is None else name
    tensors = []
    for i, b in enumerate(buffers):
        t = _new(Tensor)
        t._engine = self
        t._registry = registry
        t._rid = rid + i
        t._shape = b[1]
        t._dtype = b[2]
        t._nbytes = b[3]
        t._label = (name, i) if multi and name is not None else tag
        t._device = device
        tensors.append(t)
    safe_point = self.policy.safe_point
    if safe_point is not None:
        safe_point()
    if self._log:
        logger.info("%s: %s on %s", label, tensors[0].name, device)
    return tensors


async def _await_kernel(self: Engine, pending: Any) -> KernelResult:
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
    self: Engine,
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


def _adopt(self: Engine, result: KernelResult) -> None:
    # A kernel finished after its caller was cancelled: own the result as if its
    # handle had been dropped at once, so the strategy frees it (or close does).
    registry = self.registry
    for buf in result.buffers:
        if registry.closed:
            self.backend.release(buf.handle)
        else:
            registry.notify_dropped(registry.add(buf.handle, buf.nbytes))
