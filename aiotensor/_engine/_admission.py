"""Memory under ``memory_limit``: a kernel's reservation, a multi-op kernel's hold, a result's fit.

The buffer cache gives way first; ``memory_wait`` queues for room (``_memory.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._errors import SessionClosedError
from .._kernels import KernelResult
from ._lifecycle import _OPEN

if TYPE_CHECKING:
    from ._core import Engine

__all__ = ["fit_result", "hold", "reserve"]


async def hold(self: Engine, label: str, need: int | None) -> tuple[int, int]:
    """``Engine._hold``: a multi-op kernel's budget under ``memory_limit``, and the bytes reserved for it."""
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


async def reserve(self: Engine, label: str, nbytes: int | None) -> None:
    """``Engine._reserve``: room for ``nbytes`` under ``memory_limit`` (queued for with ``memory_wait``)."""
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


async def fit_result(self: Engine, op: str, result: KernelResult, reserved: int | None) -> None:
    """``Engine._fit_result``: a kernel's result checked against ``memory_limit`` before it gets handles."""
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
