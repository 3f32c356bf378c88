"""A large blocked run shared with the pool's other workers, and the buffer its result goes into.

A blocked run on the pool (``_blocked_run``) whose result has :data:`SPLIT_MIN_BYTES`
or more, or :data:`SPLIT_IDLE_MIN_BYTES` or more while a core is free (:func:`core_free`),
cuts its rows into parts of whole blocks (:func:`in_parts`, about :data:`_PART_BYTES`
each) that the running worker and the pool's other workers take in turn. A split run
walks taller blocks than one thread's (:data:`SPLIT_BLOCK_ITEMS`: longer ufunc calls,
fewer GIL hand-overs between the participants); each participant makes its scratch
blocks and copies once, at its first part, and drops them with the run. The pool is
at hand only while a program runs through :func:`with_pool`, the backend's hook;
:func:`result_buffer` finds, on the loop thread, the recycled buffer the run's result
is written into.
"""

from __future__ import annotations

import contextvars
import functools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backends._chunked import Spawn, _Blocks

__all__ = [
    "IDLE_TIER",
    "SPLIT_BLOCK_ITEMS",
    "SPLIT_IDLE_MIN_BYTES",
    "SPLIT_MIN_BYTES",
    "START_WAIT_S",
    "core_free",
    "in_parts",
    "result_buffer",
    "split_pool",
    "with_pool",
]

#: Output bytes from which a blocked run on the pool shares its blocks with the other
#: workers whatever else the machine runs. Measured (``--calibrate --only-split``, split
#: time / one worker, blocks of 65,536): 1 MiB 1.07-1.15, 4 MiB 0.93-1.12, 16 MiB
#: 0.90-0.99, 32 MiB 0.80-0.91, 64 MiB 0.74-0.81; again under heavier load (4-6, first
#: quartile): 1 MiB 1.19, 4 MiB 1.09, 8 MiB 1.03, 16 MiB 1.04, 32 MiB 1.05. It pays only
#: when the other core is free. On a machine with the other core free (load ~1.4, three
#: runs): 1 MiB 1.13-1.18, 4 MiB 0.89-0.93, 8 MiB 0.74-0.81, 16 MiB 0.72, 32 MiB
#: 0.61-0.89; and the benchmark's 2048x2048 chain (16 MiB) 0.19-0.29x numpy split against
#: 0.30-0.34x not. So from 16 MiB: ~25 % faster with a free core, ~4 % slower with a busy
#: one. Below it, down to :data:`SPLIT_IDLE_MIN_BYTES`, a run splits when a core is free.
SPLIT_MIN_BYTES = 16 << 20
#: Output bytes from which a blocked run splits when a core is free at its start
#: (:func:`core_free`). Measured with the split's own blocks (``--calibrate --only-split``,
#: split / one worker, first quartile of interleaved calls, five sittings with a core
#: free): 2 MiB 0.84-1.07, 4 MiB 0.67-0.90, 8 MiB 0.57-0.90; with the other core busy
#: (other processes at 100 %, split forced, load 2-8): 2 MiB 1.01-1.21, 4 MiB 0.93-1.19,
#: 8 MiB 0.87-1.04. Awaited, with another job on the other core half the time (load
#: 1.3-1.6), the rule split 30-50 % of the runs and lost 3-12 % against never splitting
#: under 16 MiB (a snapshot is not a free core); the gain with a core free throughout
#: is measured on the kernel only. Set it to SPLIT_MIN_BYTES to turn this tier off.
SPLIT_IDLE_MIN_BYTES = 4 << 20
#: Output elements per block of a split run (one thread's runs: ``_blocked_run.BLOCK_ITEMS``).
#: Each ufunc call takes the GIL for its dispatch and releases it for its loop: with
#: blocks of 65,536 float32 a call's loop takes 2-8 µs, and a waiting thread is woken by
#: each release but finds the GIL taken back by the time it runs (see START_WAIT_S);
#: with longer loops it gets in. Measured (split / one worker, the same sittings), blocks
#: of 65,536 / 131,072 / 262,144 / 524,288 items: 4 MiB 0.80-0.92 / 0.67-0.90 / 0.67-0.90
#: / 0.70-0.92, 8 MiB 0.71-0.94 / 0.57-0.90 / 0.58-0.89 / 0.62-0.87, 16 MiB 0.69-0.78 /
#: 0.57-0.71 / 0.58-0.68 / 0.64-0.67; with the other core busy the taller the blocks the
#: more a late participant's last block holds the run (16 MiB: 0.95-1.00 at 65,536,
#: 1.00-1.17 taller), so with no core free a run splits in one thread's blocks. One
#: thread's runs keep theirs (one thread at 262,144 was no faster).
SPLIT_BLOCK_ITEMS = 262144
#: Seconds a split run waits, without the GIL, for its first spawned participant to start.
#: A spawned worker wakes on the other core in 11-30 µs (quartiles, this VM) while the
#: spawner sleeps, but while the spawner runs ufunc calls of 2-8 µs it mostly did not
#: start within 3 ms: each call's release of the GIL wakes it, and the spawner takes
#: the GIL back before it is scheduled (Python's GIL is not handed over; the waiter
#: forces a switch only after ``sys.getswitchinterval()``, 5 ms). Traced 1024x1024
#: split runs showed one thread doing every part. Measured with a free core, split /
#: one worker at 4 MiB: waiting 0.70-0.74 against 0.72-0.77 not (131,072 and 262,144
#: item blocks); wasted when the other core is busy, so only split runs in
#: tall blocks (a core free) wait.
START_WAIT_S = 0.0001
#: Output bytes per part handed to a participant of a split run.
_PART_BYTES = 4 << 20

_ndarray = np.ndarray
#: The pool a kernel running on a worker may hand blocks to: (spawn, workers); set by :class:`_WithSpawn`.
_POOL: contextvars.ContextVar[tuple[Spawn, int] | None] = contextvars.ContextVar("aiotensor_blocked_pool", default=None)
#: A recycled buffer the run that makes an array of its shape and dtype writes into (then None).
_OUT: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("aiotensor_blocked_out", default=None)
#: Whether runs under SPLIT_MIN_BYTES may split while a core is free (``_blocked_center``
#: turns it off for its run: the standardization's in-place pass over its deviations,
#: 8 MiB, read 0.67-0.78x numpy split in tall blocks against 0.62-0.68x not, awaited,
#: seven sittings on a quiet machine).
IDLE_TIER: contextvars.ContextVar[bool] = contextvars.ContextVar("aiotensor_blocked_idle_tier", default=True)


def split_pool(nbytes: int) -> tuple[tuple[Spawn, int], bool] | None:
    """How a run of ``nbytes`` of output shares its blocks: ((spawn, workers), in tall blocks), or None (one thread).

    With a core free (:func:`core_free`), from :data:`SPLIT_IDLE_MIN_BYTES`, in the split's
    tall blocks (:data:`SPLIT_BLOCK_ITEMS`); with none, from :data:`SPLIT_MIN_BYTES`, in one
    thread's blocks (a late participant's last block then holds the run less).
    """
    pool = _POOL.get()
    if pool is None or pool[1] < 2 or nbytes < min(SPLIT_IDLE_MIN_BYTES, SPLIT_MIN_BYTES):
        return None
    if nbytes < SPLIT_MIN_BYTES and not IDLE_TIER.get():
        return None
    if core_free():
        return pool, True
    return (pool, False) if nbytes >= SPLIT_MIN_BYTES else None


def core_free() -> bool:
    """Whether a core is free now: fewer threads runnable (the caller among them) than cores.

    Linux's ``/proc/loadavg`` counts the threads runnable at this instant (its fourth
    field, the caller among them), every process's; read in ~1.5 µs with the file held
    open. Where it cannot be read, False: runs then split as before this rule, from
    :data:`SPLIT_MIN_BYTES` in one thread's blocks. A split pays only when the other core is free:
    another process's work, the loop's own thread or the pool's other worker busy with
    another kernel each make the run's second participant share a core (measured: see
    :data:`SPLIT_IDLE_MIN_BYTES`).
    """
    fd = _LOADAVG[0] if _LOADAVG else _open_loadavg()
    if fd is None:
        return False
    try:
        runnable = int(os.pread(fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return runnable < _CORES


def _open_loadavg() -> int | None:
    # ``/proc/loadavg`` opened at the first split decision and held (a read is then one
    # ``pread``); None where there is none.
    with _LOADAVG_LOCK:
        if not _LOADAVG:
            fd = None
            if sys.platform.startswith("linux"):
                try:
                    fd = os.open("/proc/loadavg", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                except OSError:
                    pass
            _LOADAVG.append(fd)
        return _LOADAVG[0]


#: ``/proc/loadavg``'s descriptor once opened (None: not to be had).
_LOADAVG: list[int | None] = []
_LOADAVG_LOCK = threading.Lock()
_CORES = os.cpu_count() or 1


def in_parts(
    part: Callable[[int, int], None], rows: int, h: int, nbytes: int, pool: tuple[Spawn, int], wait: float = 0.0
) -> None:
    """Rows ``[0, rows)``: ``part(lo, hi)`` calls over whole ``h``-row blocks, shared with the pool.

    ``wait``: seconds to wait for the first spawned participant to start (:data:`START_WAIT_S`).
    """
    spawn, workers = pool
    step = max(h, h * (_PART_BYTES // max(1, nbytes // rows * h)))
    bounds = _aligned(rows, max(workers * 2, -(-rows // step)), h)
    blocks = _Blocks([functools.partial(part, lo, hi) for lo, hi in bounds])
    # The first participant to start says so; this thread waits for that (at most
    # ``wait``) without the GIL, so that the other can take it: see START_WAIT_S.
    started = threading.Lock()
    started.acquire()

    def helper() -> None:
        try:
            started.release()
        except RuntimeError:  # another participant said it first
            pass
        blocks.drain()

    spawned = 0
    for _ in range(min(workers, len(bounds)) - 1):
        try:
            spawn(helper)
            spawned += 1
        except Exception:  # no worker to be had: this thread does it all
            break
    if spawned and wait > 0:
        started.acquire(timeout=wait)
    blocks.drain()
    blocks.done.acquire()
    if blocks.failed:
        raise blocks.failed[0]


def _aligned(rows: int, parts: int, h: int) -> list[tuple[int, int]]:
    # ``parts`` row ranges covering ``rows``, each a whole number of blocks but the last.
    blocks = -(-rows // h)
    parts = max(1, min(parts, blocks))
    base, extra = divmod(blocks, parts)
    bounds = []
    lo = 0
    for i in range(parts):
        hi = min(rows, lo + (base + (1 if i < extra else 0)) * h)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class _WithSpawn:
    """A program whose blocked runs may share their blocks with the pool's workers."""

    __slots__ = ("fn", "spawn", "workers")

    def __init__(self, fn: Callable[..., Any], spawn: Spawn, workers: int) -> None:
        self.fn = fn
        self.spawn = spawn
        self.workers = workers

    def __call__(self, *args: Any, out: Any = None) -> Any:
        token = _POOL.set((self.spawn, self.workers))
        given = _OUT.set([out])
        try:
            return self.fn(*args)
        finally:
            _OUT.reset(given)
            _POOL.reset(token)

    @property
    def __name__(self) -> str:  # how backends name the task
        return str(getattr(self.fn, "__name__", "blocked"))


def result_buffer(cache: Any, bufs: tuple[Any, ...]) -> dict[str, Any]:
    """``{"out": buffer}``: a recycled buffer of the largest input's shape and dtype, or ``{}``.

    Call on the loop thread (the session's cache is confined to it) for a program with
    blocked runs going to the pool: the run whose result has exactly that shape and
    dtype (an element-wise formula over same-shaped arrays) writes into it, as a single
    op writes into the buffer ``_allocator.out_for`` finds. An unused buffer is freed.
    """
    if cache is None or not cache.cached_bytes:
        return {}
    largest = max((b for b in bufs if type(b) is _ndarray), key=lambda b: b.nbytes, default=None)
    if largest is None or largest.nbytes < cache.min_bytes:
        return {}
    found = cache.take(largest.shape, largest.dtype)
    return {} if found is None else {"out": found}


def with_pool(fn: Callable[..., Any], spawn: Spawn, workers: int) -> Callable[..., Any]:
    """``fn`` (a program with blocked runs) run with the pool's ``spawn`` at hand (the backend's hook)."""
    return _WithSpawn(fn, spawn, workers)
