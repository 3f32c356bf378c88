"""Steering a woken worker off the core of the thread that woke it, for work split between the two.

A kernel split in parts (a long batch's callers, a blocked run's row blocks) wakes an
idle pool worker for the second part and computes the first itself. Linux tends to
wake a thread on the waker's core (it expects the two to share data and the waker to
sleep soon), and this one does not sleep: the woken worker then waits on that core's
run queue until the first part ends, and the parts run one after the other while the
other core idles (measured on 2 cores: a spawned part started 640-740 µs late when
woken there, 76-99 µs when woken on the other core; under wrk, the web example's
batches run in two parts took 91-103 µs a caller unsteered, 58-64 steered:
``benchmarks/trace_batches.py``). So the submitter of a spawned part narrows the woken
worker's CPUs to the process's others than its own for that job (``sched_setaffinity``
takes a thread id), and the worker widens them again when the job ends. Nothing is pinned otherwise: the
scheduler keeps placing workers wherever a core is free.

Linux only (glibc's ``sched_getcpu`` through ctypes, ~0.2 µs; the affinity calls
~1 µs each); elsewhere, or with fewer than two CPUs allowed, nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

__all__ = ["STEER", "current_cpu", "steer", "unsteer"]

#: Whether a spawned part's worker is steered off its spawner's core (False: woken as any job).
STEER = True


def _sched_getcpu() -> Callable[[], int] | None:
    if not hasattr(os, "sched_setaffinity"):  # (not Linux)
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


_getcpu = _sched_getcpu()


def current_cpu() -> int | None:
    """The CPU the calling thread runs on now, or None where that cannot be asked."""
    if _getcpu is None:
        return None
    cpu = _getcpu()
    return cpu if cpu >= 0 else None


def _allowed() -> set[int]:
    # The process's CPUs, as its main thread has them (workers narrowed for a job are not asked).
    return os.sched_getaffinity(os.getpid())


def steer(native_id: int, away_from: int) -> bool:
    """Let thread ``native_id`` run on every CPU of the process but ``away_from``; whether it was changed.

    Not changed (False) when fewer than two CPUs are allowed, or the call fails (the
    thread ended, a platform without it).
    """
    try:
        allowed = _allowed()
        if len(allowed) < 2 or away_from not in allowed:
            return False
        os.sched_setaffinity(native_id, allowed - {away_from})
    except OSError:
        return False
    return True


def unsteer() -> None:
    """Let the calling thread run on every CPU of the process again (after :func:`steer`)."""
    try:
        os.sched_setaffinity(0, _allowed())
    except OSError:  # (nothing to restore that the next steer would not set)
        pass
