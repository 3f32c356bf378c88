"""Session configuration: the cleanup strategy and the TF1-style ConfigProto fields."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._backends._priority import Priority, validate
from ._errors import InvalidArgumentError
from ._memory import check_wait

__all__ = ["ResourceCleanupStrategy", "SessionConfig"]


class ResourceCleanupStrategy(enum.Enum):
    """How a session frees the buffers of tensors whose handles were dropped.

    Taken from TensorFlow's ``EagerSession.ResourceCleanupStrategy``. Whatever the
    strategy, closing the session frees everything it still holds.
    """

    #: One supervised asyncio task per session frees dropped buffers as soon as
    #: they are dropped, with no further op needed. The default.
    IN_BACKGROUND = "in_background"
    #: Dropped buffers are freed synchronously at the session's safe points: before
    #: and after every op and around every other coroutine of its API. No extra task.
    ON_SAFE_POINTS = "on_safe_points"
    #: Nothing is freed before the session closes. Only for short sessions: n ops
    #: in a loop of m iterations hold n*m buffers until close.
    ON_SESSION_CLOSE = "on_session_close"


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Options of a session, after TensorFlow 1's ``ConfigProto``.

    Attributes:
        allow_soft_placement: Run an op placed on a device the backend lacks on
            ``/cpu:0`` instead of raising :class:`InvalidDeviceError`.
        log_device_placement: Log each op's name and device at INFO on the
            ``aiotensor`` logger.
        max_workers: Give the session a thread pool of its own with this many
            workers, shut down at close. ``None`` shares the process-wide pool.
        memory_limit: Bytes the session may hold at once (pending buffers
            included). An allocation past it raises :class:`ResourceExhaustedError`.
        memory_wait: Seconds an allocation over ``memory_limit`` may wait for other
            tasks to free memory (first come, first served) before it raises
            :class:`ResourceExhaustedError`. ``None`` (the default) fails at once.
            Needs ``memory_limit``; see ``docs/reliability.md`` for what is guaranteed.
        inline_threshold_us: Ops whose kernel is estimated to take at most this
            many microseconds run inline on the event loop thread, skipping the
            thread hop (see ``docs/guides/performance-tuning.md``); an expression
            estimated at up to 4x this runs there too, in slices of at most this long
            with other tasks run between them. Larger ones, and every ``apply`` and
            a fused function's first call, run on the pool. ``0`` sends every
            kernel to the pool. Only sessions on the shared pool or their own
            (``max_workers``) inline; an explicit ``executor=`` gets every kernel.
        buffer_cache_bytes: Bytes of freed buffers (each of at least 64 KiB) the
            session keeps to write the next results of the same shape and dtype into
            (``out=``), saving the page faults of fresh allocations. Shared with child
            sessions, counted in ``stats().cached_bytes`` (not ``live_bytes``) and
            against ``memory_limit`` (the cache gives way first), released at close or
            by :meth:`AsyncEagerSession.trim`. ``0`` turns it off. See
            ``docs/guides/performance-tuning.md`` for sizing.
        worker_priority: The scheduling priority of the pool workers and of the BLAS
            threads they drive, so that kernels yield the cores to the event loop
            (Linux; unchanged elsewhere): ``"low"`` (nice 10, the default),
            ``"idle"`` (``SCHED_IDLE``), a nice value 0-19, or ``"normal"`` (off).
            The trade-off: lowered threads also yield to other processes (see
            ``docs/guides/performance-tuning.md``). Sessions on the shared pool share
            one pool per priority; an explicit ``executor=`` is left as it is.
    """

    allow_soft_placement: bool = False
    log_device_placement: bool = False
    max_workers: int | None = None
    memory_limit: int | None = None
    inline_threshold_us: float = 50.0
    memory_wait: float | None = None
    buffer_cache_bytes: int = 64 << 20
    worker_priority: Priority = "low"

    def __post_init__(self) -> None:
        cache = self.buffer_cache_bytes
        if isinstance(cache, bool) or not isinstance(cache, int) or cache < 0:
            raise InvalidArgumentError(f"SessionConfig.buffer_cache_bytes must be an int >= 0, got {cache!r}")
        problem = validate(self.worker_priority)
        if problem is not None:
            raise InvalidArgumentError(f"SessionConfig.worker_priority {problem}")
        limit = self.inline_threshold_us
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 <= limit < float("inf"):
            raise InvalidArgumentError(f"SessionConfig.inline_threshold_us must be a finite number >= 0, got {limit!r}")
        for field in ("max_workers", "memory_limit"):
            value = getattr(self, field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgumentError(f"SessionConfig.{field} must be a positive int or None, got {value!r}")
        check_wait(self.memory_wait, self.memory_limit)
