"""Whether the event loop's thread is saturated: the input of busy-loop placement.

A kernel cheaper than a thread hop runs inline on the loop (``_cost``): on an idle loop
that saves the hop's latency. On a saturated loop (a server whose loop thread parses
HTTP for as many requests as it can) the loop thread is the bottleneck, and what counts
is the loop's own time: a kernel that takes longer than the hop costs the loop (the
submit, the wake-up, the future's callbacks: ~16 µs of loop CPU here, measured in
``docs/performance.md``) is better computed by the pool, on the other core, while the
loop parses. So while the loop is saturated, kernels estimated above
:data:`BUSY_INLINE_US` go to the pool instead of running inline.

Saturation is measured, per thread (a loop runs on one): the loop thread's CPU time
(``time.thread_time``) over wall time, in windows of at least :data:`WINDOW_S`, smoothed
by an EWMA. A thread that never waits in ``select``/``epoll`` has a utilization near 1;
an idle loop near 0. It needs no private API, so it reads asyncio and uvloop alike, and
it costs one ``clock_gettime`` per window, taken only by kernels that would run on the
loop (inline, or a program in slices) and are estimated above :data:`BUSY_INLINE_US`
(the decision is never asked for smaller ones). The state flips with hysteresis (busy above :data:`BUSY_ABOVE`, idle
again below :data:`IDLE_BELOW`) so that moving kernels off a busy loop, which lowers its
utilization, does not at once move them back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BUSY_ABOVE",
    "BUSY_INLINE_US",
    "IDLE_BELOW",
    "WINDOW_S",
    "LoopLoad",
    "Sensor",
    "loop_load",
    "offload",
    "sensor",
    "stays_inline",
]

#: On a saturated loop, kernels estimated above this many µs go to the pool. A pool round
#: trip costs the loop thread ~16 µs of CPU (measured: 19.4 µs of loop CPU per pool op
#: against 15.0 µs per inline op whose kernel takes 11.8 µs), and the cost model's
#: estimates run 2-3x above measured kernel times, so a kernel estimated above ~35 µs
#: takes the loop longer inline than the hop would.
BUSY_INLINE_US = 35.0
#: Seconds of wall time per utilization sample at least.
WINDOW_S = 0.005
#: The loop counts as saturated once its smoothed utilization exceeds this ...
BUSY_ABOVE = 0.85
#: ... and as idle again once it drops below this.
IDLE_BELOW = 0.6
#: Weight of a new sample in the EWMA (a window of 5 ms: the average spans ~20 ms).
_ALPHA = 0.25
#: A gap longer than this since the last sample: the old average says nothing any more.
_STALE_S = 0.1


@dataclass(frozen=True, slots=True)
class LoopLoad:
    """A snapshot of the busy-loop placement of the calling thread's event loop (:func:`loop_load`).

    Attributes:
        utilization: The loop thread's smoothed CPU time over wall time (0: idle, 1: it
            never waited), as of the last sample.
        busy: Whether the loop counts as saturated now: kernels estimated above
            ``busy_inline_us`` go to the pool.
        busy_inline_us: The estimate above which a busy loop sends a kernel to the pool.
        samples: Utilization windows measured.
        offloaded: Kernels sent to the pool because the loop was busy (they would
            have run inline on an idle loop).
        kept_inline: Kernels in the same band of estimates kept on the loop (inline,
            or a program in slices) because the loop was not busy.
    """

    utilization: float = 0.0
    busy: bool = False
    busy_inline_us: float = BUSY_INLINE_US
    samples: int = 0
    offloaded: int = 0
    kept_inline: int = 0


class Sensor:
    """The utilization of one thread's loop and the decisions taken from it (see the module docstring).

    ``cpu`` and ``wall`` are the clocks (the thread's CPU time, a monotonic clock), in seconds.
    """

    __slots__ = ("_cpu", "_cpu0", "_wall", "_wall0", "busy", "kept_inline", "offloaded", "samples", "utilization")

    def __init__(
        self, cpu: Callable[[], float] = time.thread_time, wall: Callable[[], float] = time.perf_counter
    ) -> None:
        self._cpu = cpu
        self._wall = wall
        self._wall0 = wall()
        self._cpu0 = cpu()
        self.utilization = 0.0
        self.busy = False
        self.samples = 0
        self.offloaded = 0
        self.kept_inline = 0

    def sample(self) -> bool:
        """Update the utilization if a window has passed; whether the loop is busy."""
        now = self._wall()
        span = now - self._wall0
        if span < WINDOW_S:
            return self.busy
        cpu = self._cpu()
        used = min(1.0, max(0.0, (cpu - self._cpu0) / span))
        self._wall0, self._cpu0 = now, cpu
        self.samples += 1
        if span > _STALE_S or self.samples == 1:
            self.utilization = used
        else:
            self.utilization += _ALPHA * (used - self.utilization)
        if self.busy:
            self.busy = self.utilization >= IDLE_BELOW
        else:
            self.busy = self.utilization > BUSY_ABOVE
        return self.busy

    def offload(self) -> bool:
        """Whether a kernel that would run on the loop, estimated above ``BUSY_INLINE_US``, goes to the pool."""
        if self.sample():
            self.offloaded += 1
            return True
        self.kept_inline += 1
        return False

    def snapshot(self) -> LoopLoad:
        """The state as a :class:`LoopLoad`."""
        return LoopLoad(self.utilization, self.busy, BUSY_INLINE_US, self.samples, self.offloaded, self.kept_inline)


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.sensor = Sensor()


_local = _PerThread()


def sensor() -> Sensor:
    """The calling thread's sensor (a loop runs on one thread: its sensor)."""
    return _local.sensor


def offload(est_us: float) -> bool:
    """Whether a kernel estimated at ``est_us``, within the inline threshold, goes to the pool: the loop is busy."""
    return est_us > BUSY_INLINE_US and _local.sensor.offload()


def stays_inline() -> bool:
    """For a kernel in the band about to run inline: True (counted as kept inline) unless the loop is busy.

    When it is, the kernel's caller takes the path that calls :func:`offload`, which
    counts it once.
    """
    sensor = _local.sensor
    if sensor.sample():
        return False
    sensor.kept_inline += 1
    return True


def loop_load() -> LoopLoad:
    """How busy the calling thread's event loop is, and where that sent kernels.

    Kernels whose estimate lies between ``busy_inline_us`` and the session's
    ``inline_threshold_us`` (and expressions' programs that would run on the loop in
    slices) run on the loop while it is idle and on the pool while it is saturated (its
    thread found no time to wait for I/O): the pool's thread computes them while the loop
    serves. Counts are totals since the thread first asked.
    """
    return _local.sensor.snapshot()
