"""Scheduling priority of compute threads, so that kernels never starve the event loop.

A kernel on a pool worker, and the BLAS library's own threads it drives, compete with
the event loop thread for the cores: with every core busy in a large matrix product,
a loop that wakes for a timer or a socket waits for the scheduler to give it a core
(a 1 ms ticker measured p99 lags of 2.5-6 ms during four 2048x2048 products on 2
cores). Run at a lower priority, those threads give the core up as soon as the loop
wakes, and still get every cycle the loop does not use.

Levels (:data:`Priority`): ``"idle"`` is Linux's ``SCHED_IDLE`` (runs only when
nothing else on that core wants to), ``"low"`` is ``nice`` :data:`LOW_NICE`, an int
is that nice value (1-19), ``"normal"`` changes nothing. **The trade-off**: lowered
threads yield to *every* other thread of normal priority, other processes' included,
so on a machine kept busy by other work the kernels slow down (under ``"idle"``
they can stall for as long as that work runs). Lowering the BLAS threads also
affects BLAS calls made outside aiotensor in this process.

Linux applies ``sched_setscheduler``/``setpriority`` per thread (a thread id is a
valid pid for both); other platforms have no per-thread call in Python, and nothing
is changed there (:func:`supported`). Going back up (:func:`restore`) needs
``CAP_SYS_NICE`` or a ``RLIMIT_NICE`` that allows it; without them it fails and says so.

**BLAS threads.** OpenBLAS (numpy's wheels) starts its helper threads when it loads,
from the importing thread, so they do not inherit a worker's priority. They are the
process's threads that Python's ``threading`` did not start; :func:`lower_blas_threads`
lowers at most ``blas_threads - 1`` of them (cores - 1 without threadpoolctl), the
oldest (OpenBLAS starts them as numpy is imported). Another native library's threads
started before them would be taken for BLAS threads: a heuristic, best effort.
OpenBLAS stops them before a ``fork`` and starts new ones at the next product, from
the thread that calls it: after a fork they are lowered again
(:func:`blas_threads_stale`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Literal, NamedTuple

from ._blas import blas_threads

__all__ = [
    "LOW_NICE",
    "Priority",
    "Saved",
    "blas_threads_stale",
    "describe",
    "lower",
    "lower_blas_threads",
    "read",
    "refresh_blas_threads",
    "restore",
    "restore_blas_threads",
    "supported",
    "validate",
]

#: A pool's worker priority: ``"idle"``, ``"low"``, ``"normal"`` or a nice value 0-19.
Priority = Literal["idle", "low", "normal"] | int

#: The nice value of ``"low"``: a thread at nice 10 weighs ~1/10 of a nice-0 thread.
LOW_NICE = 10

_LEVELS = ("idle", "low", "normal")


def validate(priority: object) -> str | None:
    """Why ``priority`` is not a :data:`Priority`, or ``None`` if it is one."""
    if priority in _LEVELS and isinstance(priority, str):
        return None
    if isinstance(priority, int) and not isinstance(priority, bool) and 0 <= priority <= 19:
        return None
    return f"must be 'idle', 'low', 'normal' or a nice value 0-19, got {priority!r}"


def supported() -> bool:
    """Whether thread priorities can be changed on this platform (Linux)."""
    return sys.platform.startswith("linux") and hasattr(os, "sched_setscheduler")


class Saved(NamedTuple):
    """A thread's scheduling before :func:`lower` changed it."""

    policy: int
    nice: int


def read(tid: int = 0) -> Saved:
    """The scheduling policy and nice value of thread ``tid`` (0: the calling thread; Linux only)."""
    tid = tid or threading.get_native_id()
    return Saved(os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))


def _nice_of(priority: Priority) -> int:
    if priority == "low":
        return LOW_NICE
    return priority if isinstance(priority, int) else 0


def lower(priority: Priority, tid: int = 0) -> Saved | None:
    """Lower thread ``tid`` (0: the calling thread) to ``priority``; what it had, or ``None`` if unchanged.

    Never raises: a platform or a thread that refuses keeps its priority (a thread
    that exited meanwhile is skipped). A nice value below the thread's own is left as
    it is (lowering never raises a priority).
    """
    if priority == "normal" or not supported():
        return None
    tid = tid or threading.get_native_id()
    try:
        saved = read(tid)
        if priority == "idle":
            if saved.policy == os.SCHED_IDLE:
                return None
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            nice = _nice_of(priority)
            if saved.nice >= nice:
                return None
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError:
        return None
    return saved


def restore(saved: Saved | None, tid: int = 0) -> bool:
    """Give thread ``tid`` (0: the calling thread) back what :func:`lower` saved; False if refused.

    Raising a priority needs ``CAP_SYS_NICE`` or a ``RLIMIT_NICE`` allowing it.
    """
    if saved is None:
        return True
    tid = tid or threading.get_native_id()
    try:
        if os.sched_getscheduler(tid) != saved.policy:
            os.sched_setscheduler(tid, saved.policy, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, saved.nice)
    except OSError:
        return False
    return True


def describe(priority: Priority) -> str:
    """``priority`` as the system calls it (for ``aiotensor info``)."""
    if priority == "normal" or priority == 0:
        return "normal (unchanged)"
    what = "SCHED_IDLE" if priority == "idle" else f"nice {_nice_of(priority)}"
    if not supported():
        return f"{priority} ({what}: not supported on {sys.platform}, unchanged)"
    return f"{priority} ({what} for pool workers and BLAS threads)"


# -- BLAS helper threads: process-wide, lowered while any lowered pool lives ------------------
_blas_lock = threading.Lock()
_blas_saved: dict[int, Saved | None] = {}  # tid -> what it had
_blas_users = 0
_blas_priority: Priority = "normal"
_stale = False


def _blas_helpers() -> list[int]:
    # Without threadpoolctl the count is unknown: every core, as the BLAS gate assumes.
    count = (blas_threads() or os.cpu_count() or 1) - 1
    if count <= 0:
        return []
    python = {t.native_id for t in threading.enumerate()}
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return []
    return [t for t in tids if t not in python][:count]


def lower_blas_threads(priority: Priority) -> None:
    """Lower the BLAS helper threads to ``priority`` for a pool that starts (balanced by :func:`restore_blas_threads`).

    The first caller's priority is kept until the last one has restored.
    """
    global _blas_users, _blas_priority, _stale
    if priority == "normal" or not supported():
        return
    with _blas_lock:
        _blas_users += 1
        if _blas_users == 1:
            _blas_priority = priority
            _stale = True
    refresh_blas_threads()


def blas_threads_stale() -> bool:
    """Whether the BLAS helper threads must be lowered again (new ones since a fork) for a lowered pool."""
    return _stale and _blas_users > 0


def refresh_blas_threads() -> None:
    """Lower the BLAS helper threads not lowered yet (all at first, new ones after a fork), if a pool wants them."""
    global _stale
    with _blas_lock:
        if not _stale or not _blas_users:
            return
        _stale = False
        for tid in _blas_helpers():
            if tid not in _blas_saved:
                _blas_saved[tid] = lower(_blas_priority, tid)


def restore_blas_threads() -> None:
    """A lowered pool stopped: when it was the last, give the BLAS helper threads their priority back."""
    global _blas_users
    with _blas_lock:
        if _blas_users == 0:
            return
        _blas_users -= 1
        if _blas_users:
            return
        for tid, saved in _blas_saved.items():
            with contextlib.suppress(OSError):  # a helper that exited meanwhile
                restore(saved, tid)
        _blas_saved.clear()


def _after_fork_in_parent() -> None:
    # OpenBLAS stops its helpers before a fork and starts new ones (new tids) later.
    global _stale
    _blas_saved.clear()
    _stale = True


def _after_fork_in_child() -> None:
    # The child's pools start over (see _pool): they lower the helpers again as they start.
    global _blas_lock, _blas_users, _stale
    _blas_lock = threading.Lock()
    _blas_saved.clear()
    _blas_users = 0
    _stale = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
