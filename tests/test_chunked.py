"""Chunked element-wise ops: element for element what NumPy computes in one call."""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from aiotensor._backends._chunked import (
    CHUNK_MIN_BYTES,
    chunk_bounds,
    chunked_ufunc,
    executor_spawn,
    inline_spawn,
    should_chunk,
)


@pytest.fixture(scope="module")
def pool() -> Iterator[concurrent.futures.ThreadPoolExecutor]:
    with concurrent.futures.ThreadPoolExecutor(3) as executor:
        yield executor


@pytest.fixture(params=["inline", "threads"])
def spawn(request: pytest.FixtureRequest, pool: concurrent.futures.Executor) -> Callable[[Callable[[], None]], object]:
    """Each block schedule: participants run in turn on this thread, or on real threads."""
    return inline_spawn if request.param == "inline" else executor_spawn(pool)


def data(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(1, 50, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.random(shape) + 0.1 + 1j * rng.random(shape)).astype(dt)
    return (rng.random(shape) * 4 + 0.25).astype(dt)


def check(ufunc: np.ufunc, *inputs: Any, spawn: Any, workers: int = 3, block_bytes: int = 64) -> None:
    """The chunked result (tiny blocks: many of them) equals numpy's, dtype and values, with and without out=."""
    with np.errstate(all="ignore"):
        try:
            expected = ufunc(*inputs)
        except Exception as exc:  # e.g. uint8 * -2 (NEP 50): the same error, chunked or not
            with pytest.raises(type(exc)):
                chunked_ufunc(ufunc, *inputs, spawn=spawn, workers=workers, block_bytes=block_bytes)
            return
        got = chunked_ufunc(ufunc, *inputs, spawn=spawn, workers=workers, block_bytes=block_bytes)
        np.testing.assert_array_equal(got, expected, strict=True)
        out = np.full(expected.shape, 7, expected.dtype)
        given = chunked_ufunc(ufunc, *inputs, spawn=spawn, workers=workers, out=out, block_bytes=block_bytes)
    assert given is out
    np.testing.assert_array_equal(out, expected, strict=True)


BINARY: list[np.ufunc] = [
    np.add,
    np.subtract,
    np.multiply,
    np.true_divide,
    np.floor_divide,
    np.power,
    np.maximum,
    np.fmin,
]
BINARY += [np.greater_equal, np.not_equal, np.logical_xor, np.arctan2, np.hypot, np.fmod, np.remainder]
UNARY: list[np.ufunc] = [
    np.negative,
    np.absolute,
    np.sqrt,
    np.exp,
    np.log,
    np.sin,
    np.tanh,
    np.floor,
    np.square,
    np.isnan,
]
INT_ONLY: list[np.ufunc] = [np.bitwise_and, np.left_shift, np.gcd]
SHAPES = [(2,), (7,), (5, 3), (257, 3), (3, 257), (17, 5, 3), (1001,)]


@pytest.mark.parametrize("ufunc", BINARY, ids=lambda u: u.__name__)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "uint8"])
def test_binary_ufuncs_equal_numpy(ufunc: np.ufunc, dtype: str, spawn: Any) -> None:
    for shape in SHAPES:
        check(ufunc, data(shape, dtype, 1), data(shape, dtype, 2), spawn=spawn)


@pytest.mark.parametrize("ufunc", UNARY, ids=lambda u: u.__name__)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "int16"])
def test_unary_ufuncs_equal_numpy(ufunc: np.ufunc, dtype: str, spawn: Any) -> None:
    if dtype == "complex64" and ufunc in (np.floor,):
        pytest.skip("numpy has no complex floor")
    for shape in SHAPES:
        check(ufunc, data(shape, dtype), spawn=spawn)


@pytest.mark.parametrize("ufunc", INT_ONLY, ids=lambda u: u.__name__)
def test_integer_ufuncs_equal_numpy(ufunc: np.ufunc, spawn: Any) -> None:
    for shape in SHAPES:
        check(ufunc, data(shape, np.int32, 1), data(shape, np.int32, 2) % 8, spawn=spawn)


def test_bool_inputs(spawn: Any) -> None:
    a, b = data((301, 4), np.bool_, 1), data((301, 4), np.bool_, 2)
    for ufunc in (np.add, np.logical_and, np.multiply, np.bitwise_xor, np.greater):
        check(ufunc, a, b, spawn=spawn)
    check(np.add, a, 1, spawn=spawn)  # bool + python int: int64 (NEP 50)
    check(np.add, a, True, spawn=spawn)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param((300, 7), (7,), id="row-vector"),
        pytest.param((300, 7), (1, 7), id="leading-one"),
        pytest.param((300, 7), (300, 1), id="column"),
        pytest.param((300, 1), (1, 7), id="outer"),
        pytest.param((1, 7), (300, 7), id="left-broadcast"),
        pytest.param((300, 1, 5), (4, 5), id="3d-middle"),
        pytest.param((7,), (300, 7), id="fewer-dims-first"),
        pytest.param((300, 7), (), id="0d-array"),
    ],
)
def test_broadcasting(left: tuple[int, ...], right: tuple[int, ...], spawn: Any) -> None:
    for dtype in ("float32", "int64"):
        check(np.add, data(left, dtype, 1), data(right, dtype, 2), spawn=spawn)
        check(np.subtract, data(right, dtype, 3), data(left, dtype, 4), spawn=spawn)


@pytest.mark.parametrize(
    "scalar",
    [1.5, 3, -2, True, 2j, np.float32(2.5), np.int8(3), np.float64(0.5)],
    ids=lambda s: f"{type(s).__name__}({s})",
)
@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8", "bool"])
def test_scalars_keep_nep50_dtypes(scalar: Any, dtype: str, spawn: Any) -> None:
    a = data((129, 3), dtype)
    check(np.multiply, a, scalar, spawn=spawn)
    check(np.add, scalar, a, spawn=spawn)


def test_out_with_another_dtype_casts_like_numpy(spawn: Any) -> None:
    a, b = data((200, 3), np.float32, 1), data((200, 3), np.float32, 2)
    out = np.empty((200, 3), np.float64)
    chunked_ufunc(np.add, a, b, spawn=spawn, workers=2, out=out, block_bytes=64)
    np.testing.assert_array_equal(out, np.add(a, b, out=np.empty((200, 3), np.float64)), strict=True)


def test_out_larger_than_the_inputs_broadcasts_like_numpy(spawn: Any) -> None:
    a = data((3,), np.float64)
    out = np.empty((200, 3))
    chunked_ufunc(np.add, a, 1.0, spawn=spawn, workers=2, out=out, block_bytes=64)
    np.testing.assert_array_equal(out, np.add(a, 1.0, out=np.empty((200, 3))), strict=True)


def test_in_place_on_an_input(spawn: Any) -> None:
    a = data((500, 3), np.float64)
    expected = a + 1.0
    got = chunked_ufunc(np.add, a, 1.0, spawn=spawn, workers=2, out=a, block_bytes=64)
    assert got is a
    np.testing.assert_array_equal(a, expected, strict=True)


def test_an_input_overlapping_out_at_another_position_falls_back(spawn: Any) -> None:
    base = np.arange(1001, dtype=np.float64)
    expected = base.copy()
    np.add(expected[:-1], 1.0, out=expected[1:])
    chunked_ufunc(np.add, base[:-1], 1.0, spawn=spawn, workers=2, out=base[1:], block_bytes=64)
    np.testing.assert_array_equal(base, expected, strict=True)


@pytest.mark.parametrize(
    ("ufunc", "args"),
    [
        pytest.param(np.divmod, (np.ones((10, 2)), 3.0), id="two-outputs"),
        pytest.param(np.add, (np.ones((1, 100)), 1.0), id="one-row"),
        pytest.param(np.add, (np.float64(1.0), 2.0), id="0d"),
        pytest.param(np.add, (np.ones((10, 2)), [1.0, 2.0]), id="list-input"),
    ],
)
def test_what_cannot_be_split_is_one_numpy_call(ufunc: np.ufunc, args: tuple[Any, ...]) -> None:
    def refuse(fn: Callable[[], None]) -> None:
        raise AssertionError("nothing should be spawned")

    got = chunked_ufunc(ufunc, *args, spawn=refuse, workers=2, block_bytes=8)
    expected = ufunc(*args)
    if isinstance(expected, tuple):
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(g, e, strict=True)
    else:
        np.testing.assert_array_equal(got, expected, strict=True)


def test_errors_are_numpys(spawn: Any) -> None:
    with pytest.raises(ValueError, match="broadcast"):
        chunked_ufunc(np.add, np.ones((10, 3)), np.ones((10, 4)), spawn=spawn, workers=2)
    with pytest.raises(TypeError, match="not supported"):
        chunked_ufunc(np.bitwise_and, np.ones((10, 3)), np.ones((10, 3)), spawn=spawn, workers=2)


def test_floating_point_errors_follow_the_callers_errstate(spawn: Any) -> None:
    a = np.ones((400, 3))
    a[-1, -1] = 0.0  # in the last block, which a worker may run
    with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
        chunked_ufunc(np.divide, 1.0, a, spawn=spawn, workers=3, block_bytes=64)
    with np.errstate(divide="ignore"):
        got = chunked_ufunc(np.divide, 1.0, a, spawn=spawn, workers=3, block_bytes=64)
    assert np.isinf(got[-1, -1])


def test_a_failing_block_stops_the_rest() -> None:
    # inline_spawn runs the first spawned participant at once: it takes block 0, which
    # fails, so no other block may run afterwards (out keeps its sentinel there).
    a = np.ones((400, 3))
    a[0, 0] = 0.0
    out = np.full((400, 3), 7.0)
    with np.errstate(divide="raise"), pytest.raises(FloatingPointError):
        chunked_ufunc(np.divide, 1.0, a, spawn=inline_spawn, workers=2, out=out, block_bytes=64)
    first_block_end = chunk_bounds(400, out.nbytes // 64)[0][1]
    assert (out[first_block_end:] == 7.0).all()


def test_a_worker_that_never_starts_cannot_hold_the_op_back() -> None:
    spawned: list[Callable[[], None]] = []
    a = data((1000, 3), np.float32)
    got = chunked_ufunc(np.sqrt, a, spawn=spawned.append, workers=4, block_bytes=64)
    assert len(spawned) == 3
    np.testing.assert_array_equal(got, np.sqrt(a), strict=True)
    for late in spawned:  # waking up after the op returned: nothing left to do
        late()
    np.testing.assert_array_equal(got, np.sqrt(a), strict=True)


def test_a_spawn_that_raises_leaves_the_work_to_the_caller() -> None:
    def shut_down(fn: Callable[[], None]) -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    a = data((1000, 3), np.float32)
    np.testing.assert_array_equal(
        chunked_ufunc(np.sqrt, a, spawn=shut_down, workers=2, block_bytes=64), np.sqrt(a), strict=True
    )


def test_blocks_really_run_on_several_threads(pool: concurrent.futures.Executor) -> None:
    seen: set[int] = set()
    gate = threading.Barrier(2, timeout=10)
    met = threading.Event()

    def meet(x: float) -> float:
        seen.add(threading.get_ident())
        if not met.is_set():
            gate.wait()  # the first block cannot finish until a second thread runs one
            met.set()
        return -x

    # An object-dtype ufunc: called per element, so it can wait for the other thread.
    ufunc = np.frompyfunc(meet, 1, 1)
    got = chunked_ufunc(ufunc, np.arange(64.0), spawn=executor_spawn(pool), workers=2, out=np.empty(64, object))
    np.testing.assert_array_equal(got.astype(float), -np.arange(64.0))
    assert len(seen) == 2


def test_returns_only_when_every_block_is_done(pool: concurrent.futures.Executor) -> None:
    caller = threading.get_ident()
    gate = threading.Barrier(2, timeout=10)
    met = threading.Event()

    def slow_on_worker(x: float) -> float:
        if not met.is_set():
            gate.wait()  # both participants hold a block
            met.set()
        if threading.get_ident() != caller:
            time.sleep(0.002)  # the worker's block ends well after the caller's
        return -x

    ufunc = np.frompyfunc(slow_on_worker, 1, 1)
    out = np.full(40, None, object)
    chunked_ufunc(ufunc, np.arange(40.0), spawn=executor_spawn(pool), workers=2, out=out, block_bytes=out.nbytes // 2)
    np.testing.assert_array_equal(out.astype(float), -np.arange(40.0))


@pytest.mark.parametrize(("rows", "chunks"), [(1, 1), (1, 4), (5, 2), (7, 3), (100, 7), (3, 100)])
def test_chunk_bounds_cover_the_rows_evenly(rows: int, chunks: int) -> None:
    bounds = chunk_bounds(rows, chunks)
    assert len(bounds) == min(rows, chunks)
    assert bounds[0][0] == 0
    assert bounds[-1][1] == rows
    assert all(hi == lo2 for (_, hi), (lo2, _) in itertools.pairwise(bounds))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
    assert min(sizes) >= 1


def test_should_chunk() -> None:
    assert should_chunk(CHUNK_MIN_BYTES, (1024, 2048), workers=2)
    assert not should_chunk(CHUNK_MIN_BYTES - 1, (1024, 2048), workers=2)
    assert not should_chunk(CHUNK_MIN_BYTES, (1024, 2048), workers=1)
    assert not should_chunk(CHUNK_MIN_BYTES, (1, 2 * CHUNK_MIN_BYTES), workers=2)
    assert not should_chunk(CHUNK_MIN_BYTES, (), workers=2)
