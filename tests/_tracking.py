"""An oracle for "nothing lost, nothing freed twice": a registry and backend that remember.

``tracked_session()`` gives a session whose registry records every buffer it ever
owned and whose backend counts every release, keeping each released buffer alive so
that ``id()`` values are never reused while a test runs.
"""

from __future__ import annotations

from typing import Any

import aiotensor as at
from aiotensor._registry import Registry
from aiotensor.testing import RecordingBackend

#: The backend half of the oracle: aiotensor's own test backend counts releases per buffer.
TrackingBackend = RecordingBackend


class TrackingRegistry(Registry):
    """A registry that remembers every buffer it took ownership of."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ever: dict[int, Any] = {}
        self.drops = 0  # drops notified so far
        self.drops_at_collect = 0  # ``drops`` when the last collect() had drained the queue

    def notify_dropped(self, rid: int) -> None:
        self.drops += 1
        super().notify_dropped(rid)

    def collect(self) -> int:
        n = super().collect()
        self.drops_at_collect = self.drops
        return n

    def add(self, buffer: Any, nbytes: int) -> int:
        rid = super().add(buffer, nbytes)
        self.ever[rid] = buffer
        return rid

    def buffers(self) -> dict[int, tuple[Any, int]]:
        """rid -> (buffer, nbytes) of what is held now."""
        return self._buffers


def tracked_session(
    cleanup: at.ResourceCleanupStrategy = at.ResourceCleanupStrategy.IN_BACKGROUND,
    config: at.SessionConfig | None = None,
    backend: TrackingBackend | None = None,
) -> tuple[at.AsyncEagerSession, TrackingRegistry, TrackingBackend]:
    """An unopened session wired to a tracking registry and backend."""
    backend = TrackingBackend() if backend is None else backend
    s = at.AsyncEagerSession(cleanup=cleanup, config=config, backend=backend)
    registry = TrackingRegistry(backend.release, s.config.memory_limit, s.config.memory_wait)
    s._engine.registry = registry  # before the session opens: its policy binds to it at start
    return s, registry, backend


def check_accounting(registry: TrackingRegistry, backend: TrackingBackend) -> None:
    """The invariants that hold after every step, whatever the strategy."""
    held = registry.buffers()
    assert registry.allocated - registry.freed == registry.live_tensors == len(held)
    assert registry.live_bytes == sum(n for _, n in held.values())
    assert registry.live_bytes >= 0
    assert not backend.double_releases()
    for buffer, _ in held.values():
        assert not backend.was_released(buffer), "a held buffer was released"


def check_all_released(registry: TrackingRegistry, backend: TrackingBackend) -> None:
    """After close: nothing held, every buffer ever owned released exactly once."""
    assert registry.live_tensors == 0
    assert registry.live_bytes == 0
    assert registry.allocated == registry.freed == len(registry.ever)
    for buffer in registry.ever.values():
        assert backend.released[id(buffer)] == 1
