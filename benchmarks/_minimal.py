"""The least a session of owned tensors can do per op: a reference for ``bench_engine``, not a product.

Issue 10 set its per-op targets against "a lean pure-Python implementation of the same
semantics (same checks, registry, handle with ``__del__``)". This is that
implementation, measured in the same run as aiotensor and numpy, so that every run
shows how much of aiotensor's cost any pure-Python handle registry pays.

What it keeps of aiotensor's op: a coroutine per op; the session open and on this loop;
the buffers freed whose handles were dropped (at each op, as ``ON_SAFE_POINTS`` does);
the inputs' buffers looked up by id and their shapes compared; a fresh read-only result,
registered with its bytes (live and peak); a handle whose ``__del__`` queues its id.

What it drops, each of which aiotensor's op pays for: yielding to other tasks once a
run of inline ops has held the loop (timing each kernel), kernel-time statistics, the
cost model's inline-or-pool choice, devices and placement, child sessions, names,
``memory_limit``, the buffer cache, the cleanup strategies' hooks, scalars and
broadcasting, and error mapping.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

__all__ = ["MinimalSession"]

_new = object.__new__


class _Handle:
    __slots__ = ("_rid", "_session", "shape")
    _rid: int
    _session: MinimalSession
    shape: tuple[int, ...]

    def __del__(self) -> None:
        self._session._dropped.append(self._rid)


class MinimalSession:
    """Owns the buffers of its handles; ``await add(a, b)`` is its one op."""

    def __init__(self) -> None:
        self._buffers: dict[int, tuple[Any, int]] = {}
        self._dropped: list[int] = []
        self._next = 0
        self._open = True
        self._loop = asyncio.get_running_loop()
        self.live_bytes = self.peak_bytes = 0

    def constant(self, value: Any) -> _Handle:
        """A handle owning a read-only copy of ``value``."""
        buffer = np.array(value)
        buffer.flags.writeable = False
        return self._register(buffer, buffer.shape)

    async def add(self, a: _Handle, b: _Handle) -> _Handle:
        """``a + b``, for two handles of one shape."""
        if not self._open:
            raise RuntimeError("the session is closed")
        if asyncio.get_running_loop() is not self._loop:
            raise RuntimeError("the session belongs to another event loop")
        if self._dropped:
            self._collect()
        buffers = self._buffers
        if a.shape != b.shape:
            raise ValueError(f"add: shapes {a.shape} and {b.shape} differ")
        out = np.add(buffers[a._rid][0], buffers[b._rid][0])
        out.setflags(False)
        return self._register(out, a.shape)

    def _register(self, buffer: Any, shape: tuple[int, ...]) -> _Handle:
        rid = self._next
        self._next = rid + 1
        nbytes = buffer.nbytes
        self._buffers[rid] = (buffer, nbytes)
        live = self.live_bytes = self.live_bytes + nbytes
        if live > self.peak_bytes:
            self.peak_bytes = live
        handle = _new(_Handle)  # as aiotensor makes its handles: no __init__ call
        handle._session, handle._rid, handle.shape = self, rid, shape
        return handle

    def _collect(self) -> None:
        dropped, buffers = self._dropped, self._buffers
        while dropped:
            _, nbytes = buffers.pop(dropped.pop())
            self.live_bytes -= nbytes

    def close(self) -> None:
        """Free every buffer."""
        self._open = False
        self._buffers.clear()
        self._dropped.clear()
        self.live_bytes = 0
