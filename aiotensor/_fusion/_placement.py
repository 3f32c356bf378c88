"""Where the runs of a fused or batched function go: inline or on the pool, per argument shapes.

A function's cost is unknown until it has run, so its first call for given shapes goes
to the pool and is measured by the cost model of single ops (``_cost``); from then on
that sum decides, as for single ops. Two consecutive inline runs more than four
thresholds long (the function does work of its own between ops, which the model cannot
see) send those shapes back to the pool; one call in :data:`RETRY_INLINE_EVERY` then
runs inline again, and the shapes stay inline if it is fast (the slow runs were
contention, not the function).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["RETRY_INLINE_EVERY", "Placement"]


#: A function sent back to the pool for its shapes tries inline again once in this many calls.
RETRY_INLINE_EVERY = 64


class Placement:
    """Where the runs of one function go, per key of argument shapes (see the module docstring).

    Shared by fused and batched functions: :meth:`estimate` is the ``est_us`` to run
    with (``None`` until a run has been measured: run on the pool, and measure the run),
    :meth:`record` learns from a run.
    """

    __slots__ = ("_model", "_strikes", "_struck", "_timings")

    def __init__(self) -> None:
        self._timings: dict[tuple[Any, ...], float] = {}
        self._strikes: dict[tuple[Any, ...], int] = {}
        self._model: dict[tuple[Any, ...], float] = {}  # the cost model's µs, kept while struck
        self._struck: dict[tuple[Any, ...], int] = {}  # calls since the key was sent to the pool

    def estimate(self, key: tuple[Any, ...]) -> float | None:
        """The estimated µs of a run with these shapes (``inf``: on the pool), ``None`` before the first."""
        est = self._timings.get(key)
        if self._struck and key in self._struck:
            calls = self._struck[key] = self._struck[key] + 1
            if calls % RETRY_INLINE_EVERY == 0:
                return self._model[key]  # one run inline again: was it slow, or the machine?
        return est

    def record(self, key: tuple[Any, ...], est: float, estimate: float, elapsed: float, limit: float) -> None:
        """Learn from a run made with ``est``: the cost model's ``estimate`` of it and its ``elapsed`` µs."""
        if est > limit:
            if key not in self._timings:
                # First call for these shapes ran on the pool: from now on the cost model's
                # sum over the ops it ran decides, as for single ops.
                self._timings[key] = estimate
        elif elapsed > 4 * limit:
            # It ran inline and took far longer than the model said: a first run on this
            # thread may be cold once (BLAS warming up), but twice means the function does
            # work of its own between ops: back to the pool for these shapes. (Contention
            # can look the same: BLAS threads still spinning after a burst, the GIL; so
            # once in RETRY_INLINE_EVERY calls it runs inline again, and stays if fast.)
            strikes = self._strikes[key] = self._strikes.get(key, 0) + 1
            if strikes >= 2 and key not in self._struck:
                self._model[key] = self._timings[key]
                self._timings[key] = math.inf
                self._struck[key] = 0
        elif self._strikes:
            self._strikes.pop(key, None)  # only consecutive slow runs count (a GC pause is one)
            if key in self._struck:  # a retry ran fast: inline again
                self._timings[key] = self._model.pop(key)
                del self._struck[key]
