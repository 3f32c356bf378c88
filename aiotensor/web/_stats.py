"""What one request's session did, handed to the service's ``on_request`` hook."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._registry import SessionStats

__all__ = ["Outcome", "RequestStats"]

Outcome = Literal["completed", "failed", "disconnected"]
"""How a request that opened a session ended (:attr:`RequestStats.outcome`).

``"completed"``: its response was sent, whatever the status; ``"failed"``: an exception
left the app before a response; ``"disconnected"``: the client went away first.
"""


@dataclass(frozen=True, slots=True)
class RequestStats:
    """One request that opened a request session, after that session closed.

    Attributes:
        method: The HTTP method.
        path: The request path.
        status: The response status, or ``None`` if no response was started (an
            exception left the app, or the client disconnected).
        outcome: ``"completed"``, ``"failed"`` or ``"disconnected"``.
        seconds: Wall time from the middleware seeing the request to the session closed.
        session: The request session's :class:`~aiotensor.SessionStats` right after it
            closed: ``allocated`` and ``freed`` buffers, ``allocated_bytes``,
            ``peak_bytes``, ``kernel_seconds`` and ``live_tensors`` (0 unless close
            is broken).
    """

    method: str
    path: str
    status: int | None
    outcome: Outcome
    seconds: float
    session: SessionStats

    @property
    def allocated(self) -> int:
        """Buffers the request session allocated (intermediates of fused functions included)."""
        return self.session.allocated

    @property
    def peak_bytes(self) -> int:
        """The most bytes the request session held at once."""
        return self.session.peak_bytes

    @property
    def kernel_seconds(self) -> float:
        """Seconds the request session's kernels ran (inline on the loop and on the pool)."""
        return self.session.kernel_seconds

    def as_dict(self) -> dict[str, object]:
        """A flat, JSON-ready dict for a log line or a metrics exporter."""
        s = self.session
        return {
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "outcome": self.outcome,
            "seconds": self.seconds,
            "allocated": s.allocated,
            "freed": s.freed,
            "allocated_bytes": s.allocated_bytes,
            "peak_bytes": s.peak_bytes,
            "kernel_seconds": s.kernel_seconds,
            "live_tensors": s.live_tensors,
        }
