"""AsyncEagerSession: lifecycle, op dispatch, fetches, the default session and devices."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import enum
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Self

from . import _defaults
from ._backend import Backend, LocalBackend
from ._blas import BLAS_OPS, Gated
from ._cleanup import make_policy
from ._config import ResourceCleanupStrategy, SessionConfig
from ._devices import canonical_device
from ._errors import (
    AioTensorError,
    BackendError,
    InvalidArgumentError,
    InvalidDeviceError,
    KernelError,
    ResourceExhaustedError,
    SessionClosedError,
    WrongEventLoopError,
)
from ._function import FusedFunction
from ._inline import INLINE_STREAK, estimate_us
from ._kernels import BadOutputError, KernelResult, run_kernel
from ._memory import MemoryGate
from ._ops import AllOps
from ._registry import Registry, SessionStats
from ._structure import describe, flatten, unflatten
from ._tensor import Tensor
from ._types import Fetches, NDArray

__all__ = ["AsyncEagerSession"]

logger = logging.getLogger("aiotensor")

# Errors a kernel raises because of its arguments. ArithmeticError covers numpy's
# FloatingPointError under np.errstate(all="raise"); RuntimeWarning is numpy's warning
# turned into an error by the caller's warning filters.
_ARG_ERRORS = (BadOutputError, ValueError, TypeError, IndexError, ArithmeticError, RuntimeWarning)


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_OPEN = _State.OPEN
_shared_local = LocalBackend()


class AsyncEagerSession(AllOps):
    """A session that owns every tensor buffer it creates; every op is a coroutine.

    Use it as ``async with AsyncEagerSession() as s:``; leaving the block frees every
    buffer, even on error or cancellation. The constructor needs no running loop: the
    session binds to the loop of its first use and starts its machinery then.

    Args:
        cleanup: When buffers of dropped handles are freed (see
            :class:`ResourceCleanupStrategy`).
        config: Placement, logging, pool and memory options.
        executor: A ``concurrent.futures.Executor`` to run kernels on, instead of the
            process-wide pool. Not shut down by the session.
        backend: Where kernels run and buffers live (e.g. ``DaskBackend``). Not closed
            by the session.
        parent: A session whose tensors this one may read without copying (e.g. an
            app-lifetime session holding model weights, read by request sessions). The
            parent must stay open while this session uses its tensors.
    """

    def __init__(
        self,
        *,
        cleanup: ResourceCleanupStrategy = ResourceCleanupStrategy.IN_BACKGROUND,
        config: SessionConfig | None = None,
        executor: concurrent.futures.Executor | None = None,
        backend: Backend | None = None,
        parent: AsyncEagerSession | None = None,
    ) -> None:
        if not isinstance(cleanup, ResourceCleanupStrategy):
            raise InvalidArgumentError(
                f"cleanup must be a ResourceCleanupStrategy"
                f" ({', '.join(s.name for s in ResourceCleanupStrategy)}), got {cleanup!r}"
            )
        config = SessionConfig() if config is None else config
        if not isinstance(config, SessionConfig):
            raise InvalidArgumentError(f"config must be a SessionConfig, got {type(config).__name__}")
        if executor is not None and backend is not None:
            raise InvalidArgumentError("pass executor= or backend=, not both")
        self._owns_backend = False
        if parent is not None:
            if not isinstance(parent, AsyncEagerSession):
                raise InvalidArgumentError(f"parent must be an AsyncEagerSession, got {type(parent).__name__}")
            if (backend is not None and backend is not parent.backend) or executor is not None:
                raise InvalidArgumentError("a child session runs on its parent's backend; drop executor=/backend=")
            backend = parent.backend
        elif backend is None:
            if executor is not None:
                backend = LocalBackend(executor)
            elif config.max_workers is not None:
                pool = concurrent.futures.ThreadPoolExecutor(config.max_workers, thread_name_prefix="aiotensor")
                backend = LocalBackend(pool, owns_executor=True)
                self._owns_backend = True
            else:
                backend = _shared_local
        self._cleanup = cleanup
        self._config = config
        self._backend: Backend = backend
        local = isinstance(backend, LocalBackend) and backend.inline_small_ops
        self._inline_us = config.inline_threshold_us if local else 0.0
        self._inline_streak = 0
        self._ancestors: tuple[AsyncEagerSession, ...] = () if parent is None else (parent, *parent._ancestors)
        self._policy = make_policy(cleanup)
        self._registry = Registry(backend.release, config.memory_limit, config.memory_wait)
        self._state = _State.UNOPENED
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._opening: asyncio.Task[None] | None = None
        self._inflight = 0
        self._idle: asyncio.Event | None = None
        self._closed_event: asyncio.Event | None = None
        self._device_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("aiotensor_device", default=None)

    # -- lifecycle ------------------------------------------------------------------
    @property
    def cleanup(self) -> ResourceCleanupStrategy:
        """The cleanup strategy."""
        return self._cleanup

    @property
    def config(self) -> SessionConfig:
        """The configuration."""
        return self._config

    @property
    def backend(self) -> Backend:
        """Where this session's kernels run and buffers live."""
        return self._backend

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun: no new op is accepted."""
        return self._state in (_State.CLOSING, _State.CLOSED)

    async def __aenter__(self) -> Self:
        try:
            await self._open()
        except asyncio.CancelledError:
            # __aexit__ will not run, yet the shielded start goes on: close in a task of its
            # own, outside the caller's (possibly level-triggered, as in anyio) cancellation.
            self._abort_close = asyncio.get_running_loop().create_task(self.close())
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _open(self) -> None:
        state = self._state
        if state is _OPEN:
            return
        if state is _State.UNOPENED:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # e.g. trio, directly or through anyio
                raise WrongEventLoopError(
                    f"{self!r} needs a running asyncio event loop (asyncio or uvloop, also through"
                    " anyio's asyncio backend); none runs in this thread. trio is not supported: kernel"
                    " results come back as asyncio futures and IN_BACKGROUND frees from an asyncio task."
                ) from None
            if type(self._backend).start is Backend.start:
                # Nothing to await (the local backend): open now, without a task or a
                # trip through the loop, which is most of a request session's cost.
                self._bind(loop)
                self._policy.start(self._registry, loop)
                self._state = _OPEN
                return
            self._state = _State.OPENING
            self._opening = loop.create_task(self._start())
        elif state is not _State.OPENING:
            raise SessionClosedError(f"{self!r} is closed")
        assert self._opening is not None
        await asyncio.shield(self._opening)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed_event = asyncio.Event()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._bind(loop)
        assert self._closed_event is not None
        try:
            await self._backend.start()
        except BaseException:
            self._state = _State.CLOSED
            self._closed_event.set()
            raise
        self._policy.start(self._registry, loop)
        if self._state is _State.OPENING:
            self._state = _OPEN

    def _check_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise WrongEventLoopError(
                f"{self!r} is bound to the event loop it first ran on (thread {self._loop_thread});"
                " it was used from another loop or thread. Create one session per event loop."
            )

    async def close(self) -> None:
        """Refuse new ops, let in-flight ops settle, stop cleanup and free every buffer.

        Idempotent. Ops still waiting for their kernel when close begins get
        :class:`SessionClosedError` once the kernel finishes (a running kernel cannot
        be interrupted; close waits for those with a caller still awaiting them). If
        ``close`` itself is cancelled, everything is still freed before it re-raises.
        """
        state = self._state
        if state is _State.CLOSED:
            return
        if state is _State.CLOSING:
            assert self._closed_event is not None
            await self._closed_event.wait()
            return
        if state is _State.UNOPENED:
            self._state = _State.CLOSED
            _defaults.replace_interactive(self, None)
            await self._close_backend()
            return
        if state is _State.OPENING:
            assert self._opening is not None
            with contextlib.suppress(Exception):
                await asyncio.shield(self._opening)
            if self._state is _State.CLOSED:
                return
        self._check_loop()
        self._state = _State.CLOSING
        try:
            if self._inflight:
                assert self._idle is not None
                await self._idle.wait()
        finally:
            stopping = self._shutdown_now()
            try:
                if stopping is not None:
                    await asyncio.wait([stopping])
            finally:  # also when that wait is cancelled (anyio cancels every await in a scope)
                await self._close_backend()

    def _shutdown_now(self) -> asyncio.Task[None] | None:
        stopping = self._policy.stop()
        self._registry.close()
        self._state = _State.CLOSED
        _defaults.replace_interactive(self, None)
        if self._closed_event is not None:
            self._closed_event.set()
        return stopping

    async def _close_backend(self) -> None:
        if self._owns_backend:
            await self._backend.aclose()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        if getattr(self, "_state", None) not in (_OPEN, _State.CLOSING):
            return
        _warn(f"unclosed {self!r}: its buffers are freed now", ResourceWarning, source=self, stacklevel=1)
        policy, registry, loop = self._policy, self._registry, self._loop

        def finalize() -> None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                policy.stop()
            registry.close()

        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finalize)
                return
        finalize()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} cleanup={self._cleanup.name} state={self._state.value}"
            f" live={self._registry.live_tensors}>"
        )

    # -- introspection ----------------------------------------------------------------
    def stats(self) -> SessionStats:
        """An immutable snapshot of the buffers this session holds (see :class:`SessionStats`)."""
        return self._registry.stats(self._inflight, self._policy.failures)

    def list_devices(self) -> list[str]:
        """The devices ops may be placed on, e.g. ``["/cpu:0"]``; the first is the default."""
        return list(self._backend.devices())

    def device(self, name: str) -> contextlib.AbstractContextManager[str]:
        """Place the ops of this session run inside ``with s.device(name):`` on device ``name``.

        A malformed name raises :class:`InvalidDeviceError` here; whether the device
        exists is checked when an op runs: an unknown one raises
        :class:`InvalidDeviceError`, unless ``allow_soft_placement`` is set.
        """
        return self._device_scope(canonical_device(name))

    @contextlib.contextmanager
    def _device_scope(self, name: str) -> Iterator[str]:
        token = self._device_var.set(name)
        try:
            yield name
        finally:
            self._device_var.reset(token)

    @contextlib.contextmanager
    def as_default(self) -> Iterator[Self]:
        """Make this the default session of the current context (module-level ops use it)."""
        token = _defaults.current.set(self)
        try:
            yield self
        finally:
            _defaults.current.reset(token)

    def _place(self, op: str) -> str:
        requested = self._device_var.get()
        devices = self._backend.devices()
        if requested is None:
            return devices[0]
        if requested in devices:
            return requested
        if self._config.allow_soft_placement:
            return devices[0]
        raise InvalidDeviceError(
            f"{op}: no device {requested!r}; this session has {devices}."
            f" Set SessionConfig(allow_soft_placement=True) to fall back to {devices[0]!r}"
        )

    # -- dispatch ---------------------------------------------------------------------
    def _buffer(self, t: Tensor, op: str) -> Any:
        owner = t._session
        if owner is not self and owner not in self._ancestors:
            raise InvalidArgumentError(
                f"{op}: tensor {t.name!r} belongs to another session ({owner!r}); "
                "use it in its own session, or read it from a child session (parent=)"
            )
        try:
            return t._registry.get(t._rid)
        except KeyError:
            raise SessionClosedError(f"{op}: tensor {t.name!r} was freed because its session closed") from None

    def _arg(self, x: Any, op: str) -> Any:
        if isinstance(x, Tensor):
            return self._buffer(x, op)
        # Tensors are looked for one level deep (concat's list, an index tuple), not in
        # nested data: walking a 512 x 64 list of floats on the loop for nothing is slow.
        if type(x) in (list, tuple) and any(isinstance(e, Tensor) for e in x):
            return type(x)(self._buffer(e, op) if isinstance(e, Tensor) else e for e in x)
        return x

    async def _dispatch(
        self,
        op: str,
        kernel: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        *,
        name: str | None,
        nbytes: int | None,
        user_kernel: bool,
    ) -> tuple[list[Tensor], bool]:
        if self._inline_streak >= INLINE_STREAK:
            # Inline ops never suspend: after a run of them, let other tasks (and the
            # cleanup task) have the loop once. Before anything is reserved or run.
            self._inline_streak = 0
            await asyncio.sleep(0)
        if self._state is not _OPEN:
            await self._open()
        self._check_loop()
        device = self._place(op)
        buffers = tuple([self._arg(a, op) for a in args])
        kw = {k: self._arg(v, op) for k, v in kwargs.items()} if kwargs else {}
        registry, policy = self._registry, self._policy
        safe_point = policy.safe_point
        if safe_point is not None:
            safe_point()
        limit = self._inline_us
        inline = limit > 0 and not user_kernel and estimate_us(op, buffers, kw, nbytes) <= limit
        if inline and safe_point is None and policy.reclaims and registry.pending:
            # IN_BACKGROUND: a run of inline ops gives the cleanup task no turn, so the
            # op frees what was dropped itself (earlier than the task would, never later).
            registry.collect()
        if registry.gate is not None:
            await self._wait_for_memory(registry.gate, op, nbytes)
        elif nbytes is not None:
            registry.reserve(nbytes, op, reclaim=policy.reclaims)
        try:
            if inline:
                self._inline_streak += 1
                result = run_kernel(kernel, buffers, kw)
            else:
                self._inline_streak = 0
                if op in BLAS_OPS and isinstance(self._backend, LocalBackend):
                    kernel = Gated(kernel)  # BLAS threads x pool workers <= cores (see _blas)
                try:
                    pending = self._backend.submit(kernel, buffers, kw, device=device)
                except RuntimeError as exc:
                    raise BackendError(f"{op}: the backend cannot run kernels: {exc}") from exc
                result = await self._await_kernel(pending)
        except (asyncio.CancelledError, AioTensorError):
            raise
        except Exception as exc:
            raise self._kernel_error(op, args, exc, user_kernel) from exc
        finally:
            if nbytes is not None:
                registry.unreserve(nbytes)
        if self._state is not _OPEN:
            for buf in result.buffers:
                self._backend.release(buf.handle)
            raise SessionClosedError(f"{op}: the session was closed while the op ran")
        if registry.memory_limit is not None:
            await self._fit_result(op, result, nbytes)
        tensors = [self._wrap(buf, op, name, i, device, result.multi) for i, buf in enumerate(result.buffers)]
        if safe_point is not None:
            safe_point()
        if self._config.log_device_placement:
            logger.info("%s: %s on %s", op, tensors[0].name, device)
        return tensors, result.multi

    async def _await_kernel(self, pending: Any) -> KernelResult:
        if not self._inflight:
            assert self._idle is not None
            self._idle.clear()
        self._inflight += 1
        try:
            result: KernelResult = await pending
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
            self._inflight -= 1
            if not self._inflight:
                assert self._idle is not None
                self._idle.set()

    def _wrap(self, buf: Any, op: str, name: str | None, i: int, device: str, multi: bool) -> Tensor:
        registry = self._registry
        rid = registry.add(buf.handle, buf.nbytes)
        label = f"{op}:{rid}" if name is None else (f"{name}:{i}" if multi else name)
        return Tensor._make(self, registry, rid, buf.shape, buf.dtype, buf.nbytes, label, device)

    def _adopt(self, result: KernelResult) -> None:
        # A kernel finished after its caller was cancelled: own the result as if its
        # handle had been dropped at once, so the strategy frees it (or close does).
        registry = self._registry
        for buf in result.buffers:
            if registry.closed:
                self._backend.release(buf.handle)
            else:
                registry.notify_dropped(registry.add(buf.handle, buf.nbytes))

    async def _wait_for_memory(self, gate: MemoryGate, op: str, nbytes: int | None) -> None:
        # memory_wait: queue for room under memory_limit (see _memory.py).
        await gate.acquire(nbytes, op, reclaim=self._policy.reclaims)
        if self._state is not _OPEN:
            if nbytes is not None:
                self._registry.unreserve(nbytes)
            raise SessionClosedError(f"{op}: the session was closed while the op waited for memory")

    async def _fit_result(self, op: str, result: KernelResult, reserved: int | None) -> None:
        # Checked before the buffers get handles: a result rejected after wrapping left
        # a handle whose later drop queued an already-freed id (stats().pending was off).
        registry = self._registry
        nbytes = sum(buf.nbytes for buf in result.buffers)
        gate = registry.gate
        if gate is not None and reserved is not None and nbytes <= reserved:
            return  # its room was reserved before the kernel ran
        try:
            if gate is None:
                registry.check_result(nbytes, op, reclaim=self._policy.reclaims)
            else:
                await gate.fit_result(nbytes, op, reclaim=self._policy.reclaims)
                if self._state is not _OPEN:
                    raise SessionClosedError(f"{op}: the session was closed while the op waited for memory")
        except BaseException:
            for buf in result.buffers:
                self._backend.release(buf.handle)
            raise

    def _kernel_error(self, op: str, args: tuple[Any, ...], exc: Exception, user_kernel: bool) -> AioTensorError:
        where = f"{op}({describe(args)})"
        if isinstance(exc, MemoryError):
            return ResourceExhaustedError(f"{where}: out of memory ({exc}); {self._registry.live_bytes} bytes live")
        if isinstance(exc, BadOutputError) or (not user_kernel and isinstance(exc, _ARG_ERRORS)):
            return InvalidArgumentError(f"{where}: {exc}")
        return KernelError(f"{where} failed: {type(exc).__name__}: {exc}")

    # -- fetches ----------------------------------------------------------------------
    async def _fetch(self, tensors: list[Tensor], api: str) -> list[NDArray]:
        if self._state is not _OPEN:
            await self._open()
        self._check_loop()
        handles = [self._buffer(t, api) for t in tensors]
        safe_point = self._policy.safe_point
        if safe_point is not None:
            safe_point()
        values = await self._backend.fetch(handles)
        if safe_point is not None:
            safe_point()
        return values

    def _peek(self, t: Tensor) -> NDArray:
        if t._registry.closed:
            raise SessionClosedError(f"tensor {t.name!r} was freed because its session closed")
        arr = self._backend.peek(self._buffer(t, "__array__"))
        if arr is None:
            raise AioTensorError(f"tensor {t.name!r} lives on a remote backend; use `await t.numpy()` to fetch it")
        return arr

    async def run(self, fetches: Fetches) -> Any:
        """TF1's ``sess.run``: the numpy value of a tensor, or of a nested list/tuple/dict of tensors.

        The structure is kept; each value is a copy owned by the caller.
        """
        leaves: list[Tensor] = []
        flatten(fetches, leaves)
        values = await self._fetch(leaves, "run")
        return unflatten(fetches, iter(values))

    def function(self, fn: Callable[..., Any], /) -> FusedFunction:
        """``fn(ops, *args)`` as one op of this session: its ops run synchronously on one worker.

        See :func:`aiotensor.function` (the same, with the session found from the arguments).
        """
        return FusedFunction(fn, self)
