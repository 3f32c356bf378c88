"""A large batch run in two parts on two workers: where it is cut, when, and that nothing changes but the speed."""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._fusion import _batch_kernel, _batch_split
from aiotensor._programs._interpreter import Budget

pytestmark = pytest.mark.usefixtures("fresh_recycler", "one_blas_thread")


@pytest.fixture
def one_blas_thread() -> Iterator[None]:
    """Single-threaded BLAS products (the only kind a batch splits under), the probe's findings forgotten."""
    pytest.importorskip("threadpoolctl")
    at.set_blas_threads(1)
    _batch_split._MULTIPLES.clear()
    try:
        yield
    finally:
        at.set_blas_threads(None)
        _batch_split._MULTIPLES.clear()


POOL = at.SessionConfig(inline_threshold_us=0, max_workers=2)  # every batch on a pool of two


@pytest.fixture
def free_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule with its inputs fixed: a core free, single-threaded BLAS, any batch long enough."""
    monkeypatch.setattr(_batch_split, "core_free", lambda: True)
    monkeypatch.setattr(_batch_split, "gate_slots", lambda: _batch_split._CORES)
    monkeypatch.setattr(_batch_split, "SPLIT_MIN_US", 0.0)
    # The pool's other worker taken as idle (it may still be leaving the last batch's
    # part): whether a batch splits is then the same in every run.
    monkeypatch.setattr(_batch_split, "pool_for", lambda engine: (engine.backend.executor.spawn, 2))


async def values(y: Any) -> np.ndarray[Any, Any]:
    assert isinstance(y, at.Tensor)
    return await y.numpy()


def mlp_weights(dtype: Any = np.float32) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((64, 512)) * 0.1).astype(dtype),
        (rng.standard_normal(512) * 0.01).astype(dtype),
        (rng.standard_normal((512, 10)) * 0.1).astype(dtype),
        (rng.standard_normal(10) * 0.01).astype(dtype),
    ]


def mlp(ops: at.FusedOps, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    return ops.softmax(ops.relu(x @ w1 + b1) @ w2 + b2, axis=-1)


async def run_batches(
    s: at.AsyncEagerSession, f: Any, xs: list[np.ndarray[Any, Any]], params: list[Any], times: int
) -> list[list[np.ndarray[Any, Any]]]:
    """``times`` batches of the callers ``xs``: each caller's rows, per batch."""
    got = []
    for _ in range(times):
        ys = await asyncio.gather(*[f(x, *params) for x in xs])
        got.append([await values(y) for y in ys])
    return got


async def ones_batches(times: int, config: at.SessionConfig = POOL) -> at.BatchStats:
    """``times`` batches of 32 callers of (16, 64) ones through the MLP in a new session: the function's stats."""
    xs = [np.ones((16, 64), np.float32) for _ in range(32)]
    async with at.AsyncEagerSession(config=config) as s:
        params = [await s.constant(w) for w in mlp_weights()]
        f = at.batched(max_batch_size=4096)(mlp)
        await run_batches(s, f, xs, params, times)
    return f.stats()


# -- where: a caller boundary on BLAS's row multiple, near the middle ------------------


@pytest.mark.parametrize(
    ("counts", "multiple", "cut"),
    [
        ([16] * 32, 48, 15),  # 240 rows of 512: the multiple of 48 nearest 256
        ([16] * 32, 1, 16),
        ([24] * 8, 48, 4),
        ([60, 5, 47], 1, 1),  # the boundary nearest the middle
        ([100, 5, 7], 1, None),  # its boundaries more than a quarter of the rows from the middle
        ([7] * 10, 48, None),  # no boundary on a multiple of 48
        ([500, 12], 12, None),  # the only boundary too far from the middle
        ([16], 1, None),  # one caller: nothing to cut
    ],
)
def test_the_cut_is_a_caller_boundary_on_the_row_multiple_nearest_the_middle(
    counts: list[int], multiple: int, cut: int | None
) -> None:
    assert _batch_split.cut_at(counts, multiple) == cut


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64])
def test_the_probed_row_multiple_keeps_every_rows_bits_in_blas_products(dtype: Any) -> None:
    m = _batch_split.row_multiple([np.dtype(dtype)])
    if m is None:
        pytest.skip("this BLAS gives no row multiple the probe accepts: batches stay one part")
    assert m in _batch_split.ROW_MULTIPLES
    # The benchmark's shapes, not the probe's, with a tail of rows.
    rng = np.random.default_rng(1)
    for inner, cols, rows in ((64, 512, 512), (512, 10, 512), (64, 512, 4 * m + 5)):
        w = rng.standard_normal((inner, cols)).astype(dtype)
        x = rng.standard_normal((rows, inner)).astype(dtype)
        whole = x @ w
        for cut in range(m, rows, m):
            assert np.array_equal(x[:cut] @ w, whole[:cut]), (inner, cols, rows, cut)
            assert np.array_equal(x[cut:] @ w, whole[cut:]), (inner, cols, rows, cut)


def test_integer_rows_need_no_multiple() -> None:
    assert _batch_split.row_multiple([np.dtype(np.int64), np.dtype(np.int32)]) == 1


# -- results: bit for bit the one-part batch's ----------------------------------------


@pytest.mark.parametrize("rows", [16, 24, 12])
async def test_a_split_batch_gives_each_caller_the_one_part_batchs_rows_bit_for_bit(
    free_core: None, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    rng = np.random.default_rng(2)
    # Every third caller with twice the rows: callers of unequal rows, cut where their
    # boundary falls on the row multiple.
    xs = [rng.standard_normal((rows if i % 3 else 2 * rows, 64)).astype(np.float32) for i in range(32)]
    async with at.AsyncEagerSession(config=POOL) as s:
        params = [await s.constant(w) for w in mlp_weights()]
        f = at.batched(max_batch_size=4096)(mlp)
        split = await run_batches(s, f, xs, params, 4)
        assert f.stats().split >= 1  # (first run measured, two timed in one part: then two parts)
        monkeypatch.setattr(_batch_split, "SPLIT_MIN_US", float("inf"))
        g = at.batched(max_batch_size=4096)(mlp)
        whole = await run_batches(s, g, xs, params, 3)
        assert g.stats().split == 0
    for batch in split:
        for mine, ref in zip(batch, whole[-1], strict=True):
            assert mine.dtype == ref.dtype
            assert np.array_equal(mine, ref)
    for x, y in zip(xs, whole[-1], strict=True):
        np.testing.assert_allclose(y, mlp_numpy(x, mlp_weights()), rtol=1e-5, atol=1e-6)


def mlp_numpy(x: np.ndarray[Any, Any], w: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    logits = np.maximum(x @ w[0] + w[1], 0) @ w[2] + w[3]
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


async def test_several_outputs_and_callers_of_other_sessions_are_split_as_one_part_would(free_core: None) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 48)).astype(np.float32)

    @at.batched(max_batch_size=4096)
    def two(ops: at.FusedOps, x: Any, w: Any) -> Any:
        h = ops.relu(x @ w)
        return h, ops.sum(h, axis=-1)

    xs = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(12)]
    async with at.AsyncEagerSession(config=POOL) as s:
        tw = await s.constant(w)
        children = [at.AsyncEagerSession(parent=s) for _ in range(3)]
        try:
            for _ in range(4):
                rows = [await children[i % 3].constant(x) if i % 2 else x for i, x in enumerate(xs)]
                outs = await asyncio.gather(*[two(r, tw) for r in rows])
                for i, (x, out) in enumerate(zip(xs, outs, strict=True)):
                    assert isinstance(out, tuple)
                    h, total = out
                    assert h.session is (children[i % 3] if i % 2 else s)
                    np.testing.assert_allclose(await h.numpy(), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(await total.numpy(), np.maximum(x @ w, 0).sum(-1), rtol=1e-5, atol=1e-4)
            assert two.stats().split >= 1
        finally:
            for c in children:
                await c.aclose()


# -- when: the rule and what the stats say ---------------------------------------------


async def test_no_free_core_keeps_one_part_and_the_stats_say_so(
    free_core: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_batch_split, "pool_for", lambda engine: None)  # no worker or core free
    stats = await ones_batches(5)
    assert stats.split == 0
    assert stats.not_split == 2  # (the first run is measured, the next two timed in one part)


async def test_the_pool_is_offered_while_a_worker_and_a_core_are_free(monkeypatch: pytest.MonkeyPatch) -> None:
    async with at.AsyncEagerSession(config=POOL) as s:
        engine = s._engine
        await s.add(await s.constant(np.ones(4)), 1)  # (the pool made)
        pool = engine.backend.executor  # type: ignore[attr-defined]  # (the local backend's)
        monkeypatch.setattr(_batch_split, "core_free", lambda: True)
        monkeypatch.setattr(pool, "idle_workers", lambda: 1)
        assert _batch_split.pool_for(engine) == (pool.spawn, 2)
        monkeypatch.setattr(pool, "idle_workers", lambda: 0)  # the other worker busy
        assert _batch_split.pool_for(engine) is None
        monkeypatch.setattr(pool, "idle_workers", lambda: 1)
        monkeypatch.setattr(_batch_split, "core_free", lambda: False)  # another process on the other core
        assert _batch_split.pool_for(engine) is None
    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=1)) as one:
        monkeypatch.setattr(_batch_split, "core_free", lambda: True)
        assert _batch_split.pool_for(one._engine) is None  # one worker: nobody to share with


async def test_a_short_batch_stays_one_part_without_asking_for_a_core(
    free_core: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []

    def pool_for(engine: Any) -> Any:
        asked.append(True)
        return engine.backend.executor.spawn, 2

    monkeypatch.setattr(_batch_split, "pool_for", pool_for)
    monkeypatch.setattr(_batch_split, "SPLIT_MIN_US", 1e9)
    stats = await ones_batches(4)
    assert (stats.split, stats.not_split, asked) == (0, 0, [])


async def test_multi_threaded_blas_keeps_one_part(free_core: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_batch_split, "gate_slots", lambda: _batch_split._CORES - 1)
    stats = await ones_batches(4)
    assert stats.split == 0


async def test_a_batch_under_a_memory_limit_stays_one_part(free_core: None) -> None:
    stats = await ones_batches(4, at.SessionConfig(inline_threshold_us=0, max_workers=2, memory_limit=64 << 20))
    assert (stats.split, stats.not_split) == (0, 0)


async def test_a_batch_run_on_the_thread_that_made_it_stays_one_part(free_core: None) -> None:
    # The thread that made the kernel is the loop's: a batch run inline is never split.
    async with at.AsyncEagerSession(config=POOL) as s:
        engine = s._engine
        xs = tuple(np.ones((16, 64), np.float32) for _ in range(32))
        weights = mlp_weights()
        here = _batch_kernel.BatchKernel(mlp, engine, Budget("b"), [16] * 32, "b", measure=False, whole_us=1e9)
        here(xs, *weights)
        assert (here.parts, here.busy) == (1, False)
        there = _batch_kernel.BatchKernel(mlp, engine, Budget("b"), [16] * 32, "b", measure=False, whole_us=1e9)
        await asyncio.to_thread(there, xs, *weights)
        assert there.parts == 2


async def test_one_part_in_refresh_every_measures_the_one_part_time_again(
    free_core: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_batch_split, "REFRESH_EVERY", 3)
    monkeypatch.setattr("aiotensor._fusion._batch_task.REFRESH_EVERY", 3)
    stats = await ones_batches(9)
    # Measured, timed twice, then two parts but for each third run since the first timed.
    assert (stats.batches, stats.split) == (9, 4)


# -- errors, warnings, the budget -------------------------------------------------------


async def test_an_error_of_either_part_reaches_every_caller_and_leaks_nothing(
    free_core: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def picky(ops: at.FusedOps, x: Any, w: Any) -> Any:
        if float(np.asarray(ops.max(x))) > 100:  # only the second part's rows hold the marker
            raise ValueError("a marked row")
        return ops.relu(x @ w)

    w = np.ones((8, 8), np.float32)
    xs = [np.ones((16, 8), np.float32) for _ in range(12)]
    marked = [*xs[:-1], np.full((16, 8), 1000.0, np.float32)]
    counted: list[int] = []
    async with at.AsyncEagerSession(config=POOL) as s:
        tw = await s.constant(w)
        for split in (True, False):  # the same failing batch in two parts, then in one
            if not split:
                monkeypatch.setattr(_batch_split, "SPLIT_MIN_US", float("inf"))
            f = at.batched(max_batch_size=4096)(picky)
            await run_batches(s, f, xs, [tw], 4)  # measured, timed twice, then split (or not)
            assert f.stats().split == (1 if split else 0)
            before = s.stats()
            results = await asyncio.gather(*[f(x, tw) for x in marked], return_exceptions=True)
            after = s.stats()
            # As a one-part batch's error reads: the whole batch's rows, fn's own error.
            for r in results:
                assert isinstance(r, at.KernelError)
                assert str(r) == "batched(picky)(float32[192, 8], float32[8, 8]) failed: ValueError: a marked row"
            assert f.stats().failed == 1
            # Nothing of the failed batch registered: no tensor bytes, no live tensor more.
            assert after.allocated_bytes == before.allocated_bytes
            assert after.live_tensors <= before.live_tensors
            counted.append(after.allocated - before.allocated)
            ys = await asyncio.gather(*[f(x, tw) for x in xs])  # the function still works
            for y in ys:
                np.testing.assert_array_equal(await values(y), np.full((16, 8), 8.0, np.float32))
            del ys, y
    # Its intermediates counted (allocated and freed at once) as a one-part batch's are,
    # the two parts' together: the part without the marker ran to its end.
    assert counted[0] >= counted[1] > 0


async def test_a_floating_point_warning_of_the_spawned_part_is_reported(free_core: None) -> None:
    def logs(ops: at.FusedOps, x: Any, w: Any) -> Any:
        return ops.log(x @ w)

    f = at.batched(max_batch_size=4096)(logs)
    w = np.eye(8, dtype=np.float32)
    xs = [np.ones((16, 8), np.float32) for _ in range(12)]
    async with at.AsyncEagerSession(config=POOL) as s:
        tw = await s.constant(w)
        await run_batches(s, f, xs, [tw], 4)
        assert f.stats().split == 1
        marked = [*xs[:-1], -np.ones((16, 8), np.float32)]  # the last caller: in the second part
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always", RuntimeWarning)
            ys = await asyncio.gather(*[f(x, tw) for x in marked])
        assert f.stats().split == 2
        assert [str(w.message) for w in log] == ["invalid value encountered in batched(logs)"]
        assert np.isnan(await values(ys[-1])).all()
        assert not np.isnan(await values(ys[0])).any()


def test_both_parts_budgets_are_summed_into_the_batchs() -> None:
    budget = Budget("a batched function")
    budget.live, budget.peak, budget.count = 100, 100, 1
    seen: set[int] = set()

    def part(lo: int, hi: int, b: Budget) -> tuple[int, int]:
        seen.add(threading.get_ident())
        b.made(1000 * (hi - lo), "an op")
        b.made(10, "an op")
        b.live -= 10
        b.escaped += 1
        return lo, hi

    def spawn(job: Any) -> None:
        threading.Thread(target=job).start()

    got = _batch_split.in_two(part, 512, 3, 8, spawn, budget)
    assert got == [(0, 3), (3, 8)]
    assert (budget.count, budget.escaped, budget.live) == (5, 2, 100 + 3000 + 5000)
    assert budget.peak == 100 + 3010 + 5010  # both parts may peak at once


def test_an_error_of_one_part_is_raised_once_both_have_stopped() -> None:
    done: list[int] = []

    def part(lo: int, hi: int, b: Budget) -> None:
        if lo == 0:
            raise ValueError("first part")
        done.append(hi)

    def spawn(job: Any) -> None:
        threading.Thread(target=job).start()

    with pytest.raises(ValueError, match="first part"):
        _batch_split.in_two(part, 64, 1, 2, spawn, Budget("x"))
    # The other part either ran to its end before the call returned or never started.
    assert done in ([], [2])


def test_a_part_that_cannot_be_spawned_runs_on_this_thread() -> None:
    threads: list[int] = []

    def part(lo: int, hi: int, b: Budget) -> None:
        threads.append(threading.get_ident())

    def spawn(job: Any) -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    _batch_split.in_two(part, 64, 1, 2, spawn, Budget("x"))
    assert threads == [threading.get_ident()] * 2


async def test_results_of_earlier_split_batches_never_change(free_core: None) -> None:
    # Each part recycles its own thread's buffers: no kept buffer is a live result.
    rng = np.random.default_rng(4)
    weights = mlp_weights()
    held: list[tuple[np.ndarray[Any, Any], at.Tensor]] = []
    async with at.AsyncEagerSession(config=POOL) as s:
        params = [await s.constant(w) for w in weights]
        f = at.batched(max_batch_size=4096)(mlp)
        for _ in range(8):
            xs = [rng.standard_normal((16, 64)).astype(np.float32) for _ in range(32)]
            ys = await asyncio.gather(*[f(x, *params) for x in xs])
            for x, y in zip(xs, ys, strict=True):
                assert isinstance(y, at.Tensor)
                held.append((x, y))
            for x, y in held:
                np.testing.assert_allclose(await values(y), mlp_numpy(x, weights), rtol=1e-5, atol=1e-6)
        assert f.stats().split >= 4
        del held, ys, y


async def test_a_caller_cancelled_while_its_split_batch_runs_leaks_nothing(free_core: None) -> None:
    xs = [np.full((16, 64), i / 32, np.float32) for i in range(32)]
    async with at.AsyncEagerSession(config=POOL) as s:
        params = [await s.constant(w) for w in mlp_weights()]
        f = at.batched(max_batch_size=4096)(mlp)
        await run_batches(s, f, xs, params, 3)
        tasks = [asyncio.create_task(f(x, *params)) for x in xs]
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the batch's task has submitted its kernel
        tasks[5].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[5], asyncio.CancelledError)
        for i, y in enumerate(done):
            if i != 5:
                np.testing.assert_allclose(await values(y), mlp_numpy(xs[i], mlp_weights()), rtol=1e-5, atol=1e-6)
        stats = f.stats()
        assert (stats.batches, stats.split, stats.cancelled) == (4, 1, 1)
        del done, y
    assert (s.stats().live_tensors, s.stats().live_bytes) == (0, 0)
