"""Inline vs pool dispatch: which ops skip the thread hop, the always-pool switch, fairness, cleanup."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._cost import (
    DEFAULT_INLINE_US,
    GIL_FREE_ABOVE,
    HOLD_PER_OP_S,
    HOLD_THRESHOLDS,
    OVERHEAD_NS,
    estimate_us,
    gil_free_us,
)
from aiotensor._opdef import OPS
from aiotensor.testing import RecordingBackend


async def test_small_op_runs_inline_and_big_op_on_the_pool() -> None:
    backend = RecordingBackend()
    async with at.AsyncEagerSession(backend=backend) as s:
        a = np.arange(16, dtype=np.float32)
        x = await s.constant(a)
        y = await s.add(x, x)
        np.testing.assert_array_equal(await y.numpy(), a + a)
        assert backend.threads == []  # neither the constant nor the add hopped

        big = np.ones(1 << 21)  # 16 MiB: far above 50 µs of work
        b = await s.constant(big)
        z = await s.add(b, b)
        np.testing.assert_array_equal(await z.numpy(), big + big)
        assert len(backend.threads) == 2  # the constant and the add
        assert all(name.startswith("aiotensor") for name in backend.threads)
        assert threading.current_thread().name not in backend.threads


async def test_always_pool_switch_sends_every_kernel_to_the_pool() -> None:
    backend = RecordingBackend()
    config = at.SessionConfig(inline_threshold_us=0)
    async with at.AsyncEagerSession(backend=backend, config=config) as s:
        x = await s.constant([1.0, 2.0])
        y = await s.add(x, 1.0)
        np.testing.assert_array_equal(await y.numpy(), [2.0, 3.0])
    assert len(backend.threads) == 2


async def test_apply_and_unknown_costs_always_go_to_the_pool(s: at.AsyncEagerSession) -> None:
    def where(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.full(x.shape, threading.current_thread().name.startswith("aiotensor"))

    t = await s.apply(where, np.zeros(2))
    assert isinstance(t, at.Tensor)
    np.testing.assert_array_equal(await t.numpy(), [True, True])


async def test_an_explicit_executor_gets_every_kernel() -> None:
    submitted: list[object] = []

    class Counting(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
            submitted.append(fn)
            return super().submit(fn, *args, **kwargs)

    with Counting(1) as pool:
        async with at.AsyncEagerSession(executor=pool) as s:
            x = await s.constant([1.0])
            await s.add(x, x)
    assert len(submitted) == 2


def _ops_to_yield(seconds_per_kernel: float) -> int:
    """How many inline ops of kernels this long fit in the hold budget before one yields."""
    return math.ceil(HOLD_THRESHOLDS * DEFAULT_INLINE_US / 1e6 / (seconds_per_kernel + HOLD_PER_OP_S))


async def _ops_before_other_task_runs(s: at.AsyncEagerSession, most: int) -> int | None:
    # A run of inline adds with no await of our own that suspends; how many ran before
    # another task got the loop (None: it never did).
    ran = asyncio.Event()

    async def other() -> None:
        ran.set()

    task = asyncio.get_running_loop().create_task(other())
    x = await s.constant([0.0])
    ops = None
    for i in range(most):
        x = await s.add(x, 1.0)
        if ran.is_set():
            ops = i + 1
            break
    await task
    np.testing.assert_array_equal(await x.numpy(), [float(ops or most)])
    return ops


async def test_a_run_of_inline_ops_lets_other_tasks_run(s: at.AsyncEagerSession) -> None:
    # Each op counts at least HOLD_PER_OP_S, so this many ops spend the budget whatever
    # the machine's speed.
    most = _ops_to_yield(0.0) + 2
    ops = await _ops_before_other_task_runs(s, most)
    assert ops is not None


class _FakeClock:
    """Stands in for the engine's clock: every reading is ``step`` seconds after the last."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.mark.parametrize("kernel_us", [1.5, 100.0])  # (off the boundaries: no rounding at stake)
async def test_a_run_of_inline_ops_yields_once_it_has_held_the_loop_for_the_budget(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, kernel_us: float
) -> None:
    # Measured in time, not counted in ops: small kernels run many more ops in a row
    # than kernels that take twice the inline threshold each.
    clock = _FakeClock(kernel_us / 1e6)
    for module in ("_core", "_lean", "_call"):  # the engine's modules that time kernels
        monkeypatch.setattr(f"aiotensor._engine.{module}._clock", clock)
    expected = _ops_to_yield(kernel_us / 1e6)
    ops = await _ops_before_other_task_runs(s, expected + 10)
    # The constant is the run's first inline op, and the add after the budget is spent
    # yields before it runs: the other task runs during add number `expected`.
    assert ops == expected
    assert (ops > 100) is (kernel_us < 2)


async def test_inline_ops_keep_each_strategy_contract(strategy: at.ResourceCleanupStrategy) -> None:
    size = 1000
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        x = await s.zeros(size, dtype="float32")
        for i in range(40):
            x = await s.add(x, 1.0)  # inline: the previous x is dropped here
            stats = s.stats()
            if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
                assert stats.freed == 0
                assert stats.live_tensors == i + 2
            elif strategy is at.ResourceCleanupStrategy.ON_SAFE_POINTS:
                assert stats.pending <= 1  # the last drop waits for the next safe point
            else:
                assert stats.pending <= 1  # drained by the next inline op
        stats = s.stats()
        if strategy is not at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
            assert stats.peak_bytes <= 3 * size * 4  # never more than input, output and one pending
        np.testing.assert_array_equal(await x.numpy(), np.full(size, 40, np.float32))
    assert s.stats().live_bytes == 0


def test_cost_estimates() -> None:
    small = np.ones(16, np.float32)
    big = np.ones(1 << 20, np.float32)
    assert estimate_us(OPS["add"], (small, small), {}, None) < 5
    assert estimate_us(OPS["add"], (big, big), {}, None) > 50
    assert estimate_us(OPS["exp"], (small,), {}, None) < estimate_us(OPS["exp"], (np.ones(4096, np.float32),), {}, None)
    # an outer sum: the output (1M elements) is what costs, not the inputs
    col, row = np.ones((1024, 1)), np.ones((1, 1024))
    assert estimate_us(OPS["add"], (col, row), {}, None) > 50
    m64, m512 = np.ones((64, 64), np.float32), np.ones((512, 512), np.float32)
    assert estimate_us(OPS["matmul"], (m64, m64), {}, None) < 50 < estimate_us(OPS["matmul"], (m512, m512), {}, None)
    assert estimate_us(OPS["zeros"], ((4,), 0, np.dtype("f8")), {}, 32) < 5
    # an op of unknown cost (a user kernel) is never inlined
    assert math.isinf(estimate_us(OPS["apply"], (np.add, small), {}, None))
    assert math.isinf(estimate_us(OPS["constant"], ([[1.0] * 4] * 4, None), {}, None))  # nested python data


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "5"])
def test_config_rejects_bad_thresholds(bad: object) -> None:
    with pytest.raises(at.InvalidArgumentError, match="inline_threshold_us"):
        at.SessionConfig(inline_threshold_us=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("op", ["floor_divide", "remainder"])
def test_float_floor_division_is_estimated_at_its_own_speed(op: str) -> None:
    # ~11 ns an element on floats (numpy's loop for them is not vectorized): three
    # times what transcendental math is estimated at, so such an op of 4 K float32
    # elements, ~45 µs of work, is not estimated within a 40 µs threshold.
    a = np.ones(1 << 12, np.float32)
    est = estimate_us(OPS[op], (a, a), None, None)
    assert est > 45.0
    assert est > 3 * estimate_us(OPS["exp"], (a, a), None, None)


async def test_a_float_floor_division_expression_is_not_run_in_slices() -> None:
    # A program's estimate counts the op's cost: two floor divisions on 16 K float32
    # (~360 µs) go to the pool, not to the loop in slices.
    backend = RecordingBackend()
    async with at.AsyncEagerSession(backend=backend) as s:
        a = await s.constant(np.full(1 << 14, 7.0, np.float32))
        got = await ((a // 2.0) % 3.0).eval()
        np.testing.assert_array_equal(got, (np.full(1 << 14, 7.0, np.float32) // 2.0) % 3.0)
        assert len(backend.submitted) == 1
        del a


@pytest.mark.parametrize(
    ("a", "b"),
    [((16, 32), (32,)), ((32,), (16, 32)), ((16, 1), (1, 32)), ((4, 16, 32), (16, 32)), ((16, 32), (3,))],
)
def test_broadcasting_operands_are_estimated_as_the_general_path_does(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    from aiotensor._cost import Spec

    add = OPS["add"]
    x, y = np.ones(a, np.float32), np.ones(b)
    # The general path (Spec operands skip the array-only hot path), then the hot path twice (cached).
    general = estimate_us(add, (Spec(a, 4), Spec(b, 8)), None, None)
    assert estimate_us(add, (x, y), None, None) == general
    assert estimate_us(add, (x, y), None, None) == general


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((16, 32), (32, 4)),
        ((32,), (32, 4)),
        ((16, 32), (32,)),
        ((5,), (5,)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((3, 4), (7, 4, 2)),
    ],
)
def test_products_of_two_arrays_are_estimated_as_the_general_path_does(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    from aiotensor._cost import Spec

    matmul = OPS["matmul"]
    x, y = np.ones(a, np.float32), np.ones(b, np.float32)
    # The general path (Spec operands skip the two-array hot path), then the hot path twice (cached).
    general = estimate_us(matmul, (Spec(a, 4), Spec(b, 4)), None, None)
    assert estimate_us(matmul, (x, y), None, None) == general
    assert estimate_us(matmul, [x, y], None, None) == general


def _free(op: str, *args: Any, kwargs: dict[str, Any] | None = None) -> tuple[float, float]:
    d = OPS[op]
    est = estimate_us(d, args, kwargs, None)
    return est, gil_free_us(d, args, kwargs, est)


def test_an_elementwise_op_runs_without_the_gil_above_numpys_threshold() -> None:
    # numpy releases the GIL in a loop over more than GIL_FREE_ABOVE elements: then all of
    # the estimate but the dispatch runs without it; at or below, none does.
    small, large = np.ones(GIL_FREE_ABOVE), np.ones(GIL_FREE_ABOVE + 1)
    assert _free("add", small, small)[1] == 0.0
    est, free = _free("add", large, large)
    assert free == pytest.approx(est - OVERHEAD_NS / 1000.0)
    # Broadcasting: the loop runs over the output (a column against a row).
    est, free = _free("add", np.ones((40, 1)), np.ones(40))
    assert free == pytest.approx(est - OVERHEAD_NS / 1000.0)
    # A reduction's loop runs over its input.
    assert _free("sum", large)[1] > 0.0


def test_a_product_runs_without_the_gil_when_its_output_is_large() -> None:
    # numpy's matmul counts its output's elements: (16, 512) @ (512, 10) holds the GIL
    # throughout, though its inputs are large; (16, 64) @ (64, 512) releases it.
    h, w2 = np.ones((16, 512), np.float32), np.ones((512, 10), np.float32)
    assert _free("matmul", h, w2)[1] == 0.0
    x, w1 = np.ones((16, 64), np.float32), np.ones((64, 512), np.float32)
    est, free = _free("matmul", x, w1)
    assert free == pytest.approx(est - OVERHEAD_NS / 1000.0)


def test_an_unbounded_estimate_stays_unbounded_without_the_gil() -> None:
    d = OPS["apply"]
    assert gil_free_us(d, (np.ones(4),), None, math.inf) == math.inf
