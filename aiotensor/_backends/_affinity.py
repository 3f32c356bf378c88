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
takes a thread id), and the worker puts back the CPUs it had when the job ends. Nothing is pinned otherwise:
the scheduler keeps placing workers wherever a core is free. A thread the steered job
starts inherits its narrowed CPUs, as on Linux every new thread does its creator's (a
pool worker started then is given the ones its creator had before: ``_pool``).

Linux only (``sched_getcpu`` through ctypes, called holding the GIL, ~0.2 µs; the
affinity calls ~1 µs each); elsewhere, or with fewer than two CPUs allowed, nothing is
done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

__all__ = ["STEER", "can_steer", "current_cpu", "restore", "steer"]

#: Whether a spawned part's worker is steered off its spawner's core (False: woken as any job).
STEER = True

_LINUX = sys.platform.startswith("linux")  # (elsewhere sched_setaffinity, where it exists, takes process ids)


def _sched_getcpu() -> Callable[[], int] | None:
    if not _LINUX:
        return None
    try:
        # PyDLL: called holding the GIL. Through CDLL the call gives the GIL up and must
        # take it back: behind a loop running Python, up to a switch interval (5 ms) in
        # the middle of waking the worker.
        fn = ctypes.PyDLL(ctypes.util.find_library("c") or None).sched_getcpu
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


def can_steer() -> bool:
    """Whether :func:`steer` can do anything here: Linux, :data:`STEER` on, two CPUs or more allowed."""
    return STEER and _getcpu is not None and len(os.sched_getaffinity(0)) >= 2


def steer(native_id: int, away_from: int) -> set[int] | None:
    """Take CPU ``away_from`` from thread ``native_id``'s; the CPUs it had, for :func:`restore`, or None.

    None (nothing changed) when the thread has fewer than two CPUs or not that one, or
    the calls fail (no such thread, a platform without them). Never raises.
    """
    try:
        had = os.sched_getaffinity(native_id)
        if len(had) < 2 or away_from not in had:
            return None
        os.sched_setaffinity(native_id, had - {away_from})
    except (OSError, ValueError, AttributeError):
        return None
    return had


def restore(cpus: set[int]) -> None:
    """Let the calling thread run on ``cpus`` again (what :func:`steer` returned for it)."""
    try:
        os.sched_setaffinity(0, cpus)
    except (OSError, ValueError):  # (a CPU taken from the process meanwhile: the kernel refuses the set)
        pass
