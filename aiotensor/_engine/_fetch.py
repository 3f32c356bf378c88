"""Values back to the caller: ``Engine.fetch`` and ``Engine.fetch_now`` (copies), ``Engine.peek``, ``Engine.discard``.

``fetch_now`` is the common case of ``fetch`` (one small local tensor) without a
coroutine; ``peek`` a read-only view of a local buffer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._backends._base import _COPY_ON_POOL_BYTES
from .._cost import HOLD_PER_OP_S
from .._errors import AioTensorError, SessionClosedError
from .._tensor import Tensor
from ._lifecycle import _OPEN, on_loop

if TYPE_CHECKING:
    from .._types import NDArray
    from ._core import Engine

__all__ = ["discard", "fetch", "fetch_now", "peek"]


class _NoRegistry:
    """Where a discarded handle's drop goes: nowhere (its buffer was freed already)."""

    def notify_dropped(self, rid: int) -> None:
        pass


_NO_REGISTRY = _NoRegistry()


def discard(self: Engine, t: Tensor) -> None:
    """Free a result nobody else holds (``eval``/``run`` of an expression), whatever the strategy."""
    registry = t._registry
    if not registry.closed:
        registry.free(t._rid)
    t._registry = _NO_REGISTRY  # type: ignore[assignment]  # its __del__ queues nothing


async def fetch(self: Engine, tensors: list[Tensor], api: str) -> list[NDArray]:
    """Copies of the tensors' values, owned by the caller."""
    if self.state is not _OPEN:
        await self.open()
    if not on_loop(self._loop):  # (check_loop, inline: a running loop is certain in a coroutine)
        raise self._wrong_loop()
    handles = [self.buffer(t, api) for t in tensors]
    if self._held >= self._hold_s:
        await self._yield_held()  # a small fetch copies on the loop without suspending
    safe_point = self.policy.safe_point
    dropped = self.registry._dropped  # (the hook frees what is queued here: nothing queued, no call)
    if safe_point is not None and dropped:
        safe_point()
    if self._local_fetch and sum(h.nbytes for h in handles) <= _COPY_ON_POOL_BYTES:
        values = [h.copy() for h in handles]  # what LocalBackend.fetch does, one coroutine less
    else:
        values = await self.backend.fetch(handles)
    # Counted whether or not the backend suspended (it does not say): at worst the
    # next yield comes one fetch early.
    self._held += HOLD_PER_OP_S
    if safe_point is not None and dropped:
        safe_point()
    return values


def fetch_now(self: Engine, t: Tensor) -> NDArray | None:
    """A copy of the value of ``t`` (this engine's own tensor), or ``None`` if it takes :func:`fetch`.

    The common fetch, ``await t.numpy()`` of a small local tensor, needs no await: the
    session is open on this loop, no yield is due (``_held``), the backend copies as
    ``LocalBackend.fetch`` does and the value is small. Then this is :func:`fetch` for
    one tensor without its coroutine, its list and its checks for other sessions'
    tensors, safe points included. Anything else (unopened, closed, another loop, a
    freed buffer, a large or remote value) returns ``None``, and :func:`fetch` opens,
    raises, yields or copies on the pool as it always does.
    """
    if self.state is not _OPEN or self._held >= self._hold_s or not self._local_fetch:
        return None
    if not on_loop(self._loop):  # (a loop may run in another thread later: see on_loop)
        return None
    registry = t._registry
    entry = registry._buffers.get(t._rid)
    if entry is None or entry[1] > _COPY_ON_POOL_BYTES:
        return None
    value: NDArray
    if registry._dropped:  # (the hook frees what is queued here: nothing queued, no call)
        safe_point = self.policy.safe_point
        if safe_point is not None:
            safe_point()
            value = entry[0].copy()
            self._held += HOLD_PER_OP_S
            safe_point()
            return value
    value = entry[0].copy()
    self._held += HOLD_PER_OP_S
    return value


def peek(self: Engine, t: Tensor) -> NDArray:
    """A read-only view of a local buffer, without suspending."""
    if t._registry.closed:
        raise SessionClosedError(f"tensor {t.name!r} was freed because its session closed")
    arr = self.backend.peek(self.buffer(t, "__array__"))
    if arr is None:
        raise AioTensorError(f"tensor {t.name!r} lives on a remote backend; use `await t.numpy()` to fetch it")
    return arr
