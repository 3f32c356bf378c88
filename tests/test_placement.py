"""Placement: where a fused or batched function's runs go, per argument shapes, from what earlier runs showed."""

from __future__ import annotations

import math

from aiotensor._placement import RETRY_INLINE_EVERY, Placement

LIMIT = 50.0  # the session's inline threshold (µs)
KEY = (((16, 64), "float32"),)
OTHER = (((32, 64), "float32"),)


def _run(p: Placement, key: tuple[object, ...], elapsed: float, estimate: float = 10.0) -> float:
    # One call as FusedFunction.__call__ makes it: ask, run (on the pool when est is None
    # or above the limit), tell.
    est = p.estimate(key)
    est = math.inf if est is None else est
    p.record(key, est, estimate, elapsed, LIMIT)
    return est


def test_the_first_run_of_a_shape_goes_to_the_pool_and_its_cost_model_sum_decides_after() -> None:
    p = Placement()
    assert p.estimate(KEY) is None  # unknown: the pool, measured
    _run(p, KEY, elapsed=900.0, estimate=12.5)  # the hop's wall time is no guide
    assert p.estimate(KEY) == 12.5
    assert p.estimate(OTHER) is None  # per shapes


def test_a_shape_estimated_above_the_threshold_stays_on_the_pool() -> None:
    p = Placement()
    _run(p, KEY, elapsed=80.0, estimate=400.0)
    for _ in range(5):
        assert _run(p, KEY, elapsed=80.0, estimate=400.0) == 400.0  # above LIMIT: the pool
    assert p.estimate(KEY) == 400.0


def test_two_consecutive_slow_inline_runs_send_the_shape_to_the_pool() -> None:
    p = Placement()
    _run(p, KEY, elapsed=900.0)
    _run(p, KEY, elapsed=5 * LIMIT)  # one slow run (cold caches, a GC pause): still inline
    assert p.estimate(KEY) == 10.0
    _run(p, KEY, elapsed=5 * LIMIT)  # the second in a row
    assert p.estimate(KEY) == math.inf


def test_a_fast_run_between_two_slow_ones_resets_the_count() -> None:
    p = Placement()
    _run(p, KEY, elapsed=900.0)
    for _ in range(3):
        _run(p, KEY, elapsed=5 * LIMIT)
        _run(p, KEY, elapsed=1.0)
    assert p.estimate(KEY) == 10.0


def _struck() -> Placement:
    # A shape measured once, then sent to the pool by two slow inline runs in a row.
    p = Placement()
    _run(p, KEY, elapsed=900.0)
    _run(p, KEY, elapsed=5 * LIMIT)
    _run(p, KEY, elapsed=5 * LIMIT)
    return p


def test_a_shape_sent_to_the_pool_retries_inline_once_in_a_while_and_stays_if_fast() -> None:
    p = _struck()
    ests = [_run(p, KEY, elapsed=80.0) for _ in range(RETRY_INLINE_EVERY - 1)]
    assert ests == [math.inf] * (RETRY_INLINE_EVERY - 1)  # on the pool meanwhile
    assert _run(p, KEY, elapsed=1.0) == 10.0  # the retry runs inline, and is fast
    assert p.estimate(KEY) == 10.0  # inline again from now on
    assert p.estimate(KEY) == 10.0


def test_a_slow_retry_keeps_the_shape_on_the_pool() -> None:
    p = _struck()
    for _ in range(3):
        for _ in range(RETRY_INLINE_EVERY - 1):
            assert _run(p, KEY, elapsed=80.0) == math.inf
        assert _run(p, KEY, elapsed=5 * LIMIT) == 10.0  # the retry: inline, and slow again
    assert p.estimate(KEY) == math.inf
