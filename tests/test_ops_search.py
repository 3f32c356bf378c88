"""Sorting, searching and set functions (``_ops/_search``) against numpy and array_api_strict.

Every surface (session, module, fused ``ops``, expression node); the named tuples of the
``unique_*`` functions; data-dependent output shapes inside an evaluated expression.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import array_api_strict
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.array_api import make_strategies_namespace

import aiotensor as at
from aiotensor._opdef import OPS
from aiotensor._ops._search import UniqueAllResult, UniqueCountsResult, UniqueInverseResult

from ._opcheck import assert_invalid
from ._stdcheck import ParityCase, check_std, run_sync, strict, to_numpy

_rng = np.random.default_rng(2828)
DTYPES = [np.float32, np.float64, np.int8, np.int32, np.int64, np.uint16]


def ties(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Small integers with many repeats (so stability and counts matter)."""
    return np.asarray(_rng.integers(0, 4, size=shape)).astype(dtype)


WITH_NAN = np.array([3.0, np.nan, -0.0, 1.0, np.nan, 0.0, -np.inf, 1.0, np.inf])


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


def _np_sort(x: Any, axis: int = -1, descending: bool = False, stable: bool = True) -> Any:
    out = np.sort(x, axis=axis, kind="stable")
    return np.flip(out, axis=axis) if descending else out


@pytest.mark.parametrize("name", ["sort", "argsort"])
async def test_sort_and_argsort_match_array_api_strict(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    for dt in DTYPES:
        for shape, axis in [((9,), -1), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), -2), ((0, 3), 0), ((4, 0), -1)]:
            for descending in (False, True):
                x = ties(shape, dt)
                await check_std(s, name, ref, x, exact=True, axis=axis, descending=descending)
    for descending in (False, True):  # NaN last ascending (first descending), infinities in order
        await check_std(s, name, ref, WITH_NAN, exact=True, descending=descending)
    await check_std(s, name, ref, ties((3,), np.float64), axis=1)  # out of range
    await check_std(s, name, ref, np.array(1.0))  # 0-d: no axis to sort


async def test_unstable_sort_gives_sorted_values(s: at.AsyncEagerSession) -> None:
    x = ties((50,), np.int32)
    got = await (await s.sort(x, stable=False)).numpy()
    np.testing.assert_array_equal(got, np.sort(x))
    idx = await (await s.argsort(x, stable=False, descending=True)).numpy()
    np.testing.assert_array_equal(x[idx], np.sort(x)[::-1])


async def test_sort_of_bool_and_names_of_results(s: at.AsyncEagerSession) -> None:
    await check_std(s, "sort", _np_sort, np.array([True, False, True]), exact=True)  # beyond the standard: numpy's


def _np_searchsorted(x1: Any, x2: Any, side: Literal["left", "right"] = "left", sorter: Any = None) -> Any:
    if np.ndim(x1) != 1:
        raise ValueError("1-d")
    return np.asarray(np.searchsorted(x1, x2, side=side, sorter=sorter))


async def test_searchsorted(s: at.AsyncEagerSession) -> None:
    sorted_x = np.sort(ties((12,), np.float64))
    for x2 in (ties((3, 4), np.float64), ties((0,), np.float64), np.array(2.0), np.array([np.nan, -np.inf, np.inf])):
        for side in ("left", "right"):
            await check_std(s, "searchsorted", strict("searchsorted"), sorted_x, x2, exact=True, side=side)
    unsorted = ties((10,), np.int32)
    sorter = np.argsort(unsorted, kind="stable")
    await check_std(s, "searchsorted", strict("searchsorted"), unsorted, ties((5,), np.int32), sorter=sorter)
    await check_std(s, "searchsorted", _np_searchsorted, sorted_x, 1.5)  # a python scalar
    await check_std(s, "searchsorted", _np_searchsorted, np.array([1, 2, 3], np.int8), np.array([1.5, 2.5]))
    await check_std(s, "searchsorted", _np_searchsorted, ties((2, 3), np.float64), ties((2,), np.float64))


async def test_nonzero(s: at.AsyncEagerSession) -> None:
    ref = strict("nonzero")
    for x in (ties((3, 4), np.int32), ties((2, 3, 2), np.float32) > 1, WITH_NAN, np.zeros((0, 3)), np.zeros((2, 2))):
        await check_std(s, "nonzero", ref, x, exact=True, container=tuple)
    await check_std(s, "nonzero", ref, np.array([0j, 1j, 2.0 + 0j]), exact=True, container=tuple)
    await check_std(s, "nonzero", np.nonzero, np.array(1.0))  # 0-d: the standard (and numpy 2) refuse it


UNIQUES = {
    "unique_all": UniqueAllResult,
    "unique_counts": UniqueCountsResult,
    "unique_inverse": UniqueInverseResult,
}


@pytest.mark.parametrize("name", [*sorted(UNIQUES), "unique_values"])
async def test_unique_functions(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    container = UNIQUES.get(name)
    cases = [ties((3, 4), dt) for dt in DTYPES] + [WITH_NAN, np.zeros((0,)), np.array(5.0), ties((2, 3), np.bool_)]
    for x in cases:
        await check_std(s, name, ref, x, exact=True, container=container)


async def test_unique_named_fields_and_nan_are_distinct(s: at.AsyncEagerSession) -> None:
    x = np.array([[2.0, np.nan], [2.0, np.nan]])
    res = await s.unique_all(x)
    assert res._fields == ("values", "indices", "inverse_indices", "counts")
    assert np.isnan(await res.values.numpy()).sum() == 2  # each NaN is its own value
    assert (await res.counts.numpy()).tolist() == [2, 1, 1]
    inv = await res.inverse_indices.numpy()
    assert inv.shape == (2, 2)
    np.testing.assert_array_equal((await res.values.numpy())[inv][0, 0], 2.0)
    counts = await at.unique_counts(await s.constant([3, 1, 3]))
    assert (await counts.values.numpy()).tolist() == [1, 3]
    inverse = await s.unique_inverse([3, 1, 3])
    assert (await inverse.inverse_indices.numpy()).tolist() == [1, 0, 1]


async def test_data_dependent_shapes_inside_an_expression(s: at.AsyncEagerSession) -> None:
    # A unique/nonzero step inside one evaluated program: later steps see the run-time shape.
    x = await s.constant(np.array([4.0, 1.0, 4.0, 2.0, 1.0]))
    d = OPS["unique_values"]
    e = at.Expr(d, *d.prepare(x)) * 10.0
    np.testing.assert_array_equal(await e.eval(), [10.0, 20.0, 40.0])
    (idx,) = await at.Expr(OPS["nonzero"], *OPS["nonzero"].prepare(x - 4.0))
    np.testing.assert_array_equal(await idx.numpy(), [1, 3, 4])
    counts = await at.Expr(OPS["unique_counts"], *OPS["unique_counts"].prepare(x))
    assert type(counts) is UniqueCountsResult
    np.testing.assert_array_equal(await counts.counts.numpy(), [2, 1, 2])


def _np_isin(x1: Any, x2: Any, invert: bool = False) -> Any:
    return np.isin(x1, x2, invert=invert)


async def test_isin(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES:
        for invert in (False, True):
            await check_std(s, "isin", _np_isin, ties((3, 4), dt), ties((5,), dt), exact=True, invert=invert)
    await check_std(s, "isin", _np_isin, WITH_NAN, np.array([np.nan, 1.0, -0.0]), exact=True)  # NaN is in nothing
    await check_std(s, "isin", _np_isin, ties((0,), np.int32), ties((3,), np.int64), exact=True)
    await check_std(s, "isin", _np_isin, np.array(2), ties((2, 2), np.int32), exact=True)
    # isin is the standard's from 2025.12: its reference needs that version, whatever
    # another test module (test_xp pins 2024.12 at import) set for the whole process.
    with array_api_strict.ArrayAPIStrictFlags(api_version="2025.12"):
        await check_std(s, "isin", strict("isin"), ties((3, 2), np.int32), ties((4,), np.int32), exact=True)


async def test_bad_arguments(sc: at.AsyncEagerSession) -> None:
    x = await sc.constant(ties((3,), np.float64))
    await assert_invalid(sc, lambda: sc.sort(x, descending="yes"), "sort", "descending")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.argsort(x, stable=None), "argsort", "stable")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.sort(x, axis=4), "sort")
    await assert_invalid(sc, lambda: sc.searchsorted(x, x, side="middle"), "searchsorted", "side")
    await assert_invalid(sc, lambda: sc.isin(x, x, invert=1), "isin", "invert")  # type: ignore[arg-type]
    scalar = await sc.constant(3.0)
    await assert_invalid(sc, lambda: sc.nonzero(scalar), "nonzero")
    await assert_invalid(sc, lambda: sc.unique_all("abc"), "unique_all")
    await assert_invalid(sc, lambda: sc.unique_values(None), "unique_values")


PARITY_CASES: list[ParityCase] = [
    ("sort", (ties((3, 4), np.float64),), {"axis": 0, "descending": True}, _np_sort),
    ("argsort", (ties((6,), np.int32),), {}, lambda x: np.argsort(x, kind="stable")),
    ("searchsorted", (np.arange(5.0), ties((3,), np.float64)), {"side": "right"}, _np_searchsorted),
    ("nonzero", (ties((2, 3), np.int64),), {}, np.nonzero),
    ("unique_all", (ties((6,), np.float64),), {}, strict("unique_all")),
    ("unique_counts", (ties((6,), np.int32),), {}, strict("unique_counts")),
    ("unique_inverse", (ties((2, 3), np.float32),), {}, strict("unique_inverse")),
    ("unique_values", (ties((6,), np.int8),), {}, strict("unique_values")),  # (numpy 2 may not sort integers)
    ("isin", (ties((2, 3), np.int64), ties((2,), np.int64)), {}, _np_isin),
]


# -- differential: hypothesis-drawn arrays against array_api_strict ---------------------

xps = make_strategies_namespace(array_api_strict, api_version="2024.12")


@pytest.mark.parametrize("name", ["sort", "argsort", "nonzero", *sorted(UNIQUES), "unique_values"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_against_array_api_strict(loop_session: Any, name: str, data: st.DataObject) -> None:
    sorting = name in ("sort", "argsort")
    dtype = data.draw(xps.real_dtypes() if sorting else xps.scalar_dtypes(), label="dtype")
    min_dims = 0 if name.startswith("unique") else 1
    x = data.draw(xps.arrays(dtype, xps.array_shapes(min_dims=min_dims, min_side=0, max_side=5)), label="x")
    kwargs: dict[str, Any] = {}
    if sorting:
        kwargs["axis"] = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
        kwargs["descending"] = data.draw(st.booleans(), label="descending")
    want = to_numpy(getattr(array_api_strict, name)(x, **kwargs))
    got = run_sync(loop_session, name, [to_numpy(x)], kwargs)
    if isinstance(want, tuple):
        assert type(got).__name__ == type(want).__name__  # the standard's named tuple (or a tuple)
        assert getattr(got, "_fields", None) == getattr(want, "_fields", None)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, strict=True)
    else:
        np.testing.assert_array_equal(got, want, strict=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_searchsorted_differential(loop_session: Any, data: st.DataObject) -> None:
    dtype = data.draw(xps.real_dtypes(), label="dtype")
    x1 = array_api_strict.sort(data.draw(xps.arrays(dtype, st.integers(0, 8)), label="x1"))
    x2 = data.draw(xps.arrays(dtype, xps.array_shapes(min_dims=0, max_side=4)), label="x2")
    side = data.draw(st.sampled_from(["left", "right"]), label="side")
    want = to_numpy(array_api_strict.searchsorted(x1, x2, side=side))  # type: ignore[arg-type]
    got = run_sync(loop_session, "searchsorted", [to_numpy(x1), to_numpy(x2)], {"side": side})
    np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.parametrize("row", PARITY_CASES, ids=[row[0] for row in PARITY_CASES])
async def test_parity_rows_hold(s: at.AsyncEagerSession, row: ParityCase) -> None:
    # The rows the parity matrix takes: each holds on every surface here.
    name, args, kwargs, reference = row
    await check_std(s, name, reference, *args, exact=False, **kwargs)
