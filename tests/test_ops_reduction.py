"""Reductions and softmax against numpy: axes, keepdims, dtypes, empty inputs and errors."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import array_api_strict
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.array_api import make_strategies_namespace

import aiotensor as at

from ._opcheck import assert_invalid, check_op
from ._stdcheck import ParityCase, check_std, run_sync, strict, to_numpy

REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": np.sum,
    "prod": np.prod,
    "mean": np.mean,
    "max": np.max,
    "min": np.min,
    "std": np.std,
    "var": np.var,
    "argmax": np.argmax,
    "argmin": np.argmin,
}
ARG_REDUCTIONS = {"argmax", "argmin"}  # one axis or None
NEEDS_NONEMPTY = {"mean", "std", "var"}  # numpy warns "empty slice" and gives NaN

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]
_rng = np.random.default_rng(7)


def _reference(fn: Callable[..., Any]) -> Callable[..., Any]:
    # numpy takes several axes only as a tuple; our ops also take a list
    def ref(x: Any, **kwargs: Any) -> Any:
        if isinstance(kwargs.get("axis"), list):
            kwargs["axis"] = tuple(kwargs["axis"])
        return fn(x, **kwargs)

    return ref


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
async def test_reduction_matches_numpy(s: at.AsyncEagerSession, name: str) -> None:
    ref = _reference(REDUCTIONS[name])
    axes: list[Any] = [None, 0, 1, -1] if name in ARG_REDUCTIONS else [None, 0, 1, -1, (0, 1), [0, 2], ()]
    for dt in DTYPES:
        x: np.ndarray = np.asarray(_rng.integers(-3, 4, size=(2, 3, 4))).astype(dt)
        for axis in axes:
            for keepdims in (False, True):
                await check_op(s, name, ref, x, axis=axis, keepdims=keepdims, rtol=1e-5)
        await check_op(s, name, ref, np.asarray(x[0, 0, 0]))  # 0-d
        await check_op(s, name, ref, x[0, 0].tolist())  # a python list
    await check_op(s, name, ref, np.zeros((0, 3)), axis=1)  # zero rows of three: an empty result
    if name not in NEEDS_NONEMPTY:
        empty: list[np.ndarray] = [np.zeros((0, 3)), np.zeros((3, 0), np.int32)]
        for x in empty:
            await check_op(s, name, ref, x)  # max/min/argmax of nothing: both raise
            await check_op(s, name, ref, x, axis=1)


async def test_reduction_options(s: at.AsyncEagerSession) -> None:
    x = np.asarray(_rng.normal(size=(3, 5)))
    for name in ("std", "var"):
        for correction in (0, 1, 0.5):
            await check_op(s, name, REDUCTIONS[name], x, axis=1, correction=correction, rtol=1e-12)
    i8 = np.array([100, 100, 100], np.int8)
    await check_op(s, "sum", np.sum, i8)  # numpy sums small ints in the default int
    await check_op(s, "sum", np.sum, i8, dtype=np.int8)  # wraps around, as numpy
    await check_op(s, "prod", np.prod, i8, dtype=np.float32)
    await check_op(s, "sum", np.sum, x.astype(np.float32), dtype="float64", axis=0)
    nan = np.array([1.0, np.nan, 3.0])
    for name in ("sum", "max", "min", "mean", "argmax"):
        await check_op(s, name, REDUCTIONS[name], nan)  # NaN propagates (argmax finds it)
    t = await s.constant(x)
    assert (await s.sum(t, axis=0, keepdims=True, name="colsum")).name == "colsum"


def _naive_softmax(x: Any, axis: int) -> Any:
    # the textbook formula in float64, independent of the kernel's max-shifted form
    x = np.asarray(x)
    out_dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    e = np.exp(x.astype(np.float64))
    return (e / e.sum(axis=axis, keepdims=True)).astype(out_dtype)


def _naive_log_softmax(x: Any, axis: int) -> Any:
    sm = _naive_softmax(x, axis)
    return np.log(sm.astype(np.float64)).astype(sm.dtype)


@pytest.mark.parametrize(("name", "ref"), [("softmax", _naive_softmax), ("log_softmax", _naive_log_softmax)])
async def test_softmax(s: at.AsyncEagerSession, name: str, ref: Callable[..., Any]) -> None:
    for dt in (np.float32, np.float64, np.int32, np.int64):
        x = np.asarray(_rng.integers(-5, 6, size=(3, 4))).astype(dt)
        # float32 log_softmax near 0 is x - max - log(sum): absolute error ~ eps * |x|
        atol = 1e-5 if dt == np.float32 else 0.0
        for axis in (-1, 0, 1):
            await check_op(s, name, lambda a, axis: ref(a, axis), x, axis=axis, rtol=1e-5, atol=atol)
        await check_op(s, name, lambda a: ref(a, -1), x[0], rtol=1e-5, atol=atol)  # default axis=-1
    # large inputs: no overflow (exp(1000) is inf), the result is still a distribution
    big = await s.constant([[1000.0, 1000.0, 0.0], [-1000.0, 0.0, 1000.0]])
    sm = await (await s.softmax(big)).numpy()
    np.testing.assert_allclose(sm, [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]], atol=1e-300)
    lsm = await (await s.log_softmax(big)).numpy()
    np.testing.assert_allclose(lsm, [[-np.log(2), -np.log(2), -1000.0 - np.log(2)], [-2000.0, -1000.0, 0.0]])
    assert np.all(np.isfinite(lsm))


_ErrorCall = Callable[[at.AsyncEagerSession, at.Tensor], Awaitable[Any]]
REDUCTION_ERRORS: list[tuple[str, _ErrorCall, str, tuple[str, ...]]] = [
    ("sum-axis", lambda s, t: s.sum(t, axis=2), "sum", ("float64[2, 3]", "out of bounds")),
    ("mean-axis-negative", lambda s, t: s.mean(t, axis=-3), "mean", ("float64[2, 3]",)),
    ("max-repeated-axis", lambda s, t: s.max(t, axis=(0, 0)), "max", ("float64[2, 3]",)),
    ("min-axis-str", lambda s, t: s.min(t, axis="a"), "min", ("float64[2, 3]",)),  # type: ignore[arg-type]
    ("argmax-tuple-axis", lambda s, t: s.argmax(t, axis=(0, 1)), "argmax", ("float64[2, 3]",)),  # type: ignore[arg-type]
    ("argmin-axis", lambda s, t: s.argmin(t, axis=5), "argmin", ("float64[2, 3]",)),
    ("max-empty", lambda s, t: s.max(np.zeros((0, 2))), "max", ("float64[0, 2]", "identity")),
    ("argmax-empty", lambda s, t: s.argmax([]), "argmax", ()),
    ("sum-dtype-str", lambda s, t: s.sum(t, dtype="U2"), "sum", ("<U2",)),
    ("prod-dtype-bogus", lambda s, t: s.prod(t, dtype="bogus"), "prod", ("bogus",)),
    ("softmax-axis", lambda s, t: s.softmax(t, axis=2), "softmax", ("float64[2, 3]",)),
    ("log-softmax-bool", lambda s, t: s.log_softmax([True, False]), "log_softmax", ()),
    ("std-None", lambda s, t: s.std(None), "std", ("None",)),
    ("var-str", lambda s, t: s.var("abc"), "var", ("'abc'",)),
    ("mean-object", lambda s, t: s.mean(np.array([1, 2], dtype=object)), "mean", ("object",)),
    ("sum-ragged", lambda s, t: s.sum([[1, 2], [3]]), "sum", ("inhomogeneous",)),
]


@pytest.mark.parametrize(("label", "call", "op", "fragments"), REDUCTION_ERRORS, ids=[c[0] for c in REDUCTION_ERRORS])
async def test_reduction_errors(
    sc: at.AsyncEagerSession,
    label: str,
    call: Callable[[at.AsyncEagerSession, at.Tensor], Awaitable[Any]],
    op: str,
    fragments: tuple[str, ...],
) -> None:
    t = await sc.constant(np.arange(6.0).reshape(2, 3))
    await assert_invalid(sc, lambda: call(sc, t), op, *fragments)
    np.testing.assert_array_equal(await (await sc.sum(t, axis=0)).numpy(), [3.0, 5.0, 7.0])


# -- the standard's utility and cumulative functions ----------------------------------


def values(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Small integers (exact in every dtype) of ``dtype``; bools from their truth."""
    return np.asarray(_rng.integers(-3, 4, size=shape)).astype(dtype)


def _count_nonzero(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.asarray(np.count_nonzero(x, axis=axis, keepdims=keepdims), dtype=np.int64)


def _cumulative(fn: Callable[..., Any], initial: int) -> Callable[..., Any]:
    def ref(x: Any, axis: Any = None, dtype: Any = None, include_initial: bool = False) -> Any:
        x = np.asarray(x)
        if axis is None:
            if x.ndim != 1:
                raise ValueError("axis required")
            axis = 0
        out = fn(x, axis=axis, dtype=dtype)
        if include_initial:
            shape = list(out.shape)
            shape[axis] = 1
            out = np.concatenate([np.full(shape, initial, out.dtype), out], axis=axis)
        return out

    return ref


STD_UTILITIES: dict[str, Callable[..., Any]] = {
    "all": np.all,
    "any": np.any,
    "count_nonzero": _count_nonzero,
}
CUMULATIVE: dict[str, Callable[..., Any]] = {
    "cumulative_sum": _cumulative(np.cumsum, 0),
    "cumulative_prod": _cumulative(np.cumprod, 1),
}


@pytest.mark.parametrize("name", sorted(STD_UTILITIES))
async def test_all_any_count_nonzero(s: at.AsyncEagerSession, name: str) -> None:
    ref = STD_UTILITIES[name]
    special = np.array([[0.0, np.nan], [-0.0, np.inf]])
    cases = [values((2, 3, 4), dt) for dt in DTYPES] + [special, np.array(0.0), np.zeros((0, 3)), np.array([1j, 0j])]
    for x in cases:
        for axis in [None, 0, -1, (0, 1)]:
            for keepdims in (False, True):
                if x.ndim == 0 and axis not in (None,):
                    continue
                await check_std(s, name, ref, x, exact=True, axis=axis, keepdims=keepdims)
    await check_std(s, name, strict(name), np.array([[True, False], [False, False]]), axis=1)
    await check_std(s, name, strict(name), special, axis=(0, 1), keepdims=True)
    await check_std(s, name, ref, values((2, 3), np.float64), axis=2)  # out of range: InvalidArgumentError


@pytest.mark.parametrize("name", sorted(CUMULATIVE))
async def test_cumulative(s: at.AsyncEagerSession, name: str) -> None:
    ref = CUMULATIVE[name]
    for dt in DTYPES:
        for include_initial in (False, True):
            await check_std(s, name, ref, values((5,), dt), include_initial=include_initial)
            await check_std(s, name, ref, values((2, 3), dt), axis=1, include_initial=include_initial)
            await check_std(s, name, ref, values((2, 0, 3), dt), axis=1, include_initial=include_initial)
            await check_std(s, name, ref, values((2, 3), dt), axis=-2, include_initial=include_initial)
        if dt is not np.bool_:  # (the standard leaves bool out; numpy counts it as 0 and 1)
            await check_std(s, name, strict(name), values((4,), dt))
    await check_std(s, name, ref, values((3,), np.int32), dtype=np.float32, include_initial=True)
    await check_std(s, name, strict(name), values((2, 3), np.float32), axis=0, include_initial=True)
    await check_std(s, name, ref, np.array([np.nan, 1.0, np.inf, -0.0]), exact=True)
    await check_std(s, name, ref, values((2, 3), np.float64))  # axis is required past 1-d
    await check_std(s, name, ref, np.array(1.0))  # and a 0-d input has no axis
    await check_std(s, name, ref, values((3,), np.float64), axis=1)


def _diff(x: Any, axis: int = -1, n: int = 1, prepend: Any = None, append: Any = None) -> Any:
    kwargs = {k: v for k, v in (("prepend", prepend), ("append", append)) if v is not None}
    return np.diff(x, n=n, axis=axis, **kwargs)


async def test_include_initial_applies_the_identity_to_the_first_element(s: at.AsyncEagerSession) -> None:
    # ``1 * (0+infj)`` is ``nan+infj`` and ``0 + -0.0`` is ``0.0``: the identity is combined
    # with x[0] as array_api_strict computes it, not just written in front of the result.
    x = np.array([0 + np.inf * 1j, 2 + 0j], dtype=np.complex64)
    with np.errstate(invalid="ignore"):
        want = to_numpy(array_api_strict.cumulative_prod(array_api_strict.asarray(x), include_initial=True))
        got = await (await s.cumulative_prod(await s.constant(x), include_initial=True)).numpy()
    np.testing.assert_array_equal(got, want, strict=True)
    assert np.isnan(got[1].real)
    z = np.array([-0.0, 1.0])
    got = await (await s.cumulative_sum(await s.constant(z), include_initial=True)).numpy()
    assert not np.signbit(got[1])


async def test_diff(s: at.AsyncEagerSession) -> None:
    for dt in DTYPES[:-1]:
        x = values((3, 5), dt)
        await check_std(s, "diff", _diff, x)
        await check_std(s, "diff", _diff, x, axis=0)
        await check_std(s, "diff", _diff, x, n=2)
        await check_std(s, "diff", _diff, x, n=0)
        await check_std(s, "diff", _diff, x, n=7)  # more than the axis: empty
        await check_std(s, "diff", _diff, x, axis=0, prepend=values((1, 5), dt), append=values((2, 5), dt))
    await check_std(s, "diff", _diff, np.array([True, False, True]))  # numpy: not_equal
    await check_std(s, "diff", _diff, np.array([1.0, np.inf, np.inf, np.nan]))
    await check_std(s, "diff", _diff, values((4,), np.float64), prepend=values((1,), np.float64))
    await check_std(s, "diff", strict("diff"), values((2, 4), np.int32), axis=1, n=2)
    await check_std(s, "diff", _diff, np.array(1.0))  # 0-d: no axis to difference
    await check_std(s, "diff", _diff, values((3,), np.float64), axis=3)


async def test_utility_bad_arguments(sc: at.AsyncEagerSession) -> None:
    x = await sc.constant(values((2, 3), np.float64))
    await assert_invalid(sc, lambda: sc.diff(x, n=-1), "diff", "n")
    await assert_invalid(sc, lambda: sc.diff(x, n="2"), "diff", "n")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.cumulative_sum(x), "cumulative_sum", "axis")
    await assert_invalid(sc, lambda: sc.cumulative_prod(x, axis=0, dtype="S3"), "cumulative_prod")
    await assert_invalid(sc, lambda: sc.all(x, axis="0"), "all")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.count_nonzero(x, axis=5), "count_nonzero")
    await assert_invalid(sc, lambda: sc.any(None), "any")


PARITY_CASES: list[ParityCase] = [
    ("all", (values((2, 3), np.float64),), {"axis": 0}, np.all),
    ("any", (values((2, 3), np.int32),), {"axis": None, "keepdims": True}, np.any),
    ("count_nonzero", (values((2, 3), np.float64),), {"axis": 1}, _count_nonzero),
    (
        "cumulative_sum",
        (values((2, 3), np.float32),),
        {"axis": 1, "include_initial": True},
        CUMULATIVE["cumulative_sum"],
    ),
    ("cumulative_prod", (values((4,), np.int64),), {}, CUMULATIVE["cumulative_prod"]),
    ("diff", (values((2, 5), np.float64),), {"axis": -1, "n": 2}, _diff),
]


# -- differential: hypothesis-drawn arrays against array_api_strict ---------------------

xps = make_strategies_namespace(array_api_strict, api_version="2024.12")


@pytest.mark.parametrize("name", ["all", "any", "count_nonzero", "cumulative_sum", "cumulative_prod", "diff"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_against_array_api_strict(loop_session: Any, name: str, data: st.DataObject) -> None:
    numeric = name.startswith("cumulative") or name == "diff"
    dtype = data.draw(xps.numeric_dtypes() if numeric else xps.scalar_dtypes(), label="dtype")
    x = data.draw(xps.arrays(dtype, xps.array_shapes(min_dims=1 if numeric else 0, max_side=4)), label="x")
    kwargs: dict[str, Any] = {}
    if name in ("all", "any", "count_nonzero"):
        kwargs["axis"] = data.draw(st.none() | xps.valid_tuple_axes(x.ndim), label="axis")
        kwargs["keepdims"] = data.draw(st.booleans(), label="keepdims")
    elif numeric:
        kwargs["axis"] = data.draw(st.integers(-x.ndim, x.ndim - 1), label="axis")
        if name == "diff":
            kwargs["n"] = data.draw(st.integers(0, 3), label="n")
        else:
            kwargs["include_initial"] = data.draw(st.booleans(), label="include_initial")
    with np.errstate(all="ignore"):  # (overflowing products, inf - inf)
        want = to_numpy(getattr(array_api_strict, name)(x, **kwargs))
        got = run_sync(loop_session, name, [to_numpy(x)], kwargs)
    np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.parametrize("row", PARITY_CASES, ids=[row[0] for row in PARITY_CASES])
async def test_parity_rows_hold(s: at.AsyncEagerSession, row: ParityCase) -> None:
    # The rows the parity matrix takes: each holds on every surface here.
    name, args, kwargs, reference = row
    await check_std(s, name, reference, *args, exact=False, **kwargs)
