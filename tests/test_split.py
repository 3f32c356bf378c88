"""Large element-wise ops split across the pool's workers: numpy's results, only above the threshold."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends import _chunked, _split
from aiotensor._opdef import OPS

UFUNC_OPS = sorted(name for name, d in OPS.items() if d.ufunc)
UNARY = {name for name in UFUNC_OPS if OPS[name].data == 1}


@pytest.fixture
def splits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every split op's ufunc name and worker count (the threshold lowered to 4 KiB)."""
    seen: list[tuple[str, int]] = []
    real = _chunked.chunked_ufunc

    def spy(ufunc: np.ufunc, *args: Any, workers: int, **kwargs: Any) -> Any:
        seen.append((ufunc.__name__, workers))
        return real(ufunc, *args, workers=workers, **kwargs)

    monkeypatch.setattr(_split, "chunked_ufunc", spy)
    monkeypatch.setattr(_split, "MIN_BYTES", 4096)
    return seen


@pytest.fixture
async def s2() -> AsyncIterator[at.AsyncEagerSession]:
    """A session with a pool of two workers of its own (splitting needs two), every op on the pool."""
    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=2, inline_threshold_us=0)) as session:
        yield session


def _inputs(name: str, dtype: Any) -> list[np.ndarray[Any, Any]]:
    rng = np.random.default_rng(0)
    n = 1 if name in UNARY else 2
    if np.dtype(dtype).kind == "b":
        return [rng.random((128, 48)) < 0.5 for _ in range(n)]
    if np.dtype(dtype).kind == "i":  # bitwise ops; shifts stay below the width
        return [rng.integers(0, 8, (128, 48)).astype(dtype) for _ in range(n)]
    if name in ("acos", "asin", "atanh"):  # their domain is [-1, 1]
        return [(rng.random((128, 48)) * 0.9).astype(dtype) for _ in range(n)]
    low = 1.0 if name == "acosh" else 0.25  # acosh is defined from 1
    return [(rng.random((128, 48)) * 4 + low).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("name", UFUNC_OPS)
async def test_every_element_wise_op_split_equals_numpy(
    s2: at.AsyncEagerSession, splits: list[tuple[str, int]], name: str
) -> None:
    d = OPS[name]
    dtype = bool if name.startswith("logical") else np.int64 if name.startswith("bitwise") else np.float64
    arrays = _inputs(name, dtype)
    tensors = [await s2.constant(a) for a in arrays]
    got = await (await getattr(s2, name)(*tensors)).numpy()
    np.testing.assert_array_equal(got, d.kernel_for(np)(*arrays), strict=True)
    assert splits == [(d.kernel_for(np).__name__, 2)]


@pytest.mark.parametrize(
    ("make", "expected_dtype"),
    [
        (lambda s, x: s.add(x, 1.5), np.float32),  # NEP 50: a python float keeps float32
        (lambda s, x: s.multiply(x, np.float64(2.0)), np.float64),
        (lambda s, x: s.subtract(x, np.ones((1, 48), np.float32)), np.float32),  # a row, broadcast
        (lambda s, x: s.less(x, 2.0), np.bool_),
    ],
    ids=["python-scalar", "numpy-scalar", "broadcast-row", "comparison"],
)
async def test_scalars_broadcasting_and_dtypes_follow_numpy(
    s2: at.AsyncEagerSession, splits: list[tuple[str, int]], make: Any, expected_dtype: Any
) -> None:
    a = (np.random.default_rng(1).random((128, 48)) * 4).astype(np.float32)
    t = await make(s2, await s2.constant(a))
    got = await t.numpy()
    assert got.dtype == expected_dtype
    expected = await make(_NumpyOps(), a)
    np.testing.assert_array_equal(got, expected, strict=True)
    assert len(splits) == 1
    view = np.asarray(t)
    assert not view.flags.writeable  # owned and read-only, as any tensor


class _NumpyOps:
    """The same calls on numpy, for the expected values."""

    def __getattr__(self, name: str) -> Any:
        async def call(*args: Any) -> Any:
            return getattr(np, name)(*args)

        return call


async def test_small_ops_and_one_worker_pools_are_not_split(
    s2: at.AsyncEagerSession, splits: list[tuple[str, int]]
) -> None:
    small = await s2.constant(np.ones(16))  # below the (lowered) threshold
    await s2.add(small, small)
    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=1, inline_threshold_us=0)) as one:
        big = await one.constant(np.ones((64, 64)))
        np.testing.assert_array_equal(await (await one.add(big, big)).numpy(), np.full((64, 64), 2.0))
    assert splits == []


async def test_floating_point_errors_follow_the_callers_errstate_in_every_chunk(
    s2: at.AsyncEagerSession, splits: list[tuple[str, int]]
) -> None:
    x = await s2.constant(np.ones((64, 64)))
    zero = await s2.constant(np.zeros((64, 64)))
    with np.errstate(divide="raise"), pytest.raises(at.InvalidArgumentError, match="divide by zero"):
        await s2.divide(x, zero)
    with np.errstate(divide="ignore"):
        got = await (await s2.divide(x, zero)).numpy()
    assert np.isinf(got).all()
    assert len(splits) == 2


async def test_a_real_size_add_is_split_at_the_measured_threshold(s2: at.AsyncEagerSession, monkeypatch: Any) -> None:
    seen: list[int] = []
    real = _chunked.chunked_ufunc

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["out"].nbytes)
        return real(*args, **kwargs)

    monkeypatch.setattr(_split, "chunked_ufunc", spy)
    a = np.random.default_rng(2).random((2048, 1024), dtype=np.float32)  # 8 MiB: the threshold
    x = await s2.constant(a)
    np.testing.assert_array_equal(await (await s2.add(x, x)).numpy(), a + a, strict=True)
    half = await s2.constant(a[:1024])  # 4 MiB: one call
    await s2.add(half, half)
    assert seen == [a.nbytes]


@pytest.mark.parametrize("strategy", list(at.ResourceCleanupStrategy)[:2], ids=lambda s: s.name)
async def test_a_recycled_output_is_split_and_written_with_numpys_values(
    splits: list[tuple[str, int]], strategy: at.ResourceCleanupStrategy
) -> None:
    config = at.SessionConfig(max_workers=2, inline_threshold_us=0)
    async with at.AsyncEagerSession(config=config, cleanup=strategy) as s:
        a = np.random.default_rng(3).random((512, 512))  # 2 MiB: at least the cache's minimum
        x = await s.constant(a)
        first = await s.multiply(x, 3.0)
        del first  # freed (now or at the next safe point): its buffer goes to the cache
        kept = await _settled(s)
        cache = s._engine.registry.cache
        assert cache is not None
        hits = cache.stats().hits
        second = await s.add(x, x)  # written into the freed buffer, split across the workers
        assert cache.stats().hits == hits + 1
        np.testing.assert_array_equal(await second.numpy(), a + a, strict=True)
        assert splits == [("multiply", 2), ("add", 2)]
        del kept


async def _settled(s: at.AsyncEagerSession) -> at.Tensor:
    """Free what was dropped, whatever the strategy; a tensor to hold (its drop would be pending again)."""
    import gc

    gc.collect()
    kept = await s.constant(0.0)  # a safe point (ON_SAFE_POINTS frees there); kept: no new drop
    async with asyncio.timeout(5):
        while s.stats().pending:  # IN_BACKGROUND: the cleanup task's turn
            await asyncio.sleep(0.001)
    return kept
