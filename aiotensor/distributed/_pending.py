"""One op in flight on the cluster: submit its task, wait for its metadata, make its handles.

Awaiting a :class:`DaskPending` waits for the event the task's wrapper sends when it
finishes (see :mod:`._remote`), never for the task's data. The caller's ``np.errstate``
at submission goes with the task, and the floating-point errors the event reports are
handed to the caller's ``np.geterrcall()``: the engine submits inside ``_fpwarn``'s
collecting context, so numpy's warnings are reported at the user's line as for a local
kernel, and ``np.errstate(...="raise")`` raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import BackendError
from .._kernels import BufferInfo, KernelResult
from .._programs._program import Program
from ._remote import FpErrors, Meta, describe, run_remote

if TYPE_CHECKING:
    from ._backend import DaskBackend

__all__ = ["SCATTER_BYTES", "DaskPending"]

#: ndarray arguments larger than this are scattered to a worker rather than embedded in
#: the task (Dask warns about graphs over 10 MB and ships them through the scheduler).
SCATTER_BYTES = 1 << 20


def _has_large_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.nbytes > SCATTER_BYTES
    if type(value) in (list, tuple):
        return any(_has_large_array(v) for v in value)
    if type(value) is dict:
        return any(_has_large_array(v) for v in value.values())
    return False


def _has_large_constant(fn: Callable[..., Any]) -> bool:
    # An expression's program holds its ndarray operands (``x + big``, ``xp.asarray(big)``)
    # in its steps, not in the task's arguments: the program itself must be scattered.
    return isinstance(fn, Program) and _has_large_array(fn.steps)


#: np.errstate modes a task runs under as its caller set them.
_SHIPPED_MODES = frozenset({"ignore", "warn", "raise", "call"})


def _set_done(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class DaskPending:
    """One submitted task: awaiting it waits for its metadata event, never for its data."""

    __slots__ = (
        "_args",
        "_backend",
        "_done",
        "_errcall",
        "_errstate",
        "_fn",
        "_future",
        "_key",
        "_kwargs",
        "_owned",
        "_waiter",
        "_workers",
    )

    def __init__(
        self,
        backend: DaskBackend,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str,
        workers: str | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._backend = backend
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self._key = key
        self._workers = workers
        # What the kernel would run under in the caller's thread (as the local pool's copy of
        # the context). "print" and "log" write on the worker's side (numpy's own message
        # names the ufunc, which the callback never learns): the worker's default, as before.
        self._errstate = {k: v for k, v in np.geterr().items() if v in _SHIPPED_MODES}
        self._errcall: Any = np.geterrcall()
        self._waiter: asyncio.Future[tuple[Meta, FpErrors]] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()
        self._owned: list[Any] = []  # futures to release if the caller goes away
        self._future: Any = None
        if not (_has_large_array((args, kwargs)) or _has_large_constant(fn)):
            self._submit()  # start now; large inputs are scattered first, in __await__

    def _submit(self) -> None:
        client = self._backend._dask
        future = client.submit(
            run_remote,
            self._fn,
            self._args,
            self._kwargs,
            self._backend._topic,
            self._key,
            self._errstate,
            key=self._key,
            workers=self._workers,
            pure=False,
        )
        self._future = future
        self._owned.append(future)
        # No event can arrive before this returns to the loop: registering now is in time.
        self._backend._waiters[self._key] = self._waiter
        self._fn = self._args = self._kwargs = None  # type: ignore[assignment]
        loop, done = asyncio.get_running_loop(), self._done

        def finished(_: Any) -> None:  # on Dask's callback thread
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(_set_done, done)

        future.add_done_callback(finished)

    async def _scatter_large(self) -> None:
        client = self._backend._dask

        async def put_one(value: Any) -> Any:
            future = await client.scatter(value, hash=False, workers=self._workers)
            self._owned.append(future)
            return future

        async def put(value: Any) -> Any:
            if isinstance(value, np.ndarray) and value.nbytes > SCATTER_BYTES:
                return await put_one(value)
            if type(value) in (list, tuple):
                return type(value)([await put(v) for v in value])
            return value

        if _has_large_constant(self._fn):
            self._fn = await put_one(self._fn)
        self._args = await put(self._args)
        self._kwargs = {k: await put(v) for k, v in self._kwargs.items()}

    def __await__(self) -> Generator[Any, None, KernelResult]:
        return self._result().__await__()

    async def _result(self) -> KernelResult:
        backend = self._backend
        try:
            if self._future is None:
                await self._scatter_large()
                self._submit()
            future = self._future
            assert future is not None
            either: list[asyncio.Future[Any]] = [self._waiter, self._done]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not self._waiter.done():
                meta, errors = await self._finished_without_event(future)
            else:
                meta, errors = self._waiter.result()
        except Exception:
            self._release_owned()  # the erred key must not linger on the scheduler
            raise
        finally:
            backend._waiters.pop(self._key, None)
        errcall = self._errcall
        if errors and callable(errcall):
            for err, flag in errors:
                errcall(err, flag)
        multi, outputs = meta
        handles: list[Any] = [future]
        if multi:
            # One future per output, computed where the tuple lives; the tuple's own key
            # is released at once (the scheduler keeps it until the items exist).
            client = backend._dask
            handles = [
                client.submit(operator.getitem, future, i, key=f"{self._key}-{i}", pure=False)
                for i in range(len(outputs))
            ]
            future.release()
        for f in self._owned:
            if f is not future:
                f.release()  # scattered inputs: the task holds them while it needs them
        return KernelResult(
            [BufferInfo(h, tuple(s), np.dtype(d), n) for h, (s, d, n) in zip(handles, outputs, strict=True)], multi
        )

    async def _finished_without_event(self, future: Any) -> tuple[Meta, FpErrors]:
        if future.status == "error":
            await future  # raises the remote exception, with the remote traceback
        if future.status != "finished":
            reason = future.status
            try:
                await future  # a cancelled future raises with Dask's reason
            except Exception as exc:
                reason = str(getattr(exc, "reason", None) or exc)
            raise BackendError(
                f"the Dask cluster cancelled task {self._key!r} ({reason}): an input was lost with its worker"
                " (scattered data cannot be recomputed) or the client lost the scheduler"
            )
        # The event can trail the completion (or a rerun may not send one): give it one
        # loop turn, then ask a tiny task on the same worker (the kernel's floating-point
        # errors went with the lost event: none are reported then).
        await asyncio.sleep(0)
        if self._waiter.done():
            return self._waiter.result()
        probe = self._backend._dask.submit(describe, future, pure=False)
        try:
            meta: Meta = await probe
        finally:
            probe.release()
        return meta, []

    def abandon(self, adopt: Callable[[KernelResult], object]) -> None:
        """The caller was cancelled: release the task's future, so the task no longer holds a worker."""
        self._backend._waiters.pop(self._key, None)
        self._release_owned()

    def _release_owned(self) -> None:
        for f in self._owned:
            f.release()
