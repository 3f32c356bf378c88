"""Whether the event loop's thread is saturated by contending callers: the input of busy-loop placement.

A kernel cheaper than a thread hop runs inline on the loop (``_cost``): on an idle loop
that saves the hop's latency. On a saturated loop (a server whose loop thread parses
HTTP for as many requests as it can) the loop thread is the bottleneck, and what counts
is the loop's own time. A kernel on the pool saves the loop only the time the worker
computes *without the GIL*: while the worker holds it (the function's Python, numpy's
dispatch, loops over :data:`~aiotensor._cost.GIL_FREE_ABOVE` elements or fewer) the loop
thread waits for it, and each time the worker takes the GIL back after a loop that
released it, the loop waits for the hand-over too. So while the loop is busy, a kernel
estimated above :data:`BUSY_INLINE_US` goes to the pool only if its GIL-free time, less
:data:`GIL_TRANSFER_US` for each release after the first (:func:`net_free_us`), exceeds
the hop's cost to the loop, :data:`BUSY_FREE_US` (the submit, the wake-up, the future's
callbacks: ~16 µs of loop CPU here, measured in ``docs/performance.md``); else it stays
inline (``kept_held``). One large ufunc frees the loop for nearly all its time; a fused
function of small ops, or one whose few large ops hand the GIL back and forth, does not.

The GIL-free time comes from the cost model, the one input every path has: for one op,
its estimate less numpy's dispatch when its loop releases the GIL
(:func:`~aiotensor._cost.gil_free_us`); for a program, the sum over its steps; for a
fused or batched function, the sum over the ops its measured run ran
(``_interpreter.Interpreter``, kept per argument shapes by ``_placement.Placement``).

Busy is two measured conditions, both needed:

* **Saturated**: the loop thread's CPU time (``time.thread_time``) over wall time, in
  windows of at least :data:`WINDOW_S`, smoothed by an EWMA. A thread that never waits
  in ``select``/``epoll`` has a utilization near 1; an idle loop near 0. The state flips
  with hysteresis (saturated above :data:`BUSY_ABOVE`, not again below
  :data:`IDLE_BELOW`) so that moving kernels off a busy loop, which lowers its
  utilization, does not at once move them back.
* **Contended**: at least two callers were on the loop at once in the current window or
  one of the three before (~20 ms at least), so that the loop has other work to run
  while the pool computes. One caller awaiting one computation after another (a script,
  a notebook, a benchmark's loop) also keeps the thread at ~100% CPU, but nothing else
  is ready: moving its kernel to the pool only adds the hop to its wait. Callers are
  tasks, counted three ways, all with public asyncio API: HTTP requests between their
  entry into ``aiotensor.web``'s middleware and their end (:func:`enter`/:func:`leave`:
  requests in flight); tasks that reach the middleware or a placement decision in the
  same turn of the loop (they were ready together, so each waited while another ran:
  one ``call_soon`` per turn marks its end, and only while the loop is saturated); and
  tasks whose work interleaves (one asks again while another that asked in this window
  or the three before is still running, ``Task.done()``; a task awaiting a child task
  of its own is not counted twice: the child is done before the parent asks again).
  A batched function's batch runs in a task of its own on behalf of all its callers,
  so its task says how many they were (:func:`note_callers`, once per batch).

It needs no private API but the thread an asyncio loop says runs it (``_thread_id``, as
``_engine._lifecycle.on_loop`` reads it: cheaper than asking for the running loop), so it
reads asyncio and uvloop alike; it costs one ``clock_gettime`` per window and
``asyncio.current_task(loop)`` per decision, taken only by kernels that would run on
the loop (inline, or a program in slices) and are estimated above
:data:`BUSY_INLINE_US` (the decision is never asked for smaller ones), and a set insert
and removal per request in the middleware (~0.3 µs), and one comparison per batch of a
batched function. The GIL-free time is worked out only for kernels in the
band: a single op's each time (shapes only, no numpy call), a program's once per
compiled expression, a function's once per argument shapes (its measured run).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "BUSY_ABOVE",
    "BUSY_FREE_US",
    "BUSY_INLINE_US",
    "GIL_TRANSFER_US",
    "IDLE_BELOW",
    "WINDOW_S",
    "LoopLoad",
    "Sensor",
    "enter",
    "leave",
    "loop_load",
    "net_free_us",
    "note_callers",
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
#: On a busy loop, a kernel in the band goes to the pool only if its GIL-free time (net of
#: transfers, :func:`net_free_us`) exceeds this many µs: the hop's loop cost as above, less
#: one op's dispatch (``_cost.OVERHEAD_NS``), which holds the GIL. So a single op whose
#: loop releases the GIL (``gil_free_us``: its estimate less the dispatch) decides as
#: "estimated above BUSY_INLINE_US".
BUSY_FREE_US = 33.5
#: What the loop loses (in the cost model's µs, 2-3x measured ones) each time a worker
#: takes the GIL back after a numpy loop released it, beyond the one hand-over the hop's
#: cost counts: the loop thread waits while the worker runs its next GIL-held stretch,
#: and is woken after it. Measured with 32 callers on a saturated loop, the loop's wall
#: time not spent on its CPU per call on the pool: ~17 µs for one 220x220 add (one
#: release), ~23 µs for four 110x110 adds (four), ~45 µs for a fused MLP (three, with
#: the function's Python between them) (``docs/performance.md``).
GIL_TRANSFER_US = 10.0
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
#: Tasks remembered per window for the interleaving rule (more only cost time to scan) ...
_MAX_SEEN = 8
#: ... and per turn of the loop (a count beyond it changes no decision).
_MAX_TURN = 64
#: Contention is the most callers at once over this many windows (it decays in ~20 ms),
#: and a task that asked is remembered for the window it asked in and this many more.
_KEEP_WINDOWS = 3

# The running loop, asked cheaply (``Sensor.observe``): an asyncio loop says which thread
# runs it (``_thread_id``, None while stopped; a thread runs one loop at a time), as
# ``_engine._lifecycle.on_loop`` reads it; asking for the running loop makes a getpid
# system call on Python 3.11 (``asyncio.events._get_running_loop`` too: ~0.15 µs against
# ~0.04 µs). ``current_task`` is given the loop: without it, it asks for it again.
_BaseLoop = asyncio.BaseEventLoop
_get_ident = threading.get_ident
_get_running_loop = asyncio.get_running_loop
_current_task = asyncio.current_task


@dataclass(frozen=True, slots=True)
class LoopLoad:
    """A snapshot of the busy-loop placement of the calling thread's event loop (:func:`loop_load`).

    Attributes:
        utilization: The loop thread's smoothed CPU time over wall time (0: idle, 1: it
            never waited), as of the last sample.
        busy: Whether kernels estimated above ``busy_inline_us`` go to the pool now:
            the loop is ``saturated`` and contended (``callers`` of at least 2).
        busy_inline_us: The estimate above which a busy loop sends a kernel to the pool.
        samples: Utilization windows measured.
        offloaded: Kernels sent to the pool because the loop was busy (they would
            have run inline on an idle loop).
        kept_inline: Kernels in the same band of estimates kept on the loop (inline,
            or a program in slices) because the loop was not busy.
        saturated: Whether the utilization says the loop thread never waits (above
            ``BUSY_ABOVE``, until it drops below ``IDLE_BELOW``).
        callers: The most callers on the loop at once in the current window or the
            three before (requests in flight, tasks ready in the same turn, tasks whose
            work interleaves, the callers served by one batch of a batched function):
            1 for one caller awaiting one computation after another.
            A window closes when a kernel in the band asks, 5 ms after the last at
            the earliest: without such kernels, the most since the thread began.
        requests: HTTP requests in flight on this loop now (``aiotensor.web``'s middleware).
        kept_alone: Of ``kept_inline``, the kernels kept on a saturated loop because no
            other caller contended (offloading them would only add the hop).
        busy_free_us: The GIL-free µs (net of transfers) above which a busy loop sends a
            kernel in the band to the pool.
        kept_held: Of ``kept_inline``, the kernels kept on a busy loop because they run
            mostly holding the GIL: their GIL-free µs (``free_us``) did not exceed
            ``busy_free_us``, so on the pool the loop would have waited for them.
        free_us: The GIL-free µs (net of transfers) of the last kernel a busy loop placed
            (``None`` before the first).
    """

    utilization: float = 0.0
    busy: bool = False
    busy_inline_us: float = BUSY_INLINE_US
    samples: int = 0
    offloaded: int = 0
    kept_inline: int = 0
    saturated: bool = False
    callers: int = 0
    requests: int = 0
    kept_alone: int = 0
    busy_free_us: float = BUSY_FREE_US
    kept_held: int = 0
    free_us: float | None = None


class Sensor:
    """The load of one thread's loop and the decisions taken from it (see the module docstring).

    ``cpu`` and ``wall`` are the clocks (the thread's CPU time, a monotonic clock), in seconds.
    """

    __slots__ = (
        "_cpu",
        "_cpu0",
        "_last",
        "_loop",
        "_peak",
        "_peaks",
        "_requests",
        "_seen",
        "_turn",
        "_wall",
        "_wall0",
        "callers",
        "free_us",
        "kept_alone",
        "kept_held",
        "kept_inline",
        "offloaded",
        "samples",
        "saturated",
        "utilization",
    )

    def __init__(
        self, cpu: Callable[[], float] = time.thread_time, wall: Callable[[], float] = time.perf_counter
    ) -> None:
        self._cpu = cpu
        self._wall = wall
        self._wall0 = wall()
        self._cpu0 = cpu()
        self.utilization = 0.0
        self.saturated = False
        self.samples = 0
        self.offloaded = 0
        self.kept_inline = 0
        self.kept_alone = 0
        self.kept_held = 0
        self.free_us: float | None = None  # the input of the last decision on a busy loop
        # The requests in flight (their tasks: enter/leave), the last window's peak of
        # callers, this one's.
        self._requests: set[object] = set()
        self.callers = 0
        self._peak = 0
        self._peaks: list[int] = []  # the peaks of the last _KEEP_WINDOWS windows
        # The tasks other than requests that asked in the last few windows (the
        # interleaving rule) and the last of them; the loop and the tasks observed in
        # its current turn (None: no turn is counted; else the callback that ends it is
        # queued).
        self._seen: dict[asyncio.Task[object], int] = {}  # the task: the sample count when it asked
        self._last: object = None
        self._turn: list[object] | None = None
        # The asyncio loop this thread ran last, if it was one (``observe``).
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def busy(self) -> bool:
        """Whether the loop is saturated and contended: kernels in the band go to the pool."""
        return self.saturated and (self.callers >= 2 or self._peak >= 2)

    @property
    def requests(self) -> int:
        """Requests in flight on this loop (:meth:`enter` and not :meth:`leave` yet)."""
        return len(self._requests)

    # -- callers ----------------------------------------------------------------------
    def enter(self, task: object) -> None:
        """A request, run by ``task``, begins on this loop (the web middleware): counted until :meth:`leave`."""
        requests = self._requests
        requests.add(task)
        if len(requests) > self._peak:
            self._peak = len(requests)
        if self.saturated:  # (the turn it began in: only there does observe() add to this)
            self.observe()

    def leave(self, task: object) -> None:
        """The request of ``task`` counted by :meth:`enter` ended."""
        self._requests.discard(task)

    def observe(self, running: asyncio.AbstractEventLoop | None = None) -> None:
        """Note the running task as a caller: the rules of the module docstring, into this window's peak.

        ``running``: the loop the caller knows runs on this thread now (it just checked), so
        it is not asked for again (on uvloop, a ``getpid`` system call on Python 3.11).
        """
        loop = running
        if loop is None:
            loop = self._loop
            if loop is None or loop._thread_id != _get_ident():  # type: ignore[attr-defined]
                try:
                    loop = _get_running_loop()
                except RuntimeError:  # no loop: no caller to count
                    return
                # (uvloop's loops do not say their thread: not kept, asked each time)
                self._loop = loop if isinstance(loop, _BaseLoop) else None
        task = _current_task(loop)
        if task is None:
            return
        requests = self._requests
        if task in requests:  # a request: counted as one already (not remembered here)
            n = len(requests)
        elif task is self._last:  # the same caller again
            n = len(requests) + 1
        else:
            previous = self._last
            self._last = task
            seen = self._seen
            if task in seen and previous is not None:
                # It asks again after another: every task that asked in the last few windows
                # and is still running interleaved with it (the one just before, if
                # done, was a child it awaited, or a sibling that ended).
                n = sum(1 for t in seen if not t.done())
            else:
                n = 1
                if len(seen) >= _MAX_SEEN:
                    for t in [t for t in seen if t.done()] or list(seen)[:1]:
                        del seen[t]
            seen[task] = self.samples
            n += len(requests)
        if self.saturated:  # ready together: counted only where it can matter
            turn = self._turn
            if turn is None or turn[0] is not loop:
                self._turn = turn = [loop, task]
                loop.call_soon(self._end_turn, turn)
            elif turn[-1] is not task and len(turn) <= _MAX_TURN:
                turn.append(task)  # (a task's observations in one turn are consecutive)
            if len(turn) - 1 > n:
                n = len(turn) - 1
        if n > self._peak:
            self._peak = n

    def _end_turn(self, turn: list[object]) -> None:
        if self._turn is turn:
            self._turn = None

    # -- utilization ------------------------------------------------------------------
    def sample(self) -> bool:
        """Update the utilization if a window has passed; whether the loop is busy."""
        now = self._wall()
        span = now - self._wall0
        if span < WINDOW_S:  # (the common case: ``busy`` written out, one call less)
            return self.saturated and (self.callers >= 2 or self._peak >= 2)
        cpu = self._cpu()
        used = min(1.0, max(0.0, (cpu - self._cpu0) / span))
        self._wall0, self._cpu0 = now, cpu
        self.samples += 1
        if span > _STALE_S or self.samples == 1:
            self.utilization = used
        else:
            self.utilization += _ALPHA * (used - self.utilization)
        if self.saturated:
            self.saturated = self.utilization >= IDLE_BELOW
        else:
            self.saturated = self.utilization > BUSY_ABOVE
        # A new window of callers: the requests still in flight carry over.
        peaks = self._peaks
        peaks.append(self._peak)
        if len(peaks) > _KEEP_WINDOWS:
            del peaks[0]
        self.callers = max(peaks)
        self._peak = len(self._requests)
        seen = self._seen  # (what asked stays a few windows: callers may ask less often)
        for t in [t for t, window in seen.items() if window < self.samples - _KEEP_WINDOWS or t.done()]:
            del seen[t]
        return self.busy

    # -- decisions --------------------------------------------------------------------
    def offload(self, free_us: float) -> bool:
        """Whether a kernel that would run on the loop, estimated above ``BUSY_INLINE_US``, goes to the pool.

        ``free_us``: its GIL-free µs, net of transfers (:func:`net_free_us`); it goes only
        if the loop is busy and that exceeds ``BUSY_FREE_US``.
        """
        self.observe()
        if self.sample():
            self.free_us = free_us
            if free_us > BUSY_FREE_US:
                self.offloaded += 1
                return True
            self.kept_held += 1
        elif self.saturated:
            self.kept_alone += 1
        self.kept_inline += 1
        return False

    def snapshot(self) -> LoopLoad:
        """The state as a :class:`LoopLoad`."""
        return LoopLoad(
            self.utilization,
            self.busy,
            BUSY_INLINE_US,
            self.samples,
            self.offloaded,
            self.kept_inline,
            self.saturated,
            max(self.callers, self._peak),
            self.requests,
            self.kept_alone,
            BUSY_FREE_US,
            self.kept_held,
            self.free_us,
        )


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.sensor = Sensor()


_local = _PerThread()


def sensor() -> Sensor:
    """The calling thread's sensor (a loop runs on one thread: its sensor)."""
    return _local.sensor


def net_free_us(free_us: float, releases: int) -> float:
    """The GIL-free µs of a kernel whose loops release the GIL ``releases`` times, less the hand-overs beyond the first.

    The rule's one input: ``free_us`` is the sum of its ops' ``_cost.gil_free_us``.
    """
    return free_us - GIL_TRANSFER_US * (releases - 1) if releases > 1 else free_us


def offload(est_us: float, free_us: float = math.inf) -> bool:
    """Whether a kernel estimated at ``est_us`` (within the inline threshold) goes to the pool.

    It does when it is in the band (above ``BUSY_INLINE_US``), the loop is busy, and
    ``free_us``, its GIL-free µs net of transfers (:func:`net_free_us`; unknown: ``inf``),
    exceeds ``BUSY_FREE_US``.
    """
    return est_us > BUSY_INLINE_US and _local.sensor.offload(free_us)


def stays_inline(free_us: float = math.inf, running: asyncio.AbstractEventLoop | None = None) -> bool:
    """For a kernel in the band about to run inline: True (counted as kept inline) unless it goes to the pool.

    It goes when the loop is busy and ``free_us`` (as for :func:`offload`; unknown: ``inf``)
    exceeds ``BUSY_FREE_US``; then the kernel's caller takes the path that calls
    :func:`offload`, which counts it once. ``running``: the loop the caller has just
    seen running on this thread, if it has (:meth:`Sensor.observe`).
    """
    sensor = _local.sensor
    sensor.observe(running)
    if sensor.sample():
        if free_us > BUSY_FREE_US:
            return False
        sensor.free_us = free_us
        sensor.kept_held += 1
    elif sensor.saturated:
        sensor.kept_alone += 1
    sensor.kept_inline += 1
    return True


def enter() -> None:
    """The running task begins a request on the calling thread's loop; :func:`leave` when it ends."""
    _local.sensor.enter(asyncio.current_task())


def leave() -> None:
    """The running task's request counted by :func:`enter` ended."""
    _local.sensor.leave(asyncio.current_task())


def note_callers(n: int) -> None:
    """``n`` callers were served together on the calling thread's loop (a batch's): at least ``n`` in this window.

    A batched function's batch runs in a task of its own for all its callers, so the
    rules of :meth:`Sensor.observe` see one task: its task says how many they were.
    """
    sensor = _local.sensor
    if n > sensor._peak:
        sensor._peak = n


def loop_load() -> LoopLoad:
    """How busy the calling thread's event loop is, and where that sent kernels.

    Kernels whose estimate lies between ``busy_inline_us`` and the session's
    ``inline_threshold_us`` (and expressions' programs that would run on the loop in
    slices) run on the loop unless it is busy: saturated (its thread found no time to
    wait for I/O) and contended (``callers`` of at least 2: requests in flight, tasks
    ready together or interleaving, or the callers of one batch of a batched function).
    Then the pool's thread computes them while the loop serves the others, if they run
    long enough without the GIL to pay for the hop (``free_us`` above ``busy_free_us``);
    a kernel that mostly holds the GIL would keep the loop waiting as long on the pool,
    and stays inline (``kept_held``). One caller
    awaiting one computation after another keeps its kernels inline even on a saturated
    loop (``kept_alone``): nothing else would run meanwhile. Counts are totals since the thread first asked.
    """
    return _local.sensor.snapshot()
