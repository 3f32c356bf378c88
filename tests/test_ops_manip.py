"""The standard's manipulation functions (``_ops/_manip``) against numpy and array_api_strict."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import array_api_strict
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.array_api import make_strategies_namespace

import aiotensor as at
from aiotensor._cost import estimate_us, out_spec
from aiotensor._opdef import OPS

from ._opcheck import assert_invalid
from ._stdcheck import ParityCase, check_std, run_sync, strict, to_numpy
from .test_ops_shape import arr

DTYPES = [np.float32, np.int64, np.uint8, np.bool_, np.complex128]


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


def _flip(x: Any, axis: Any = None) -> Any:
    return np.flip(x, axis=axis)


async def test_flip(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        for axis in [None, 0, -1, (0, 2)]:
            await check_std(s, "flip", _flip, arr(2, 3, 4, dtype=dt), exact=True, axis=axis)
    await check_std(s, "flip", _flip, np.array(3.0), exact=True)
    await check_std(s, "flip", _flip, arr(0, 2), exact=True, axis=0)
    await check_std(s, "flip", strict("flip"), arr(2, 3, dtype=np.int32), exact=True, axis=1)
    await check_std(s, "flip", _flip, arr(2, 3), axis=2)


def _roll(x: Any, shift: Any, axis: Any = None) -> Any:
    return np.roll(x, shift, axis=axis)


async def test_roll(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        x = arr(3, 4, dtype=dt)
        await check_std(s, "roll", _roll, x, 1, exact=True)
        await check_std(s, "roll", _roll, x, -5, exact=True, axis=1)
        await check_std(s, "roll", _roll, x, (1, 2), exact=True, axis=(0, 1))
    await check_std(s, "roll", _roll, np.array(2.0), 3, exact=True)
    await check_std(s, "roll", _roll, arr(0, 3), 2, exact=True, axis=1)
    await check_std(s, "roll", strict("roll"), arr(5, dtype=np.int16), 7, exact=True)
    await check_std(s, "roll", _roll, arr(2, 3), (1, 2), axis=0)  # shift and axis disagree


async def test_moveaxis(s: at.AsyncEagerSession) -> None:
    x = arr(2, 3, 4)
    for source, destination in [(0, 2), (-1, 0), ((0, 1), (2, 0)), (1, 1)]:
        await check_std(s, "moveaxis", np.moveaxis, x, source, destination, exact=True)
    await check_std(s, "moveaxis", strict("moveaxis"), arr(2, 0, 3, dtype=np.int8), 0, -1, exact=True)
    await check_std(s, "moveaxis", np.moveaxis, x, 3, 0)  # out of range
    await check_std(s, "moveaxis", np.moveaxis, x, (0, 0), (1, 2))  # repeated


def _repeat(x: Any, repeats: Any, axis: Any = None) -> Any:
    return np.repeat(x, np.asarray(repeats).astype(np.int64), axis=axis)


async def test_repeat(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        x = arr(2, 3, dtype=dt)
        await check_std(s, "repeat", _repeat, x, 2, exact=True)
        await check_std(s, "repeat", _repeat, x, 0, exact=True, axis=1)
        await check_std(s, "repeat", _repeat, x, np.array([1, 0, 3]), exact=True, axis=1)  # data-dependent size
    await check_std(s, "repeat", _repeat, arr(3), np.array([2, 1, 0], np.uint64), exact=True)  # numpy refuses uint64
    await check_std(s, "repeat", _repeat, np.array(5.0), 3, exact=True)
    await check_std(s, "repeat", _repeat, arr(0, 2), 4, exact=True, axis=0)
    await check_std(s, "repeat", strict("repeat"), arr(2, 2, dtype=np.float32), np.array([1, 2]), exact=True, axis=0)
    await check_std(s, "repeat", _repeat, arr(3), -1)  # negative
    await check_std(s, "repeat", _repeat, arr(3), np.array([1, 2]))  # wrong length


async def test_repeat_by_counts_inside_an_expression(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.array([1.0, 2.0, 3.0]))
    counts = await s.constant(np.array([2, 0, 1]))
    d = OPS["repeat"]
    total = at.Expr(d, *d.prepare(x * 10.0, counts)).sum()
    np.testing.assert_array_equal(await total.eval(), 50.0)


async def test_tile(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        for reps in [(2,), (2, 1), (1, 3, 2), (0, 2)]:
            await check_std(s, "tile", np.tile, arr(2, 3, dtype=dt), reps, exact=True)
    await check_std(s, "tile", np.tile, np.array(1.5), (2, 2), exact=True)
    await check_std(s, "tile", strict("tile"), arr(3, dtype=np.int32), (2, 2), exact=True)
    await check_std(s, "tile", np.tile, arr(2), (-1,))


def _unstack(x: Any, axis: int = 0) -> Any:
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("0-d")
    return tuple(np.moveaxis(x, axis, 0))


async def test_unstack(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        for axis in (0, 1, -1):
            await check_std(s, "unstack", _unstack, arr(2, 3, 4, dtype=dt), exact=True, axis=axis, container=tuple)
    await check_std(s, "unstack", strict("unstack"), arr(3, 2), exact=True, axis=1, container=tuple)
    await check_std(s, "unstack", _unstack, arr(0, 3), exact=True, axis=1, container=tuple)
    await check_std(s, "unstack", _unstack, np.array(1.0))
    await check_std(s, "unstack", _unstack, arr(2, 3), axis=2)


def _broadcast_arrays(*arrays: Any) -> Any:
    return [a.copy() for a in np.broadcast_arrays(*arrays)]


async def test_broadcast_arrays(s: at.AsyncEagerSession) -> None:
    cases = [
        (arr(2, 1), arr(1, 3)),
        (arr(3, dtype=np.int8), np.array(2.0), arr(2, 1, 3, dtype=np.bool_)),
        (arr(4),),
        (arr(0, 1), arr(1, 5)),
    ]
    for arrays in cases:
        await check_std(s, "broadcast_arrays", _broadcast_arrays, *arrays, exact=True, container=list)
    await check_std(s, "broadcast_arrays", strict("broadcast_arrays"), arr(2, 1), arr(3), exact=True)
    await check_std(s, "broadcast_arrays", _broadcast_arrays, arr(2), arr(3))


def _take_along_axis(x: Any, indices: Any, axis: int = -1) -> Any:
    return np.take_along_axis(x, indices, axis=axis)


async def test_take_along_axis(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        x = arr(3, 4, dtype=dt)
        await check_std(s, "take_along_axis", _take_along_axis, x, np.argsort(arr(3, 4), axis=1), exact=True)
        await check_std(s, "take_along_axis", _take_along_axis, x, np.array([[0, 2, 1, 0]]), exact=True, axis=0)
    await check_std(s, "take_along_axis", _take_along_axis, arr(3, 4), np.array([[-1], [0], [3]]), exact=True)
    await check_std(s, "take_along_axis", _take_along_axis, arr(2, 0), np.zeros((2, 0), np.int64), exact=True)
    idx = np.array([[1], [0]])
    await check_std(s, "take_along_axis", strict("take_along_axis"), arr(2, 3), idx, exact=True, axis=1)
    await check_std(s, "take_along_axis", _take_along_axis, arr(2, 3), np.array([[5]]))  # out of bounds
    await check_std(s, "take_along_axis", _take_along_axis, arr(2, 3), np.array([[0.5]]))  # float indices


async def test_bad_arguments(sc: at.AsyncEagerSession) -> None:
    x = await sc.constant(arr(2, 3))
    await assert_invalid(sc, lambda: sc.flip(x, axis="0"), "flip", "axis")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.roll(x, 1.5), "roll", "shift")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.moveaxis(x, "a", 0), "moveaxis", "source")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.repeat(x, 1.5), "repeat", "integers")
    await assert_invalid(sc, lambda: sc.tile(x, "ab"), "tile", "repetitions")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.broadcast_arrays(), "broadcast_arrays")
    await assert_invalid(sc, lambda: sc.unstack("abc"), "unstack")


PARITY_CASES: list[ParityCase] = [
    ("flip", (arr(2, 3),), {"axis": 0}, _flip),
    ("roll", (arr(2, 3), 1), {"axis": 1}, _roll),
    ("moveaxis", (arr(2, 3, 4), 0, -1), {}, np.moveaxis),
    ("repeat", (arr(3), np.array([1, 0, 2])), {}, _repeat),
    ("tile", (arr(2, 3), (2, 1)), {}, np.tile),
    ("unstack", (arr(2, 3),), {"axis": 1}, _unstack),
    ("broadcast_arrays", (arr(2, 1), arr(3)), {}, _broadcast_arrays),
    ("take_along_axis", (arr(2, 3), np.array([[2], [0]])), {"axis": 1}, _take_along_axis),
]


def test_ops_whose_output_size_is_unknown_ahead_are_never_estimated() -> None:
    # Outputs far larger than the inputs (tile, repeat, meshgrid) or sized by the data
    # (nonzero, unique_*): the estimate says "unknown" (inf: never inlined), not a guess.
    x = np.ones(4)
    cases = [
        ("repeat", (x, 10**6)),
        ("tile", (x, (1000, 1000))),
        ("meshgrid", (x, x)),
        ("nonzero", (x,)),
        ("unique_all", (x,)),
        ("unique_values", (x,)),
    ]
    for name, args in cases:
        d = OPS[name]
        assert estimate_us(d, args, None, None) == math.inf, name
        assert out_spec(d, args, None) is None, name


# -- differential: hypothesis-drawn arrays against array_api_strict ---------------------

xps = make_strategies_namespace(array_api_strict, api_version="2024.12")


@pytest.mark.parametrize("name", ["flip", "roll", "moveaxis", "repeat", "tile", "unstack"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_against_array_api_strict(loop_session: Any, name: str, data: st.DataObject) -> None:
    dtype = data.draw(xps.scalar_dtypes(), label="dtype")
    x = data.draw(xps.arrays(dtype, xps.array_shapes(min_dims=1, max_side=4)), label="x")
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    if name == "flip":
        kwargs["axis"] = data.draw(st.none() | xps.valid_tuple_axes(x.ndim), label="axes")
    elif name == "roll":
        args.append(data.draw(st.integers(-6, 6), label="shift"))
        kwargs["axis"] = data.draw(st.none() | st.just(axis), label="axis")
    elif name == "moveaxis":
        args += [axis, data.draw(st.integers(-x.ndim, x.ndim - 1), label="destination")]
    elif name == "repeat":
        args.append(data.draw(st.integers(0, 3), label="repeats"))
        kwargs["axis"] = data.draw(st.none() | st.just(axis), label="axis")
    elif name == "tile":
        args.append(tuple(data.draw(st.lists(st.integers(0, 3), max_size=3), label="repetitions")))
    else:
        assume(x.shape[axis] > 0)  # (an empty tuple of results: not supported, see the report)
        kwargs["axis"] = axis
    want = to_numpy(getattr(array_api_strict, name)(x, *args, **kwargs))
    got = run_sync(loop_session, name, [to_numpy(x), *args], kwargs)
    if isinstance(want, tuple):
        assert type(got) is tuple
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, strict=True)
    else:
        np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.parametrize("row", PARITY_CASES, ids=[row[0] for row in PARITY_CASES])
async def test_parity_rows_hold(s: at.AsyncEagerSession, row: ParityCase) -> None:
    # The rows the parity matrix takes: each holds on every surface here.
    name, args, kwargs, reference = row
    await check_std(s, name, reference, *args, exact=False, **kwargs)
