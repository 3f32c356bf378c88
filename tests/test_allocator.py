"""The caching allocator: recycling only what nothing else sees, exact accounting, the LRU bound."""

from __future__ import annotations

import asyncio
import collections
import gc
import platform
import sys
import threading
import weakref
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends import _allocator
from aiotensor._backends._allocator import (
    BufferCache,
    bind_ufunc,
    is_exported,
    malloc_trim,
    mark_exported,
    out_for,
    recyclable,
)
from aiotensor._ufuncs import ufunc_result

SHAPE = (128, 128)  # 64 KiB as float32: the default min_bytes
BIG = (512, 512)  # 1 MiB as float32: the smallest buffer a session caches
NB = 128 * 128 * 4


def owned(shape: tuple[int, ...] = SHAPE, dtype: Any = np.float32, fill: float = 1.0) -> np.ndarray:
    """A buffer as the registry holds one: owns its data, read-only."""
    arr = np.full(shape, fill, dtype=dtype)
    arr.flags.writeable = False
    return arr


class Handle:
    """What a Tensor's ``__array__`` hands out: a read-only view, never the buffer."""

    def __init__(self, buf: np.ndarray) -> None:
        self._buf = buf

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return self._buf.view()


def free(buffers: dict[int, tuple[np.ndarray, int]], rid: int, cache: BufferCache) -> bool:
    """The call site the registry is to use (Registry.free): pop, unpack, drop the tuple, give."""
    entry = buffers.pop(rid)
    buffer, _nbytes = entry
    del entry
    return cache.give(buffer)  # owners=1: the local `buffer`


def registered(*arrays: np.ndarray) -> dict[int, tuple[np.ndarray, int]]:
    return {i: (a, a.nbytes) for i, a in enumerate(arrays)}


def test_calibration_found_the_call_overhead() -> None:
    assert _allocator._CALL_REFS >= 1


def test_nothing_else_sees_it_so_it_is_kept() -> None:
    cache = BufferCache(1 << 20)
    buffers = registered(owned())
    assert free(buffers, 0, cache)
    assert cache.cached_bytes == NB
    assert len(cache) == 1


def test_a_view_from_asarray_refuses() -> None:
    cache = BufferCache(1 << 20)
    buffers = registered(owned())
    view = np.asarray(Handle(buffers[0][0]))
    assert not free(buffers, 0, cache)
    assert cache.cached_bytes == 0
    assert cache.stats().refused == 1
    assert view[0, 0] == 1.0


@pytest.mark.parametrize(
    "derive",
    [
        pytest.param(lambda v: v[1:], id="slice-of-view"),
        pytest.param(lambda v: v.reshape(-1), id="reshape-of-view"),
        pytest.param(lambda v: v.T, id="transpose"),
        pytest.param(memoryview, id="memoryview"),
        pytest.param(lambda v: [v.base], id="list-holding-buffer"),
        pytest.param(lambda v: v.__dlpack__(max_version=(1, 0)), id="dlpack-capsule"),
    ],
)
def test_anything_derived_from_a_view_refuses(derive: Any) -> None:
    cache = BufferCache(1 << 20)
    buffers = registered(owned())
    view = np.asarray(Handle(buffers[0][0]))
    derived = derive(view)
    del view  # only the derived object remains
    assert not free(buffers, 0, cache)
    del derived


def test_a_kernel_still_reading_it_refuses() -> None:
    cache = BufferCache(1 << 20)
    buffers = registered(owned())
    started, release = threading.Event(), threading.Event()

    def kernel(x: np.ndarray) -> None:
        started.set()
        release.wait()

    worker = threading.Thread(target=kernel, args=(buffers[0][0],))
    worker.start()
    started.wait()
    try:
        assert not free(buffers, 0, cache)
    finally:
        release.set()
        worker.join()


def test_after_the_view_is_gone_the_next_free_is_kept() -> None:
    cache = BufferCache(1 << 20)
    buffers = registered(owned(), owned())
    view = np.asarray(Handle(buffers[0][0]))
    assert not free(buffers, 0, cache)
    del view
    assert free(buffers, 1, cache)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: np.ones((256, 128), np.float32)[:128], id="slice-not-owner"),
        pytest.param(lambda: np.asfortranarray(np.ones(SHAPE, np.float32)), id="fortran-order"),
        pytest.param(lambda: np.ones((128, 256), np.float32)[:, ::2].copy().T, id="transposed-view"),
        pytest.param(lambda: np.ones(SHAPE, object), id="object-dtype"),
        pytest.param(lambda: np.zeros(128 * 128, "V4"), id="void-dtype"),
        pytest.param(lambda: np.ones(SHAPE, np.float32).view(np.recarray), id="subclass"),
    ],
)
def test_arrays_that_cannot_be_recycled_are_refused(make: Any) -> None:
    cache = BufferCache(1 << 22, min_bytes=0)
    arr = make()
    assert not cache.give(arr)
    assert not recyclable(arr, 1)
    assert cache.cached_bytes == 0


def test_exported_arrays_are_refused_and_the_mark_dies_with_them() -> None:
    cache = BufferCache(1 << 20)
    arr = owned()
    before = len(_allocator._exported)
    mark_exported(arr)
    assert is_exported(arr)
    assert not cache.give(arr)
    del arr
    gc.collect()
    assert len(_allocator._exported) == before


def test_take_hands_back_a_writable_owner_of_exactly_that_shape_and_dtype() -> None:
    cache = BufferCache(1 << 20)
    buffers = registered(owned())
    original = weakref.ref(buffers[0][0])  # a strong reference here would (rightly) be refused
    assert free(buffers, 0, cache)
    assert not _arr(original).flags.writeable  # still read-only while cached
    got = cache.take(SHAPE, "float32")
    assert got is original()
    assert got is not None
    assert got.flags.writeable
    assert got.flags.c_contiguous
    assert got.flags.owndata
    assert got.base is None
    assert got.shape == SHAPE
    assert got.dtype == np.float32
    got[...] = 5.0
    assert cache.cached_bytes == 0
    assert cache.take(SHAPE, "float32") is None
    assert cache.stats().hits == 1
    assert cache.stats().misses == 1


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((128, 64), np.float64),  # same nbytes, other dtype and shape
        ((128 * 128,), np.float32),  # same nbytes and dtype, other shape
        ((128, 128), np.int32),  # same shape and itemsize, other dtype
        ((128, 128), ">f4"),  # other byte order
        ((64, 128), np.float32),  # smaller
    ],
)
def test_a_mismatch_is_never_handed_out(shape: tuple[int, ...], dtype: Any) -> None:
    cache = BufferCache(1 << 20, min_bytes=0)
    arr = owned()
    assert cache.give(arr)
    del arr
    assert cache.take(shape, dtype) is None
    assert cache.cached_bytes == NB


def test_zero_disables() -> None:
    cache = BufferCache(0)
    arr = owned()
    assert not cache.give(arr)
    assert cache.take(SHAPE, np.float32) is None
    assert cache.cached_bytes == 0
    assert cache.stats().max_bytes == 0
    assert out_for(cache, np.add, (np.ones(SHAPE, np.float32), 1.0)) is None


def test_small_and_oversized_buffers_are_refused() -> None:
    cache = BufferCache(2 * NB)
    small, big, fits = owned((8, 8)), owned((256, 256)), owned()
    assert not cache.give(small)  # under min_bytes
    assert not cache.give(big)  # over max_bytes
    assert cache.give(fits)  # the same call site keeps a buffer of a size in between
    assert cache.stats().refused == 2


def test_negative_bounds_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        BufferCache(-1)


def test_lru_bound_evicts_the_least_recently_given() -> None:
    cache = BufferCache(3 * NB)
    refs = []
    for i in range(5):
        arr = owned(fill=i)
        refs.append(weakref.ref(arr))  # not a strong reference: that would (rightly) be refused
        assert cache.give(arr)
        del arr
        assert cache.cached_bytes <= 3 * NB
    assert cache.cached_bytes == 3 * NB
    assert cache.stats().evictions == 2
    assert refs[0]() is None
    assert refs[1]() is None
    # take gives the most recently given first.
    taken = [cache.take(SHAPE, np.float32) for _ in range(3)]
    assert [t is r() for t, r in zip(taken, refs[:1:-1], strict=True)] == [True, True, True]
    assert [float(t[0, 0]) for t in taken if t is not None] == [4.0, 3.0, 2.0]
    assert cache.take(SHAPE, np.float32) is None


def test_accounting_and_eviction_order_match_a_model() -> None:
    rng = np.random.default_rng(0)
    kinds = [((128, 128), np.float32), ((64, 256), np.float32), ((128, 128), np.float64), ((300, 100), np.int16)]
    limit = 6 * NB
    cache = BufferCache(limit, min_bytes=0)
    model: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # id -> array, oldest first
    for _ in range(600):
        shape, dtype = kinds[rng.integers(len(kinds))]
        action = rng.integers(10)
        if action < 5:
            arr = owned(shape, dtype)
            assert cache.give(arr)
            model[id(arr)] = arr
            while sum(a.nbytes for a in model.values()) > limit:
                model.popitem(last=False)
            del arr
        elif action < 9:
            got = cache.take(shape, dtype)
            candidates = [a for a in model.values() if a.shape == shape and a.dtype == dtype]
            if candidates:
                assert got is candidates[-1]  # the newest of that key
                del model[id(got)]
            else:
                assert got is None
            del got
        else:
            keep = int(rng.integers(0, limit))
            before = cache.cached_bytes
            released = cache.trim(keep)
            while sum(a.nbytes for a in model.values()) > keep:
                model.popitem(last=False)
            assert released == before - cache.cached_bytes
        assert cache.cached_bytes == sum(a.nbytes for a in model.values())
        assert cache.cached_bytes <= limit
        assert len(cache) == len(model)
        assert cache.stats().cached_buffers == len(model)


def test_trim_and_clear_release_everything() -> None:
    cache = BufferCache(1 << 24)
    refs = []
    for i in range(4):
        arr = owned(fill=i)
        refs.append(weakref.ref(arr))
        cache.give(arr)
        del arr
    assert cache.trim(2 * NB) == 2 * NB
    assert cache.cached_bytes == 2 * NB
    assert refs[0]() is None
    assert refs[1]() is None
    assert cache.clear() == 2 * NB
    assert cache.cached_bytes == 0
    assert len(cache) == 0
    assert all(r() is None for r in refs)
    assert cache.stats().trimmed_bytes == 4 * NB


def test_no_recycled_buffer_is_ever_visible_through_an_earlier_view() -> None:
    """Many frees with and without live views; every taken buffer is overwritten at once."""
    rng = np.random.default_rng(1)
    cache = BufferCache(8 * NB)
    views: list[tuple[np.ndarray, float]] = []
    for serial in range(1, 401):
        buffers = registered(owned(fill=float(serial)))
        if rng.random() < 0.4:
            views.append((np.asarray(Handle(buffers[0][0])), float(serial)))
        free(buffers, 0, cache)
        if rng.random() < 0.3 and views:
            views.pop(int(rng.integers(len(views))))
        got = cache.take(SHAPE, np.float32)
        if got is not None:
            got[...] = -1.0  # a kernel writing its output
            assert all(v.base is not got for v, _ in views)
            cache.give(_readonly(got))
            del got
        for view, value in views:
            assert view[0, 0] == value
            assert view[-1, -1] == value
    assert cache.stats().hits > 50
    assert cache.stats().refused > 50


def _arr(ref: weakref.ref[np.ndarray]) -> np.ndarray:
    arr = ref()
    assert arr is not None
    return arr


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


# -- kernel side ----------------------------------------------------------------------

ARRAY_DTYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32, np.float64]
SCALARS: list[Any] = [True, 3, -2, 1.5, 2j, np.float32(2), np.int8(3), np.float64(0.5)]
UFUNCS: list[np.ufunc] = [
    np.add,
    np.subtract,
    np.multiply,
    np.true_divide,
    np.floor_divide,
    np.power,
    np.maximum,
    np.greater,
]
UFUNCS += [np.logical_and, np.bitwise_and, np.arctan2, np.hypot, np.sqrt, np.exp, np.negative, np.absolute]


def _actual(ufunc: np.ufunc, args: tuple[Any, ...]) -> np.ndarray | None:
    try:
        with np.errstate(all="ignore"):
            return np.asarray(ufunc(*args))
    except Exception:
        return None


@pytest.mark.parametrize("ufunc", UFUNCS, ids=lambda u: u.__name__)
def test_ufunc_result_is_numpys_own_answer(ufunc: np.ufunc) -> None:
    cases: list[tuple[Any, ...]] = []
    for dt in ARRAY_DTYPES:
        a: np.ndarray = np.ones((3, 1), dt)
        if ufunc.nin == 1:
            cases.append((a,))
            continue
        cases += [(a, np.ones(4, d2)) for d2 in ARRAY_DTYPES]
        cases += [(a, s) for s in SCALARS] + [(s, a) for s in SCALARS]
        cases.append((a, np.array(2.5, np.float32)))  # a 0-d array is "strong" like any array
    cases += [(np.ones(3, np.int8), 2**40), (np.ones(3, np.int8), 3.0e300)] if ufunc.nin == 2 else []
    for args in cases:
        expected = _actual(ufunc, args)
        predicted = ufunc_result(ufunc, args)
        # A call that raises may get a prediction (the dtype is memoized per input types,
        # and int8 + 2**40 raises by value): it raises the same error with out= too.
        if expected is not None:
            assert predicted == (expected.shape, expected.dtype), args


def test_ufunc_result_declines_what_it_cannot_know() -> None:
    a = np.ones(3)
    assert ufunc_result(np.divmod, (a, a)) is None  # two outputs
    assert ufunc_result(np.add, (a, [1, 2, 3])) is None  # not an array or number
    assert ufunc_result(np.add, (np.ones(3), np.ones(4))) is None  # no broadcast
    assert ufunc_result(np.add, (a,)) is None  # wrong arity
    assert ufunc_result(np.bitwise_and, (a, a)) is None  # no loop for floats: the trial raises
    assert ufunc_result(np.add, (np.ones(3, "M8[s]"), np.ones(3, "m8[s]"))) is None  # not numeric


@pytest.mark.parametrize(
    "args",
    [
        pytest.param((np.arange(128 * 128, dtype=np.float32).reshape(SHAPE), 1.5), id="f32+pyfloat"),
        pytest.param((np.arange(128 * 128, dtype=np.int32).reshape(SHAPE), 0.5), id="i32+pyfloat"),
        pytest.param((np.ones(SHAPE, np.bool_), np.ones(SHAPE, np.bool_)), id="bool+bool"),
        pytest.param((np.ones((128, 1), np.float32), np.ones((1, 128), np.float32)), id="broadcast"),
    ],
)
def test_bind_ufunc_writes_into_the_recycled_buffer_with_numpys_result(args: tuple[Any, ...]) -> None:
    expected = np.add(*args)
    cache = BufferCache(1 << 22, min_bytes=0)
    buf = np.empty(expected.shape, expected.dtype)
    buf.fill(7)
    buf.flags.writeable = False
    assert cache.give(buf)
    kernel = bind_ufunc(cache, np.add, *args)
    got = kernel()
    assert got is buf
    np.testing.assert_array_equal(got, expected, strict=True)
    assert bind_ufunc(cache, np.add, *args)() is not buf  # the cache is empty now: numpy allocates


def test_malloc_trim_runs_on_glibc() -> None:
    if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        assert malloc_trim() is True
    else:
        assert malloc_trim() is False


# -- the call sites: Registry.free gives, the session shares its cache with child sessions


def test_the_registry_gives_what_nobody_sees_and_keeps_the_rest() -> None:
    from aiotensor._registry import Registry

    cache = BufferCache(1 << 20)
    released: list[np.ndarray] = []
    registry = Registry(released.append, cache=cache)
    arr = owned()
    rid = registry.add(arr, arr.nbytes)
    del arr
    registry.free(rid)  # nobody else sees it: kept, not released
    arr = owned()
    rid = registry.add(arr, arr.nbytes)
    view = np.asarray(Handle(arr))
    del arr
    registry.free(rid)  # the view sees it: released, never recycled
    stats = cache.stats()
    assert (stats.kept, stats.refused, len(released)) == (1, 1, 1)
    assert released[0].base is None
    assert view.base is released[0]
    assert view[0, 0] == 1.0
    assert registry.stats().cached_bytes == stats.cached_bytes == owned().nbytes


async def test_end_to_end_a_view_from_asarray_is_never_recycled(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(buffer_cache_bytes=1 << 24)) as root:
        cache = root._engine.registry.cache
        assert cache is not None
        # Inline: results made on today's pool are still referenced by its future for a loop
        # iteration after the op returns, and a referenced buffer is refused (see the guide).
        inline = at.SessionConfig(inline_threshold_us=1000.0)
        async with at.AsyncEagerSession(cleanup=strategy, parent=root, config=inline) as s:
            assert s._engine.registry.cache is cache  # a child recycles into its root's cache
            x = await s.ones(BIG, dtype="float32")
            t = await s.add(x, 1.0)
            view = np.asarray(t)
            del t
            u = await s.add(x, 2.0)  # nothing sees this one once the handle is gone
            del u, x
        # Whatever the strategy freed before, closing the child freed the rest.
        stats = cache.stats()
        assert stats.refused == 1  # t's buffer: the view still sees it
        assert stats.kept == 2  # x's and u's
        for _ in range(2):
            got = cache.take(BIG, np.float32)
            assert got is not None
            assert view.base is not got
            got[...] = -1.0
        assert (view == 2.0).all()
    assert cache.stats().cached_bytes == 0  # the root's close released the cache


# -- the session's cache: results written into freed buffers


async def _loop_of_adds(s: at.AsyncEagerSession, n: int) -> tuple[at.Tensor, np.ndarray]:
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(BIG).astype(np.float32)
    x = await s.constant(xv)
    y = await s.add(x, 0.0)
    expected = xv.copy()
    for i in range(n):  # the seeds' loop: keep only the last result
        y = await s.add(y, float(i))
        expected = expected + np.float32(i)
        await asyncio.sleep(0)  # IN_BACKGROUND frees between ops
    del x
    return y, expected


@pytest.mark.parametrize(
    "strategy", [at.ResourceCleanupStrategy.IN_BACKGROUND, at.ResourceCleanupStrategy.ON_SAFE_POINTS]
)
async def test_a_loop_recycles_its_results(strategy: at.ResourceCleanupStrategy) -> None:
    # Inline, where what recycles is deterministic (see test_end_to_end_... for why not the pool).
    async with at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(inline_threshold_us=1000.0)) as s:
        y, expected = await _loop_of_adds(s, 12)
        np.testing.assert_array_equal(await y.numpy(), expected)
        cache = s._engine.registry.cache
        assert cache is not None
        assert cache.stats().hits >= 8  # after the first few, every result reuses a freed buffer
        stats = s.stats()
        assert stats.cached_bytes == cache.stats().cached_bytes <= s.config.buffer_cache_bytes
        assert stats.live_bytes == y.nbytes + stats.pending * y.nbytes
        del y
    assert cache.stats().cached_bytes == 0  # released at close


def _address(s: at.AsyncEagerSession, t: at.Tensor) -> int:
    # Where the tensor's buffer is, without keeping a view of it (a view would make it unrecyclable).
    return int(s._engine.registry._buffers[t._rid][0].__array_interface__["data"][0])


@pytest.mark.parametrize("formula", ["op", "expression"])
async def test_a_pool_result_dropped_before_the_next_call_is_the_buffer_it_writes_into(
    strategy: at.ResourceCleanupStrategy, formula: str
) -> None:
    # On the pool (threshold 0), a result dropped just before the next call is freed
    # before that call takes a recycled buffer, so a loop that keeps only its last result
    # writes into one buffer, still in cache (before: two buffers in turn, since the
    # background task freed the drop only while the next kernel ran). An op and an
    # expression with a blocked run (the standardization: its result's buffer).
    config = at.SessionConfig(inline_threshold_us=0.0)
    async with at.AsyncEagerSession(cleanup=strategy, config=config) as s:
        v = np.random.default_rng(3).standard_normal(BIG).astype(np.float32)
        x = await s.constant(v)

        async def once() -> at.Tensor:
            if formula == "op":
                return await s.multiply(x, 2.0)
            t: at.Tensor = await ((x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8))
            return t

        expected = v * 2.0 if formula == "op" else (v - v.mean(axis=0)) / (v.std(axis=0) + 1e-8)
        seen = []
        for _ in range(6):
            r = await once()
            seen.append(_address(s, r))
            assert (await r.numpy()).tobytes() == expected.tobytes()
            del r
        if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
            assert len(set(seen)) == 6  # nothing is freed before close: never recycled
        else:
            assert len(set(seen)) == 1, seen
            assert s._engine.registry.cache.stats().hits >= 5  # type: ignore[union-attr]


async def test_a_recycled_buffer_never_changes_a_view_handed_out() -> None:
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS) as s:
        x = await s.constant(np.ones(BIG, np.float32))
        t = await s.add(x, 1.0)
        view = np.asarray(t)
        del t  # freed at the next safe point, but the view sees it: never cached
        for i in range(6):
            u = await s.add(x, float(i + 10))
            del u
        np.testing.assert_array_equal(view, 2.0)
        assert s._engine.registry.cache.stats().refused >= 1  # type: ignore[union-attr]


async def test_the_cache_counts_against_the_memory_limit_and_gives_way() -> None:
    nb = int(np.prod(BIG)) * 4
    config = at.SessionConfig(memory_limit=4 * nb, buffer_cache_bytes=8 * nb)
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS, config=config) as s:
        kept = [await s.ones(BIG, dtype="float32") for _ in range(3)]
        del kept
        await s.run([])  # a safe point: the three go to the cache
        assert s.stats().cached_bytes == 3 * nb
        a = await s.ones(BIG, dtype="float32")
        b = await s.ones(BIG, dtype="float32")
        c = await s.ones(BIG, dtype="float32")  # fits: the cache gave way
        stats = s.stats()
        assert stats.live_bytes + stats.cached_bytes <= 4 * nb
        with pytest.raises(at.ResourceExhaustedError):
            await s.ones((2 * BIG[0], BIG[1]), dtype="float32")  # the cache never makes room it does not have
        del a, b, c


async def test_trim_releases_and_zero_turns_the_cache_off() -> None:
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS) as s:
        t = await s.ones(BIG, dtype="float32")
        del t
        await s.run([])
        assert s.stats().cached_bytes == int(np.prod(BIG)) * 4
        assert s.trim() == int(np.prod(BIG)) * 4
        assert s.stats().cached_bytes == 0
    async with at.AsyncEagerSession(config=at.SessionConfig(buffer_cache_bytes=0)) as off:
        assert off._engine.registry.cache is None
        y, expected = await _loop_of_adds(off, 3)
        np.testing.assert_array_equal(await y.numpy(), expected)
        assert off.stats().cached_bytes == 0
    with pytest.raises(at.InvalidArgumentError, match="buffer_cache_bytes"):
        at.SessionConfig(buffer_cache_bytes=-1)


def test_per_key_keeps_the_most_recent_buffers_of_a_shape() -> None:
    cache = BufferCache(1 << 24, per_key=2)
    given = [owned(fill=float(i)) for i in range(3)]
    for arr in given:
        assert cache.give(arr, owners=2)  # the list entry and the loop variable
    del arr
    stats = cache.stats()
    assert (stats.cached_buffers, stats.evictions, stats.cached_bytes) == (2, 1, 2 * NB)
    taken = {float(cache.take(SHAPE, np.float32)[0, 0]) for _ in range(2)}  # type: ignore[index]
    assert taken == {1.0, 2.0}  # the oldest (0.0) was evicted
    assert cache.take(SHAPE, np.float32) is None
