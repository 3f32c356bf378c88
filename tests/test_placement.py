"""The one cost model: a program's estimate; where a fused or batched function's runs go, learnt from its runs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._cost import GIL_FREE_ABOVE, OVERHEAD_NS, PER_BYTE, estimate_us, gil_free_us
from aiotensor._engine._expressions import _is_tensor
from aiotensor._expr import Expr
from aiotensor._loopload import GIL_TRANSFER_US, net_free_us
from aiotensor._opdef import Cost
from aiotensor._programs._compile import compile_program
from aiotensor._programs._placement import RETRY_INLINE_EVERY, Placement, program_cost, program_free_us

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


# -- the cost estimate the engine compares with its inline threshold


def _program_of(e: Any) -> tuple[Any, list[Any]]:
    e._used = True
    return compile_program([e], _is_tensor, "numpy", Expr)


async def test_an_elementwise_program_costs_its_steps_bytes(s: at.AsyncEagerSession) -> None:
    # Three steps over one float32 leaf of 1000 items and numbers: each touches its
    # array arguments plus its output (at least two arrays), in the leaf's item size.
    a = await s.constant(np.ones(1000, np.float32))
    program, leaves = _program_of(((a * 2.0) + a) - 1.0)
    per_byte = PER_BYTE[Cost.MEMORY]
    arrays = 2 + 3 + 2  # a * 2.0 | (.) + a | (.) - 1.0
    want = (3 * OVERHEAD_NS + 4 * 1000 * arrays * per_byte) / 1000.0
    assert program_cost(program, leaves, 50.0) == pytest.approx(want)


async def test_a_program_with_a_product_is_costed_step_by_step(s: at.AsyncEagerSession) -> None:
    x = np.ones((8, 16), np.float32)
    w = np.ones((16, 4), np.float32)
    a, b = await s.constant(x), await s.constant(w)
    program, leaves = _program_of((a @ b) * 2.0)
    matmul = estimate_us(program.steps[0][0], (x, w), None, None)
    scaled = estimate_us(program.steps[1][0], (np.ones((8, 4)), 2.0), None, None)  # out_spec: 8-byte items
    assert program_cost(program, leaves, 1e6) == pytest.approx(matmul + scaled)


async def test_a_program_past_the_limit_or_with_no_limit_is_never_inline(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(1000, np.float32))
    program, leaves = _program_of((a @ a) * 2.0)  # step by step: the sum stops at the limit
    assert program_cost(program, leaves, 1e-3) == math.inf
    assert program_cost(program, leaves, 0.0) == math.inf  # inline_threshold_us=0: never inline


def test_a_functions_gil_free_time_is_learnt_with_its_cost() -> None:
    p = Placement()
    assert p.free_us(KEY) == math.inf  # unknown: weighed as before (the pool)
    est = p.estimate(KEY)
    p.record(KEY, math.inf if est is None else est, 40.0, 900.0, LIMIT, free=12.0)
    assert (p.estimate(KEY), p.free_us(KEY)) == (40.0, 12.0)
    assert p.free_us(OTHER) == math.inf  # per shapes


def test_gil_hand_overs_beyond_the_first_count_against_the_gil_free_time() -> None:
    assert net_free_us(30.0, 0) == 30.0
    assert net_free_us(30.0, 1) == 30.0  # one release: the hop's own hand-over
    assert net_free_us(30.0, 3) == pytest.approx(30.0 - 2 * GIL_TRANSFER_US)


async def test_an_elementwise_programs_gil_free_time_is_its_loops(s: at.AsyncEagerSession) -> None:
    # Three steps over 1000 items: each loop releases the GIL; only their dispatch holds it.
    a = await s.constant(np.ones(1000, np.float32))
    program, leaves = _program_of(((a * 2.0) + a) - 1.0)
    est = program_cost(program, leaves, 1e6)
    want = net_free_us(est - 3 * OVERHEAD_NS / 1000.0, 3)
    assert program_free_us(program, leaves, est) == pytest.approx(want)
    # At numpy's threshold or below, no step releases the GIL.
    b = await s.constant(np.ones(GIL_FREE_ABOVE, np.float32))
    program, leaves = _program_of(((b * 2.0) + b) - 1.0)
    assert program_free_us(program, leaves, program_cost(program, leaves, 1e6)) == 0.0


async def test_a_programs_gil_free_time_step_by_step_counts_only_steps_that_release(
    s: at.AsyncEagerSession,
) -> None:
    # (16, 64) @ (64, 512) releases the GIL, and so does scaling its 8192 outputs.
    x = np.ones((16, 64), np.float32)
    w = np.ones((64, 512), np.float32)
    a, b = await s.constant(x), await s.constant(w)
    program, leaves = _program_of((a @ b) * 2.0)
    d0, d1 = program.steps[0][0], program.steps[1][0]
    matmul = gil_free_us(d0, (x, w), None, estimate_us(d0, (x, w), None, None))
    h = np.ones((16, 512))  # out_spec: 8-byte items
    scaled = gil_free_us(d1, (h, 2.0), None, estimate_us(d1, (h, 2.0), None, None))
    assert matmul > 0
    assert scaled > 0
    est = program_cost(program, leaves, 1e6)
    assert program_free_us(program, leaves, est) == pytest.approx(net_free_us(matmul + scaled, 2))
