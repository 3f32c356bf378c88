"""A large blocked run shared with the pool's other workers, and the buffer its result goes into.

A blocked run on the pool (``_blocked_run``) whose result has :data:`SPLIT_MIN_BYTES`
or more cuts its rows into parts of whole blocks (:func:`in_parts`, about
:data:`_PART_BYTES` each) that the running worker and the pool's other workers take
in turn, each with scratch blocks of its own. The pool is at hand only while a program
runs through :func:`with_pool`, the backend's hook; :func:`result_buffer` finds, on
the loop thread, the recycled buffer the run's result is written into.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backends._chunked import Spawn, _Blocks

__all__ = ["SPLIT_MIN_BYTES", "in_parts", "result_buffer", "split_pool", "with_pool"]

#: Output bytes from which a blocked run on the pool shares its blocks with the other
#: workers. Measured (``--calibrate --only-split``, split time / one worker, blocks):
#: 1 MiB 1.07-1.15, 4 MiB 0.93-1.12, 16 MiB 0.90-0.99, 32 MiB 0.80-0.91, 64 MiB 0.74-0.81;
#: again under heavier load (4-6, first quartile): 1 MiB 1.19, 4 MiB 1.09, 8 MiB 1.03,
#: 16 MiB 1.04, 32 MiB 1.05. It pays only when the other core is free. On a machine with
#: the other core free (load ~1.4, three runs): 1 MiB 1.13-1.18, 4 MiB 0.89-0.93, 8 MiB
#: 0.74-0.81, 16 MiB 0.72, 32 MiB 0.61-0.89; and the benchmark's 2048x2048 chain (16 MiB)
#: 0.19-0.29x numpy split against 0.30-0.34x not, while (4096, 512) results (8 MiB) split
#: read 0.67-0.75x against 0.62-0.66x. So from 16 MiB: ~25 % faster with a free core,
#: ~4 % slower with a busy one.
SPLIT_MIN_BYTES = 16 << 20
#: Output bytes per part handed to a participant of a split run.
_PART_BYTES = 4 << 20

_ndarray = np.ndarray
#: The pool a kernel running on a worker may hand blocks to: (spawn, workers); set by :class:`_WithSpawn`.
_POOL: contextvars.ContextVar[tuple[Spawn, int] | None] = contextvars.ContextVar("aiotensor_blocked_pool", default=None)
#: A recycled buffer the run that makes an array of its shape and dtype writes into (then None).
_OUT: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("aiotensor_blocked_out", default=None)


def split_pool(nbytes: int) -> tuple[Spawn, int] | None:
    """The pool (spawn, workers) a run of ``nbytes`` of output shares its blocks with, or None (one thread)."""
    pool = _POOL.get()
    if pool is None or pool[1] < 2 or nbytes < SPLIT_MIN_BYTES:
        return None
    return pool


def in_parts(part: Callable[[int, int], None], rows: int, h: int, nbytes: int, pool: tuple[Spawn, int]) -> None:
    """Rows ``[0, rows)``: ``part(lo, hi)`` calls over whole ``h``-row blocks, shared with the pool."""
    spawn, workers = pool
    step = max(h, h * (_PART_BYTES // max(1, nbytes // rows * h)))
    bounds = _aligned(rows, max(workers * 2, -(-rows // step)), h)
    blocks = _Blocks([functools.partial(part, lo, hi) for lo, hi in bounds])
    for _ in range(min(workers, len(bounds)) - 1):
        try:
            spawn(blocks.drain)
        except Exception:  # no worker to be had: this thread does it all
            break
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
