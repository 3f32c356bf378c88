"""A large batch's rows run in two parts on two workers at once, while a core is free.

A batch is row-independent by contract (its callers' rows are stacked along axis 0 and
split back per caller), so its kernel (:class:`~aiotensor._fusion._batch_kernel.BatchKernel`)
can run its callers in two groups: each part stacks its callers' rows, runs ``fn`` on
them with :class:`~aiotensor._fusion._fused_ops.FusedOps` of its own (its thread's
recycled buffers, a budget of its own summed into the batch's) and splits its outputs
per caller. The running worker takes one part, a spawned pool worker the other
(``_programs._blocked_split.in_parts``: the blocked runs' row parts). With single-threaded
BLAS a matrix product releases the GIL, so the two parts compute at once.

When (:func:`plan`): the batch's last one-part run took :data:`SPLIT_MIN_US` or more
(one part in :data:`REFRESH_EVERY` measures it again), it runs on a pool worker, outside
any ``memory_limit``, BLAS products are single-threaded (a gate slot per core), another
worker is idle and a core is free (``_blocked_split.core_free``); otherwise one part, as before.

Where: at a caller boundary whose row count is a multiple of the row multiple BLAS needs
(:func:`row_multiple`): a BLAS product tiles its rows, and a row's value depends on the
tile that computed it (measured: OpenBLAS's float32 product on this machine gives a row
subset the rows of the whole product only when the subset starts at a multiple of 12
rows, float64 of 2). The multiple is probed once per dtype (with single-threaded BLAS, the
only kind a batch splits under: a multi-threaded product divides its rows by its
threads), so each caller's rows are the unsplit batch's, bit for bit, as far as the
probe sees the BLAS.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._backends._blas import Gated, gate_slots
from .._backends._pool import WorkerPool
from .._programs._blocked_split import core_free, in_parts

if TYPE_CHECKING:
    from .._backends._chunked import Spawn
    from .._engine._core import Engine
    from .._programs._interpreter import Budget
    from .._types import NDArray

__all__ = [
    "REFRESH_EVERY",
    "ROW_MULTIPLES",
    "SPLIT_MIN_US",
    "cut_at",
    "dtypes_of",
    "in_two",
    "plan",
    "pool_for",
    "row_multiple",
    "settings",
]

#: µs of a batch's one-part kernel from which it runs in two parts while a core is free.
#: A spawned part must start first: on this 2-core VM the pool's other worker started
#: 76-99 µs (quartiles to p90) after the spawn when woken on the other core, and 640-740
#: µs when the scheduler woke it on the spawner's core (it then waits for the running
#: part to end: one part in effect, plus the cost of the second). Measured, the MLP
#: 64 -> 512 -> 10 in float32 with BLAS threads 1, 32 clients, requests/s two parts /
#: one part in the same process (rows per batch: one-part kernel): 512 rows (~550 µs)
#: 0.75-0.92 and 1.04-1.10 in the two scheduler states; 1,024 rows (~1.1 ms) 1.01 and
#: 1.29; 2,048 rows 1.40 / 1.41; 4,096 rows 1.28 / 1.48. So from ~1 ms: where the worst
#: start breaks even.
SPLIT_MIN_US = 1000.0
#: A batch that splits runs in one part once in this many eligible runs: its one-part
#: time, which :data:`SPLIT_MIN_US` is weighed against, measured again.
REFRESH_EVERY = 64
#: Candidate row multiples of a cut, smallest first: the first the BLAS probe accepts for
#: a dtype (:func:`row_multiple`) is used.
ROW_MULTIPLES = (48, 96, 192)
#: A cut more than this share of the rows away from the middle is not made (one part).
_MAX_SKEW = 0.25

_get_ident = threading.get_ident
_CORES = os.cpu_count() or 1
#: Per dtype: the row multiple a cut must fall on (None: no candidate passed the probe).
_MULTIPLES: dict[np.dtype[Any], int | None] = {}
_PROBE_SHAPES = ((64, 48), (320, 10))  # (inner, columns) of the probe's products


def row_multiple(dtypes: list[np.dtype[Any]]) -> int | None:
    """The rows a cut must be a multiple of for products in these dtypes to keep every row's bits; None: no cut.

    Integer and other non-BLAS dtypes need none (numpy's own loops are row by row).
    """
    found = 1
    for dt in dtypes:
        if dt.kind not in "fc":
            continue
        m = _MULTIPLES.get(dt, 0)
        if m == 0:
            m = _MULTIPLES[dt] = _probe(dt)
        if m is None:
            return None
        found = max(found, m)  # (candidates are multiples of each other)
    return found


def _probe(dt: np.dtype[Any]) -> int | None:
    # The first candidate multiple at which every cut of the probe's products (with and
    # without a tail of rows) gives the whole product's rows exactly.
    rng = np.random.default_rng(0)
    for m in ROW_MULTIPLES:
        ok = True
        for inner, cols in _PROBE_SHAPES:
            w = rng.standard_normal((inner, cols)).astype(dt)
            for rows in (4 * m, 4 * m + 7):
                x = rng.standard_normal((rows, inner)).astype(dt)
                whole = x @ w
                for cut in (m, 2 * m, 3 * m):
                    if not (np.array_equal(x[:cut] @ w, whole[:cut]) and np.array_equal(x[cut:] @ w, whole[cut:])):
                        ok = False
                        break
                if not ok:
                    break
            if not ok:
                break
        if ok:
            return m
    return None


def cut_at(counts: list[int], multiple: int) -> int | None:
    """The caller index to cut ``counts`` at (rows before it a multiple of ``multiple``, nearest the middle); None."""
    rows = sum(counts)
    half = rows / 2
    best, best_off = None, rows * _MAX_SKEW
    acc = 0
    for i, n in enumerate(counts[:-1], 1):
        acc += n
        if acc % multiple == 0:
            off = abs(acc - half)
            if off <= best_off:
                best, best_off = i, off
        if acc > half + best_off:
            break
    return best


def pool_for(engine: Engine) -> tuple[Spawn, int] | None:
    """The pool a part may be spawned on, if a worker and a core are free now; else None."""
    executor = getattr(engine.backend, "executor", None)  # (aiotensor's own pool: it can spawn)
    if type(executor) is not WorkerPool or executor.max_workers < 2 or executor.idle_workers() < 1:
        return None
    if not core_free():
        return None
    return executor.spawn, 2


def plan(counts: list[int], dtypes: list[np.dtype[Any]], engine: Engine, blas: bool) -> tuple[int, Spawn] | None:
    """(the caller index to cut at, how to spawn the second part), or None: one part.

    Call on the worker running the batch, for a batch whose one-part time passed
    :data:`SPLIT_MIN_US`.
    """
    if blas and gate_slots() < _CORES:
        # Multi-threaded BLAS: a product has cores of its own already, and splits its
        # rows among its threads by their count (a subset's rows then differ in bits).
        return None
    multiple = row_multiple(dtypes)
    if multiple is None:
        return None
    cut = cut_at(counts, multiple)
    if cut is None:
        return None
    pool = pool_for(engine)
    if pool is None:
        return None
    spawn = pool[0]
    if blas:
        return cut, lambda job: spawn(Gated(job))  # the spawned part holds a gate slot as the running one does
    return cut, spawn


def in_two(
    part: Callable[[int, int, Budget], Any],
    rows: int,
    cut: int,
    ncallers: int,
    spawn: Spawn,
    budget: Budget,
) -> list[Any]:
    """``[part(0, cut, b0), part(cut, ncallers, b1)]`` run at once by this thread and a spawned worker.

    Each part gets a budget of its own (``budget``'s limit: none, as :func:`plan` wants),
    summed into ``budget`` when both are done: counts and live bytes added, the peak
    the batch's live bytes plus both parts' peaks (they may peak at once). An error of
    either part is raised once both have stopped (the other stops at its next part).
    """
    budgets = [_child(budget), _child(budget)]
    got: list[Any] = [None, None]
    bounds = ((0, cut), (cut, ncallers))

    def run(lo: int, hi: int) -> None:
        del hi
        got[lo] = part(*bounds[lo], budgets[lo])

    try:
        # No start wait (``_blocked_split.START_WAIT_S``): waiting for the spawned part, at
        # 512 rows, read 0.72-0.81x the hand-written batcher against 0.72-0.79x not; a
        # worker woken on this core starts only when this one sleeps either way.
        in_parts(run, 2, 1, rows, (spawn, 2))
    finally:
        b0, b1 = budgets
        budget.count += b0.count + b1.count
        budget.escaped += b0.escaped + b1.escaped
        budget.peak = max(budget.peak, budget.live + b0.peak + b1.peak)
        budget.live += b0.live + b1.live
    return got


def _child(budget: Budget) -> Budget:
    b = type(budget)(budget.where)
    b.limit = budget.limit
    return b


def settings() -> dict[str, Any]:
    """The constants of the rule, for ``aiotensor info``."""
    return {"min_us": SPLIT_MIN_US, "refresh_every": REFRESH_EVERY, "row_multiples": list(ROW_MULTIPLES)}


_ndarray = np.ndarray


def dtypes_of(x0: NDArray, params: tuple[Any, ...]) -> list[np.dtype[Any]]:
    """The dtypes a batch's products may run in: its rows' and its array params'."""
    found = [x0.dtype]
    for p in params:
        if type(p) is _ndarray and p.dtype not in found:
            found.append(p.dtype)
    return found
