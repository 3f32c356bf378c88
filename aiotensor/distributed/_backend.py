"""DaskBackend: session buffers as futures on a dask.distributed cluster.

Each op becomes one task on its inputs' futures, so data stays on the workers; the
task's wrapper (:mod:`._remote`) reports the result's shape, dtype and size as an
event, so the client learns them without gathering. The session's registry owns one
future per buffer; freeing a buffer releases its future, which is the client's last
reference, so the scheduler forgets the key and the workers drop the data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Self

from distributed import Client

from .._backends._base import Backend, PendingKernel
from .._devices import CPU0
from .._errors import BackendError, InvalidArgumentError, WrongEventLoopError
from .._types import NDArray
from ._pending import DaskPending
from ._remote import FpErrors, Meta

__all__ = ["DaskBackend"]

logger = logging.getLogger("aiotensor")

#: The cached view of the workers is refreshed at most this often (seconds), by submits.
REFRESH_SECONDS = 1.0
#: Device names of workers: ``/worker:<index>``.
WORKER_KIND = "worker"


def _key_name(fn: Callable[..., Any]) -> str:
    # apply() wraps the user's function in an object that keeps it as ``fn``.
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", None) or type(fn).__name__
    return name.removeprefix("_k_").strip("_<>").replace("-", "_") or "kernel"


class DaskBackend(Backend):
    """Kernels as tasks on a dask.distributed cluster; buffers as futures in worker memory.

    ``AsyncEagerSession(backend=DaskBackend(client))`` runs the session's ops on the
    cluster with the same cleanup strategies: freeing a buffer releases its future.
    Devices are ``/cpu:0`` (any worker, the default) and ``/worker:N`` for each worker,
    numbered by worker name in the order first seen (a worker restarted under the same
    name keeps its number).

    Args:
        client: A ``distributed.Client`` created with ``asynchronous=True`` on the
            event loop the sessions run on (not closed by the backend), or a scheduler
            address such as ``"tcp://127.0.0.1:8786"``: the backend then connects in
            :meth:`start` and closes its own client in :meth:`aclose`; use it as
            ``async with DaskBackend(address) as backend:``.

    Raises:
        InvalidArgumentError: ``client`` is a synchronous client, or neither a client
            nor an address.
    """

    def __init__(self, client: Client | str) -> None:
        if isinstance(client, str):
            self._address: str | None = client
            # Any: distributed is only partly typed; the public property gives the real type.
            self._client: Any = None
        elif isinstance(client, Client):
            if not client.asynchronous:
                raise InvalidArgumentError(
                    "DaskBackend needs a client made with Client(..., asynchronous=True) on the session's"
                    " event loop, or a scheduler address"
                )
            self._address, self._client = None, client
        else:
            raise InvalidArgumentError(
                f"DaskBackend takes a distributed.Client or a scheduler address, got {type(client).__name__}"
            )
        self._topic = f"aiotensor-meta-{uuid.uuid4().hex}"
        self._waiters: dict[str, asyncio.Future[tuple[Meta, FpErrors]]] = {}
        self._subscribed = False
        self._closed = False
        self._starting: asyncio.Lock | None = None
        # worker name -> device index, never reused; device -> current worker address
        self._indices: dict[str, int] = {}
        self._placement: dict[str, str] = {}
        self._devices = [CPU0]
        self._refreshed = 0.0
        self._refresh_task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------
    @property
    def client(self) -> Client:
        """The Dask client ops are submitted through.

        Raises:
            BackendError: The backend was given an address and has not started yet.
        """
        client: Client = self._dask
        return client

    @property
    def _dask(self) -> Any:
        if self._client is None:
            raise BackendError("DaskBackend has no client yet: it connects to its address in start()")
        return self._client

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Connect (for an address), subscribe to metadata events and read the workers.

        Called by each session on its first use; later calls check the loop and refresh
        the workers if the cached view is older than a second.
        """
        if self._closed:
            raise BackendError("DaskBackend is closed")
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._client is None:
                assert self._address is not None
                connect: Any = Client  # distributed's Client.__init__ is untyped
                try:
                    self._client = await connect(self._address, asynchronous=True, set_as_default=False)
                except OSError as exc:
                    raise BackendError(f"cannot connect to the Dask scheduler at {self._address}: {exc}") from exc
            client = self._client
            if client.status == "newly-created":
                await client
            if client.loop.asyncio_loop is not asyncio.get_running_loop():
                raise WrongEventLoopError(
                    "the Dask client runs on another event loop than this session; create the client"
                    " (Client(..., asynchronous=True)) inside the loop the session runs on"
                )
            if not self._subscribed:
                client.subscribe_topic(self._topic, self._on_event)
                self._subscribed = True
            if time.monotonic() - self._refreshed >= REFRESH_SECONDS:  # spare short sessions an RPC each
                await self.refresh()

    async def aclose(self) -> None:
        """Stop listening for events and close the client if the backend created it."""
        if self._closed:
            return
        self._closed = True
        task, self._refresh_task = self._refresh_task, None
        if task is not None:
            task.cancel()
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(BackendError("the DaskBackend was closed while the op ran"))
        self._waiters.clear()
        client = self._client
        if client is None:
            return
        if self._subscribed and client.status == "running":
            with contextlib.suppress(ValueError):
                client.unsubscribe_topic(self._topic)
        if self._address is not None:
            await client.close()

    # -- devices ----------------------------------------------------------------------
    def devices(self) -> list[str]:
        """``/cpu:0`` (any worker) then ``/worker:N`` per live worker, as last refreshed."""
        return self._devices

    def worker_address(self, device: str) -> str | None:
        """The address of the worker behind ``device`` (``None`` for ``/cpu:0`` or an unknown name)."""
        return self._placement.get(device)

    async def refresh(self) -> list[str]:
        """Ask the scheduler for the live workers and update :meth:`devices`."""
        client = self._dask
        info = await client.scheduler.identity(n_workers=-1)
        self._refreshed = time.monotonic()
        names = {str(w.get("name", addr)): addr for addr, w in info.get("workers", {}).items()}
        for name in sorted(names, key=lambda n: (len(n), n)):  # "2" before "10"
            self._indices.setdefault(name, len(self._indices))
        placement = {f"/{WORKER_KIND}:{self._indices[n]}": addr for n, addr in names.items()}
        self._placement = dict(sorted(placement.items(), key=lambda kv: int(kv[0].rsplit(":", 1)[1])))
        self._devices = [CPU0, *self._placement]
        return self._devices

    def _maybe_refresh(self) -> None:
        # list_devices() is synchronous: keep its cached view fresh from the async side.
        if time.monotonic() - self._refreshed < REFRESH_SECONDS:
            return
        task = self._refresh_task
        if task is not None and not task.done():
            return
        self._refreshed = time.monotonic()
        self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except (OSError, BackendError) as exc:  # the next submit tries again
            logger.debug("aiotensor: refreshing the Dask workers failed: %s", exc)

    # -- kernels ----------------------------------------------------------------------
    def _on_event(self, event: tuple[float, Any]) -> None:
        token, multi, outputs, errors = event[1]
        waiter = self._waiters.pop(token, None)
        if waiter is not None and not waiter.done():
            meta: Meta = (bool(multi), [(list(s), str(d), int(n)) for s, d, n in outputs])
            waiter.set_result((meta, [(str(e), int(f)) for e, f in errors]))

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *, device: str, blas: bool = False
    ) -> PendingKernel:
        """Submit ``fn`` as one task on its inputs' futures; ``device`` maps to ``workers=``."""
        if self._closed:
            raise RuntimeError("DaskBackend is closed")
        client = self._dask
        if client.status not in ("running", "connecting"):
            raise RuntimeError(f"the Dask client is {client.status}")
        self._maybe_refresh()
        workers = None if device == CPU0 else self._placement.get(device)
        return DaskPending(self, fn, args, kwargs, f"aiotensor-{_key_name(fn)}-{uuid.uuid4().hex}", workers)

    async def fetch(self, handles: Sequence[Any]) -> list[NDArray]:
        """Gather the buffers from the workers (copies owned by the caller)."""
        try:
            values = await self._dask.gather(list(handles))
        except Exception as exc:
            raise BackendError(f"gathering {len(handles)} buffer(s) from the cluster failed: {exc!r}") from exc
        # A client in the workers' process (processes=False) gets the stored arrays themselves.
        return [v if v.flags.writeable and v.flags.owndata else v.copy() for v in values]

    def peek(self, handle: Any) -> NDArray | None:
        """Always ``None``: buffers live on the workers; ``await t.numpy()`` gathers."""
        return None

    def release(self, handle: Any) -> None:
        """Release the buffer's future: the scheduler forgets the key once nothing else needs it."""
        handle.release()
