"""The op path: from an op's arguments to owned tensors, and fetches back.

:class:`Dispatcher` holds what every op and fetch goes through: placement and
arguments, safe points, memory reservation, inline-or-pool execution, cancellation,
error mapping and registration. The session (``_session.py``) adds the lifecycle,
devices and defaults on top.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ._backend import Backend, LocalBackend
from ._blas import BLAS_OPS, Gated
from ._errors import (
    AioTensorError,
    BackendError,
    InvalidArgumentError,
    KernelError,
    ResourceExhaustedError,
    SessionClosedError,
)
from ._inline import INLINE_STREAK, estimate_us
from ._kernels import BadOutputError, KernelResult, run_kernel
from ._ops import AllOps
from ._structure import describe
from ._tensor import Tensor

if TYPE_CHECKING:
    from ._cleanup import CleanupPolicy
    from ._config import SessionConfig
    from ._memory import MemoryGate
    from ._registry import Registry
    from ._session import AsyncEagerSession
    from ._types import NDArray

__all__ = ["Dispatcher", "State"]

logger = logging.getLogger("aiotensor")

# Errors a kernel raises because of its arguments. ArithmeticError covers numpy's
# FloatingPointError under np.errstate(all="raise"); RuntimeWarning is numpy's warning
# turned into an error by the caller's warning filters.
_ARG_ERRORS = (BadOutputError, ValueError, TypeError, IndexError, ArithmeticError, RuntimeWarning)


class State(enum.Enum):
    """A session's lifecycle: unopened -> (opening ->) open -> closing -> closed."""

    UNOPENED = "unopened"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_OPEN = State.OPEN


class Dispatcher(AllOps):
    """Runs ops and fetches for a session (see the module docstring)."""

    # Set by AsyncEagerSession.__init__ / _bind.
    _state: State
    _registry: Registry
    _policy: CleanupPolicy
    _backend: Backend
    _config: SessionConfig
    _ancestors: tuple[AsyncEagerSession, ...]
    _inflight: int
    _idle: asyncio.Event | None
    _inline_us: float
    _inline_streak: int

    @abstractmethod
    async def _open(self) -> None:
        """Open the session if it is not open yet; raise if it is closed."""

    @abstractmethod
    def _check_loop(self) -> None:
        """Raise WrongEventLoopError unless called on the session's loop."""

    @abstractmethod
    def _place(self, op: str) -> str:
        """The device ``op`` runs on."""

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
        if name is not None and not isinstance(name, str):
            raise InvalidArgumentError(f"{op}: name must be a str, got {type(name).__name__}")
        device = self._place(op)
        buffers = tuple([self._arg(a, op) for a in args])
        kw = {k: self._arg(v, op) for k, v in kwargs.items()} if kwargs else {}
        registry, policy = self._registry, self._policy
        safe_point = policy.safe_point
        if safe_point is not None:
            safe_point()
        limit = self._inline_us
        inline = limit > 0 and not user_kernel and estimate_us(op, buffers, kw, nbytes) <= limit
        if inline and policy.inline_point is not None:
            policy.inline_point()
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
        session = cast("AsyncEagerSession", self)  # the only concrete Dispatcher
        return Tensor._make(session, registry, rid, buf.shape, buf.dtype, buf.nbytes, label, device)

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
