"""The seam where kernels run and buffers live: :class:`Backend`, and the local thread pool.

A backend turns ``(fn, args, kwargs)`` into buffers, releases buffers, and copies them
back to the caller. The session never touches a buffer otherwise, so the same session
code drives a local thread pool (:class:`LocalBackend`, the default), an inline
executor for deterministic tests, and a Dask cluster (``aiotensor.distributed``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import numpy as np

from .._devices import CPU0
from .._kernels import KernelResult, run_kernel
from .._types import NDArray
from ._blas import Gated
from ._pool import Failed, WorkerPool, default_pool
from ._priority import Priority, blas_threads_stale, refresh_blas_threads
from ._split import Split, large_enough

__all__ = ["DEFAULT_PRIORITY", "Backend", "InlineExecutor", "LocalBackend", "PendingKernel", "default_executor"]

#: Fetches of more bytes than this copy on the pool rather than on the event loop.
_COPY_ON_POOL_BYTES = 1 << 20


class PendingKernel(Protocol):
    """A submitted kernel: await it for its :class:`KernelResult`."""

    def __await__(self) -> Generator[Any, None, KernelResult]:
        """Wait for the kernel's buffers."""
        ...

    def abandon(self, adopt: Callable[[KernelResult], object]) -> None:
        """The caller was cancelled: stop the kernel if possible, else hand its result to ``adopt``.

        ``adopt`` runs on the event loop thread. It is how a result nobody awaits is
        still owned (and freed) by the session.
        """
        ...


class Backend(ABC):
    """Where kernels run and buffers live (one small interface; see the module docstring).

    The backend owns how kernels run: which array namespace they compute with
    (:attr:`namespace`), whether a cheap kernel may run inline on the event loop
    (:meth:`inline_limit_us`), and how BLAS kernels share the cores (``blas=`` of
    :meth:`submit`). The engine never asks which backend it has.
    """

    #: Whether buffers live in this process as arrays (fused functions need that).
    in_process: bool = False
    #: Whether :meth:`submit` runs the kernel in a copy of the caller's context (numpy's
    #: error state and the engine's context variables) and nothing else looks at that
    #: state: the engine then collects floating-point errors through a context variable
    #: (``_fpwarn.submit_in_context``) instead of an error state made for each kernel.
    runs_in_context: bool = False
    #: The array namespace kernels compute with (a module name: ``"numpy"``; a GPU
    #: backend would say ``"cupy"``).
    namespace: str = "numpy"
    #: Whether :meth:`release` does anything; False when dropping the registry's
    #: reference is the release (the registry then skips the call on its hot path).
    releases: bool = True

    @property
    def needs_start(self) -> bool:
        """Whether :meth:`start` does anything (a session opens without a task when it does not)."""
        return type(self).start is not Backend.start

    def inline_limit_us(self, requested: float) -> float:
        """How long (µs, estimated) a kernel may run inline on the loop; 0 sends every kernel to :meth:`submit`.

        ``requested`` is the session's ``inline_threshold_us``. Only a backend whose
        buffers live in this process can run kernels inline.
        """
        return 0.0

    def run_inline(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelResult:
        """Run a kernel now on the calling (loop) thread; only called when :meth:`inline_limit_us` allows it."""
        return run_kernel(fn, args, kwargs)

    @abstractmethod
    def devices(self) -> list[str]:
        """Device names ops may be placed on; the first is the default."""

    @property
    def default_device(self) -> str:
        """Where ops go without a ``with s.device(...)`` block: the first of :meth:`devices`."""
        return self.devices()[0]

    async def start(self) -> None:  # noqa: B027 -- a hook, empty by default
        """Called once on the session's event loop before its first op."""

    @abstractmethod
    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, device: str, blas: bool = False
    ) -> PendingKernel:
        """Run ``fn(*args, **kwargs)`` (backend buffers among ``args``) on ``device``.

        ``blas``: the kernel calls BLAS (a backend may gate such kernels so that BLAS
        threads and workers do not oversubscribe the cores). Every exception the
        kernel raises reaches the awaiter (a ``StopIteration``, which no await can carry,
        as PEP 479's ``RuntimeError`` with it as the cause).
        """

    @abstractmethod
    async def fetch(self, handles: Sequence[Any]) -> list[NDArray]:
        """Copies of the buffers, owned by the caller (they outlive the session)."""

    @abstractmethod
    def peek(self, handle: Any) -> NDArray | None:
        """A read-only view of a buffer without suspending, or ``None`` if it lives remotely."""

    @abstractmethod
    def release(self, handle: Any) -> None:
        """Let go of a buffer (called once per buffer, on the loop thread)."""

    async def aclose(self) -> None:  # noqa: B027 -- a hook, empty by default
        """Free the backend's own resources (called by the session that owns it)."""


class InlineExecutor(concurrent.futures.Executor):
    """An executor that runs each call at once on the calling thread.

    For deterministic tests only: kernels then block the event loop.
    """

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn`` now and return a finished future."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # delivered through the future, as a pool would
            future.set_exception(exc)
        return future


#: The worker priority of sessions that do not set ``SessionConfig.worker_priority``.
DEFAULT_PRIORITY: Priority = "low"


def default_executor() -> WorkerPool:
    """The process-wide pool shared by sessions without a pool of their own, sized to the cores.

    At the default worker priority; a ``concurrent.futures.Executor``. Created on first
    use; sharing it is what lets a request-scoped session start without starting a thread.
    """
    return default_pool(DEFAULT_PRIORITY)


def _guarded(
    ctx: contextvars.Context, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> KernelResult | Failed:
    try:
        return ctx.run(run_kernel, fn, args, kwargs)
    except BaseException as exc:  # delivered to the awaiter, which re-raises it
        return Failed(exc)


class _LocalPending:
    """A kernel on a caller's ``concurrent.futures`` executor (``executor=``)."""

    __slots__ = ("_future", "_loop")

    def __init__(self, future: concurrent.futures.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        self._future = future
        self._loop = loop

    def __await__(self) -> Generator[Any, None, KernelResult]:
        outcome = yield from asyncio.wrap_future(self._future, loop=self._loop).__await__()
        if type(outcome) is Failed:
            raise outcome.exc
        result: KernelResult = outcome
        return result

    def abandon(self, adopt: Callable[[KernelResult], object]) -> None:
        if self._future.cancel():  # never started: nothing was allocated
            return
        loop = self._loop

        def hand_over(future: concurrent.futures.Future[Any]) -> None:
            if future.cancelled() or future.exception() is not None or type(future.result()) is Failed:
                return
            try:
                loop.call_soon_threadsafe(adopt, future.result())
            except RuntimeError:  # loop closed: nobody is left to own the result
                pass

        self._future.add_done_callback(hand_over)


class LocalBackend(Backend):
    """Kernels on aiotensor's worker pool (or any ``concurrent.futures`` executor), buffers as ndarrays here.

    Args:
        executor: Where kernels run; ``None`` uses the process-wide pool of
            ``priority`` (:func:`default_executor` at the default priority). Any
            ``concurrent.futures.Executor`` works; aiotensor's own pool gets the cheaper hop.
        owns_executor: Shut the executor down in :meth:`aclose`.
        priority: The scheduling priority of the shared pool's workers, when
            ``executor`` is ``None`` (see ``SessionConfig.worker_priority``).

    Attributes:
        inline_small_ops: Whether sessions may run cheap kernels inline on the event
            loop instead of submitting them (``SessionConfig.inline_threshold_us``).
            False when the caller passed an executor of their own: every kernel
            then goes to it.
    """

    def __init__(
        self,
        executor: concurrent.futures.Executor | None = None,
        *,
        owns_executor: bool = False,
        priority: Priority = DEFAULT_PRIORITY,
    ) -> None:
        self._executor = executor
        self._owns = owns_executor
        self._priority = priority
        # aiotensor's own pool: the shared one is looked up at first use (no thread before).
        self._pool: WorkerPool | None = executor if isinstance(executor, WorkerPool) else None
        self.inline_small_ops = executor is None or owns_executor

    @property
    def executor(self) -> concurrent.futures.Executor:
        """The executor kernels run on."""
        return self._executor if self._executor is not None else default_pool(self._priority)

    def devices(self) -> list[str]:
        return [CPU0]

    @property
    def default_device(self) -> str:
        return CPU0

    in_process = True
    runs_in_context = True  # (the pool and _guarded copy the caller's context)

    def inline_limit_us(self, requested: float) -> float:
        return requested if self.inline_small_ops else 0.0

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, device: str, blas: bool = False
    ) -> PendingKernel:
        pool = self._pool
        if pool is None and self._executor is None:
            pool = self._pool = default_pool(self._priority)
        if blas:
            fn = Gated(fn)  # BLAS threads x pool workers <= cores (see _blas)
            if blas_threads_stale():  # new BLAS threads since a fork: lower them once this product started them
                fn = _RefreshAfter(fn)
        elif pool is not None and pool.max_workers > 1 and (not kwargs or (len(kwargs) == 1 and "out" in kwargs)):
            d = getattr(fn, "d", None)  # a Step: one op (out=: a buffer the session recycles)
            if d is not None and d.ufunc and self.namespace == "numpy" and large_enough(args):
                fn = Split(fn, d.kernel_for(np), pool.spawn, pool.max_workers)
            elif getattr(fn, "spawning", None) is not None:  # a program with blocked runs (_blocked)
                fn = fn.spawning(fn, pool.spawn, pool.max_workers)  # type: ignore[attr-defined]
        if pool is not None:
            # The pool copies the context: kernels see the caller's context variables (numpy's errstate too).
            return pool.run(run_kernel, fn, args, kwargs)
        ctx = contextvars.copy_context()
        future = self.executor.submit(_guarded, ctx, fn, args, kwargs)
        return _LocalPending(future, asyncio.get_running_loop())

    async def fetch(self, handles: Sequence[Any]) -> list[NDArray]:
        def copy_all() -> list[NDArray]:
            return [h.copy() for h in handles]

        if sum(h.nbytes for h in handles) <= _COPY_ON_POOL_BYTES:
            return copy_all()
        pool = self._pool
        if pool is None and self._executor is None:
            pool = self._pool = default_pool(self._priority)
        pending = None
        try:
            if pool is not None:
                try:
                    pending = pool.run(copy_all)
                except RuntimeError:  # the pool was shut down (a session that owns it closed)
                    return copy_all()
                copies: list[NDArray] = await pending
                return copies
            return await asyncio.get_running_loop().run_in_executor(self.executor, copy_all)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                if pending is not None:
                    pending.abandon(_ignore)  # not started: never copies; else its copy is dropped
                raise
            # Nobody cancelled the caller: the executor was shut down (a session that
            # owns its pool closed) before the copy started. The handles are still
            # referenced here, so the copy can be made on this thread instead.
            return copy_all()

    def peek(self, handle: Any) -> NDArray | None:
        return handle  # type: ignore[no-any-return]

    releases = False

    def release(self, handle: Any) -> None:
        pass  # dropping the registry's reference is the release

    async def aclose(self) -> None:
        if self._owns and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _ignore(_: object) -> None:
    pass


class _RefreshAfter:
    """A BLAS kernel after which the BLAS helper threads are lowered again (see ``_priority``)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.fn(*args, **kwargs)
        finally:
            refresh_blas_threads()
