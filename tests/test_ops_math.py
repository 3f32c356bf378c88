"""The standard's other element-wise functions (``_ops/_math``) against numpy and array_api_strict.

Each op on every surface (session, module, fused ``ops``, expression node), on several
dtypes and shapes (0-d, empty, broadcasting) and on the special values the standard
specifies (NaN, signed zeros, infinities); bad input raises InvalidArgumentError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import array_api_strict
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.array_api import make_strategies_namespace

import aiotensor as at
from aiotensor.testing import OPS

from ._opcheck import assert_invalid
from ._stdcheck import ParityCase, check_std, run_sync, strict, to_numpy

#: The standard's name -> numpy's function.
UNARY_FLOAT: dict[str, Callable[..., Any]] = {
    "acos": np.arccos,
    "acosh": np.arccosh,
    "asin": np.arcsin,
    "asinh": np.arcsinh,
    "atan": np.arctan,
    "atanh": np.arctanh,
    "tan": np.tan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "expm1": np.expm1,
    "log2": np.log2,
    "log10": np.log10,
    "reciprocal": np.reciprocal,
    "trunc": np.trunc,
    "signbit": np.signbit,
    "isinf": np.isinf,
}
#: Unary ops defined on integers and bools too (numpy's results).
UNARY_ANY: dict[str, Callable[..., Any]] = {
    "positive": np.positive,
    "conj": np.conjugate,
    "real": np.real,
    "imag": np.imag,
    "bitwise_invert": np.invert,
}
BINARY_FLOAT: dict[str, Callable[..., Any]] = {
    "atan2": np.arctan2,
    "logaddexp": np.logaddexp,
    "hypot": np.hypot,
    "copysign": np.copysign,
    "nextafter": np.nextafter,
}
BINARY_INT: dict[str, Callable[..., Any]] = {
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "bitwise_left_shift": np.left_shift,
    "bitwise_right_shift": np.right_shift,
    "logical_xor": np.logical_xor,
}

SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 0.5, -0.5, 1.0, -1.0, 2.0, 1e-300, 700.0])
_rng = np.random.default_rng(2812)


def _real(x: Any) -> Any:
    return np.real(x).copy()


def _imag(x: Any) -> Any:
    x = np.asarray(x)
    return np.imag(x) if x.dtype.kind == "c" else np.zeros_like(x)


UNARY_ANY["real"], UNARY_ANY["imag"] = _real, _imag


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


def _floats(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.asarray(_rng.uniform(-0.99, 0.99, size=shape) + (1.5 if shape == (7,) else 0), dtype)


@pytest.mark.parametrize("name", sorted(UNARY_FLOAT))
async def test_unary_float_op(s: at.AsyncEagerSession, name: str) -> None:
    ref = UNARY_FLOAT[name]
    for dt in (np.float32, np.float64):
        for shape in [(2, 3), (), (0,), (7,)]:
            await check_std(s, name, ref, _floats(shape, dt))
        await check_std(s, name, ref, SPECIAL.astype(dt))
    await check_std(s, name, ref, np.array([1, 2, 3], np.int32))  # numpy's promotion of integers
    if name not in ("signbit", "trunc"):  # numpy has no complex loop for those
        await check_std(s, name, ref, np.array([0.5 + 1j, -2 - 0.25j, 0j]), rtol=1e-12)
    await check_std(s, name, strict(name), SPECIAL.astype(np.float32))


@pytest.mark.parametrize("name", sorted(UNARY_ANY))
async def test_unary_any_op(s: at.AsyncEagerSession, name: str) -> None:
    ref = UNARY_ANY[name]
    cases = [np.array([[1, -2, 3]], np.int32), np.array(7, np.int64), np.zeros((0, 2), np.uint8)]
    cases += [np.array([True, False])]
    cases += [SPECIAL.astype(np.float32), np.array([1 + 2j, -3.5j], np.complex64), np.array(2.5 - 1j)]
    for x in cases:
        await check_std(s, name, ref, x, exact=True)
    if name != "bitwise_invert":
        await check_std(s, name, strict(name), np.array([1 + 2j, -3.5j], np.complex128), exact=True)
    else:
        await check_std(s, name, strict(name), np.array([0, 5, -6], np.int16), exact=True)


@pytest.mark.parametrize("name", sorted(BINARY_FLOAT))
async def test_binary_float_op(s: at.AsyncEagerSession, name: str) -> None:
    ref = BINARY_FLOAT[name]
    a, b = np.meshgrid(SPECIAL, SPECIAL)  # every pair of special values
    for dt in (np.float32, np.float64):
        await check_std(s, name, ref, a.astype(dt), b.astype(dt))
    await check_std(s, name, ref, _floats((2, 3), np.float32), _floats((3,), np.float64))  # broadcast, promote
    await check_std(s, name, ref, _floats((2, 1), np.float32), 0.5)  # python float stays weak
    await check_std(s, name, ref, -1.5, _floats((4,), np.float32))
    await check_std(s, name, ref, _floats((0, 3), np.float64), _floats((1, 3), np.float64))
    await check_std(s, name, ref, np.array(0.25), np.array(-3.0))
    await check_std(s, name, strict(name), a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("name", sorted(BINARY_INT))
async def test_binary_integer_op(s: at.AsyncEagerSession, name: str) -> None:
    ref = BINARY_INT[name]
    bools = np.array([[True, False], [True, True]]), np.array([False, True])
    ints = [(np.int8, np.int8), (np.int32, np.int64), (np.uint8, np.uint16), (np.int64, np.uint8)]
    if name == "logical_xor":
        await check_std(s, name, ref, *bools, exact=True)
        await check_std(s, name, ref, np.array([0, 2, 0]), np.array([1, 0, 0]), exact=True)
        await check_std(s, name, strict(name), *bools, exact=True)
        return
    for d1, d2 in ints:
        x1 = _rng.integers(-100 if np.dtype(d1).kind == "i" else 0, 100, size=(3, 4)).astype(d1)
        x2 = _rng.integers(0, 7, size=(4,)).astype(d2)  # shifts are non-negative
        await check_std(s, name, ref, x1, x2, exact=True)
    await check_std(s, name, ref, np.arange(5, dtype=np.int16), 3, exact=True)  # a weak python int
    await check_std(s, name, ref, np.array(12, np.int32), np.array(2, np.int32), exact=True)
    await check_std(s, name, ref, np.zeros((0,), np.int64), np.ones((1,), np.int64), exact=True)
    if "shift" not in name:
        await check_std(s, name, ref, *bools, exact=True)
    await check_std(s, name, strict(name), np.array([5, -3, 12], np.int32), np.array([1, 2, 3], np.int32))


async def test_special_values_by_hand(s: at.AsyncEagerSession) -> None:
    # The standard's special cases, written out (so they are not only numpy against numpy).
    async def get(name: str, *args: Any) -> np.ndarray:
        with np.errstate(all="ignore"):  # (numpy warns on some special values)
            got: np.ndarray = await (await getattr(s, name)(*[np.asarray(a) for a in args])).numpy()
            return got

    assert np.signbit(await get("copysign", [1.0, 0.0], [-0.0, -np.nan])).tolist() == [True, True]
    assert (await get("signbit", [-0.0, 0.0, -np.inf, np.nan])).tolist() == [True, False, True, False]
    assert (await get("isinf", [np.inf, -np.inf, np.nan, 1e308])).tolist() == [True, True, False, False]
    np.testing.assert_array_equal(await get("atan2", [0.0, -0.0], [-0.0, -0.0]), [np.pi, -np.pi])
    np.testing.assert_array_equal(await get("hypot", [np.inf, np.nan], [np.nan, -np.inf]), [np.inf, np.inf])
    np.testing.assert_array_equal(
        await get("logaddexp", [np.inf, 1000.0, np.nan], [1.0, 1000.0, np.inf]), [np.inf, 1000.0 + np.log(2), np.nan]
    )
    np.testing.assert_array_equal(await get("acosh", [1.0, np.inf]), [0.0, np.inf])
    np.testing.assert_array_equal(await get("atanh", [1.0, -1.0]), [np.inf, -np.inf])
    assert np.signbit(await get("trunc", [-0.5]))[0]
    assert (await get("nextafter", [1.0], [2.0]))[0] == 1.0 + np.finfo(np.float64).eps
    assert (await get("bitwise_right_shift", np.array([-8], np.int8), np.array([1], np.int8))).tolist() == [-4]


async def test_floor_divide_special_cases_follow_the_standard(s: at.AsyncEagerSession) -> None:
    # numpy gives NaN for inf // 2 and -1 for -1 // inf; the standard gives the true quotient.
    x1 = np.array([np.inf, np.inf, -np.inf, -np.inf, 1.0, -1.0, 1.0, -1.0, np.inf, 7.0, np.nan, 0.0])
    x2 = np.array([2.0, -2.0, 2.0, -2.0, -np.inf, np.inf, np.inf, -np.inf, np.inf, 2.0, 1.0, np.inf])
    want = np.array([np.inf, -np.inf, -np.inf, np.inf, -0.0, -0.0, 0.0, 0.0, np.nan, 3.0, np.nan, 0.0])
    for dt in (np.float32, np.float64):
        with np.errstate(all="ignore"):
            for got in (
                await (await s.floor_divide(x1.astype(dt), x2.astype(dt))).numpy(),
                await (await (await s.constant(x1.astype(dt)) // x2.astype(dt))).numpy(),
            ):
                assert got.dtype == dt
                np.testing.assert_array_equal(got, want.astype(dt))
                finite = ~np.isnan(want)  # (the sign of a NaN is not specified)
                assert np.signbit(got[finite]).tolist() == np.signbit(want[finite]).tolist()
    with np.errstate(all="ignore"):
        scalar = await (await s.floor_divide(await s.constant(np.float32(np.inf)), 2.0)).numpy()
    assert scalar.dtype == np.float32
    assert scalar == np.inf
    ints = await (await s.floor_divide(np.array([7, -7]), 2)).numpy()
    assert ints.tolist() == [3, -4]


BAD_INPUT: list[tuple[str, tuple[Any, ...], str]] = [
    ("acos", ("abc",), "acos"),
    ("atan2", ([1.0], None), "atan2"),
    ("bitwise_and", (np.array([1.5]), np.array([1.0])), "bitwise_and"),
    ("bitwise_invert", (np.array([1.5]),), "bitwise_invert"),
    ("bitwise_left_shift", (np.array([1]), np.array([1.0])), "bitwise_left_shift"),
    ("signbit", (np.array([1j]),), "signbit"),
    ("hypot", (np.ones(2), np.ones(3)), "hypot"),
    ("positive", (np.array([True]),), "positive"),
    ("real", ({"a": 1},), "real"),
]


@pytest.mark.parametrize(("name", "args", "fragment"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
async def test_bad_input_raises_invalid_argument(
    sc: at.AsyncEagerSession, name: str, args: tuple[Any, ...], fragment: str
) -> None:
    targs = [await sc.constant(a) if isinstance(a, np.ndarray) else a for a in args]
    await assert_invalid(sc, lambda: getattr(sc, name)(*targs), fragment)
    with sc.as_default():  # (the module function finds no tensor among bad arguments)
        await assert_invalid(sc, lambda: getattr(at, name)(*targs), fragment)


PARITY_CASES: list[ParityCase] = [
    *[(n, (_floats((3, 2), np.float64),), {}, f) for n, f in UNARY_FLOAT.items()],
    *[(n, (np.array([1 + 2j, -3.5j]),), {}, f) for n, f in UNARY_ANY.items() if n != "bitwise_invert"],
    ("bitwise_invert", (np.array([0, 5, -6], np.int16),), {}, np.invert),
    *[(n, (_floats((3, 2), np.float64), _floats((2,), np.float64)), {}, f) for n, f in BINARY_FLOAT.items()],
    *[(n, (np.array([5, 3, 12]), np.array([1, 2, 3])), {}, f) for n, f in BINARY_INT.items()],
    # floor_divide's infinity cases, as the standard gives them (numpy: NaN and -1)
    (
        "floor_divide",
        (np.array([np.inf, -1.0, 7.0]), np.array([2.0, np.inf, 2.0])),
        {},
        lambda a, b: np.array([np.inf, -0.0, 3.0]),
    ),
]


# -- differential: hypothesis-drawn arrays against array_api_strict ---------------------

xps = make_strategies_namespace(array_api_strict, api_version="2024.12")
#: Each op by the standard's dtype category of its arguments.
CATEGORIES: dict[str, Any] = {
    **dict.fromkeys(
        ["acos", "acosh", "asin", "asinh", "atan", "atanh", "tan", "sinh", "cosh", "expm1", "log2", "log10"],
        xps.floating_dtypes(),
    ),
    **dict.fromkeys(["reciprocal"], xps.floating_dtypes()),
    **dict.fromkeys(
        ["signbit", "atan2", "copysign", "hypot", "logaddexp", "nextafter"],
        xps.floating_dtypes().filter(lambda d: d in (array_api_strict.float32, array_api_strict.float64)),
    ),
    **dict.fromkeys(["isinf", "positive", "conj"], xps.numeric_dtypes()),
    **dict.fromkeys(["real", "imag"], xps.complex_dtypes()),
    "trunc": xps.real_dtypes(),
    **dict.fromkeys(
        ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_invert"], xps.integer_dtypes() | xps.boolean_dtypes()
    ),
    **dict.fromkeys(["bitwise_left_shift", "bitwise_right_shift"], xps.integer_dtypes()),
    "logical_xor": xps.boolean_dtypes(),
    "floor_divide": xps.real_dtypes(),  # numpy misses its infinity cases: patched here, checked by hand above
}


@pytest.mark.parametrize("name", sorted(CATEGORIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_against_array_api_strict(loop_session: Any, name: str, data: st.DataObject) -> None:
    fn = getattr(array_api_strict, name)
    dtype = data.draw(CATEGORIES[name], label="dtype")
    binary = OPS[name].data == 2
    if binary:
        shapes = data.draw(xps.mutually_broadcastable_shapes(2, min_dims=0, max_side=4), label="shapes").input_shapes
    else:
        shapes = (data.draw(xps.array_shapes(min_dims=0, min_side=0, max_side=4), label="shape"),)
    arrays = [data.draw(xps.arrays(dtype, shape), label=f"x{i + 1}") for i, shape in enumerate(shapes)]
    if "shift" in name:
        assume(bool(array_api_strict.all(arrays[1] >= 0)))  # the standard leaves negative shifts undefined
    with np.errstate(all="ignore"):
        if name == "floor_divide":
            # (numpy, so array_api_strict, misses the infinity cases: test_floor_divide_special_cases...)
            assume(not any(bool(array_api_strict.any(array_api_strict.isinf(a))) for a in arrays))
        want = to_numpy(fn(*arrays))
        got = run_sync(loop_session, name, [to_numpy(a) for a in arrays])
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, array_api_strict gives {want.dtype}"
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.parametrize("row", PARITY_CASES, ids=[row[0] for row in PARITY_CASES])
async def test_parity_rows_hold(s: at.AsyncEagerSession, row: ParityCase) -> None:
    # The rows the parity matrix takes: each holds on every surface here.
    name, args, kwargs, reference = row
    await check_std(s, name, reference, *args, exact=False, **kwargs)
