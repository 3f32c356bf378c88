"""Element-wise ops and tensor operators against numpy: values, dtypes (NEP 50), broadcasting, errors."""

from __future__ import annotations

import inspect
import operator
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._ops._elementwise import RELU_CHUNK, relu_into

from ._opcheck import assert_invalid, assert_same, check_op

BINARY: dict[str, Callable[..., Any]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.true_divide,
    "floor_divide": np.floor_divide,
    "remainder": np.remainder,
    "pow": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
}


def _sigmoid(x: Any) -> Any:
    x = np.asarray(x)
    xf = x if x.dtype.kind in "fc" else x.astype(np.float64)
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for very negative x: sigmoid is 0 there
        return (1.0 / (1.0 + np.exp(-xf))).astype(xf.dtype)


def _relu(x: Any) -> Any:
    x = np.asarray(x)
    return np.maximum(x, np.zeros((), x.dtype))  # keeps x's dtype; NaN propagates


UNARY: dict[str, Callable[..., Any]] = {
    "negative": np.negative,
    "abs": np.absolute,
    "sign": np.sign,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "sqrt": np.sqrt,
    "square": np.square,
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": _relu,
    "floor": np.floor,
    "ceil": np.ceil,
    "logical_not": np.logical_not,
    "isnan": np.isnan,
    "isfinite": np.isfinite,
    "round": np.round,
}
#: Unary ops defined (without a numpy warning) on NaN and +-inf.
NONFINITE_SAFE = {"negative", "abs", "sign", "square", "tanh", "sigmoid", "relu", "floor", "ceil"}
NONFINITE_SAFE |= {"logical_not", "isnan", "isfinite", "round", "exp"}
#: Unary ops that need positive input to stay in their domain.
POSITIVE_ONLY = {"log", "log1p", "sqrt"}

DTYPES = [np.float32, np.float64, np.int32, np.int64, np.bool_]
_rng = np.random.default_rng(1234)


def values(shape: tuple[int, ...], dtype: Any, *, low: int = -3, high: int = 4) -> np.ndarray:
    """Small integers (exact in every dtype) of ``dtype``; bools from their truth."""
    return _rng.integers(low, high, size=shape).astype(dtype)


def binary_cases() -> list[tuple[str, Any, Any]]:
    """(label, x1, x2) pairs: x2 is never zero (so division and powers stay warning-free)."""
    cases: list[tuple[str, Any, Any]] = []
    for dt in DTYPES:  # same dtype, with broadcasting
        cases.append((f"{np.dtype(dt)}[2,3] op {np.dtype(dt)}[3]", values((2, 3), dt), values((3,), dt, low=1)))
    for d1, d2 in [(np.float32, np.int64), (np.int32, np.float32), (np.int32, np.int64), (np.float32, np.float64)]:
        cases.append((f"{np.dtype(d1)} op {np.dtype(d2)}", values((4,), d1), values((4,), d2, low=1)))
    cases.append(("bool op int32", values((4,), np.bool_), values((4,), np.int32, low=1)))
    for s1, s2 in [((2, 1), (1, 3)), ((), (3,)), ((3,), ()), ((0,), (0,)), ((0, 3), (1, 3)), ((2, 0), (1,))]:
        x1, x2 = values(s1, np.float64), values(s2, np.float64, low=1)
        cases.append((f"float64{list(s1)} op float64{list(s2)}", x1, x2))
    # python scalars are weak (NEP 50): a float32 tensor stays float32 with a python float
    for dt, scalar in [(np.float32, 2.5), (np.float32, 2), (np.int32, 2), (np.int32, 2.0), (np.bool_, True)]:
        cases.append((f"{np.dtype(dt)} op {scalar!r}", values((3,), dt), scalar))
        cases.append((f"{scalar!r} op {np.dtype(dt)}", scalar, values((3,), dt, low=1)))
    cases.append(("float32 op float64 scalar (strong)", values((3,), np.float32), np.float64(2.0)))
    return cases


BINARY_CASES = binary_cases()


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


@pytest.mark.parametrize("name", sorted(BINARY))
async def test_binary_op_matches_numpy(s: at.AsyncEagerSession, name: str) -> None:
    for label, x1, x2 in BINARY_CASES:
        try:
            await check_op(s, name, BINARY[name], x1, x2)
        except AssertionError as exc:
            raise AssertionError(f"{name} on {label}: {exc}") from None


@pytest.mark.parametrize("name", sorted(UNARY))
async def test_unary_op_matches_numpy(s: at.AsyncEagerSession, name: str) -> None:
    cases: list[np.ndarray] = []
    for dt in DTYPES:
        for shape in [(2, 3), (), (0,)]:
            x = values(shape, dt)
            if name in POSITIVE_ONLY:
                x = np.asarray(np.abs(x) + 1, dtype=dt)
            cases.append(x)
    if name in NONFINITE_SAFE:
        for dt in (np.float32, np.float64):
            cases.append(np.array([np.nan, np.inf, -np.inf, -0.0, 0.5, -1.5], dtype=dt))
    for x in cases:
        await check_op(s, name, UNARY[name], x)


async def test_unary_reference_points(s: at.AsyncEagerSession) -> None:
    # hand-written values, so the ops are not only compared with a formula like their own
    x = await s.constant([-2.0, 0.0, 3.0])
    np.testing.assert_array_equal(await (await s.relu(x)).numpy(), [0.0, 0.0, 3.0])
    np.testing.assert_allclose(await (await s.sigmoid([0.0, 1000.0, -1000.0])).numpy(), [0.5, 1.0, 0.0])
    f32 = await (await s.sigmoid(np.array([0.0, 50.0], np.float32))).numpy()
    assert f32.dtype == np.float32
    np.testing.assert_array_equal(await (await s.relu([True, False])).numpy(), [True, False])
    np.testing.assert_array_equal(await (await s.round([0.5, 1.5, 2.5, -0.5])).numpy(), [0.0, 2.0, 2.0, -0.0])
    np.testing.assert_array_equal(await (await s.sign([-3, 0, 5])).numpy(), [-1, 0, 1])


@pytest.mark.parametrize("decimals", [0, 1, 2, -1])
async def test_round_decimals(s: at.AsyncEagerSession, decimals: int) -> None:
    for x in (np.array([1.2345, -15.55, 0.5, 2.5, 125.0]), np.array([1.25, 15.0], np.float32), np.array([125, -15])):
        await check_op(s, "round", np.round, x, decimals)


async def test_clip_and_where(s: at.AsyncEagerSession) -> None:
    f32 = np.array([[-2.0, 0.5, 3.0]], np.float32)
    i32 = np.array([-5, 0, 7], np.int32)
    await check_op(s, "clip", np.clip, f32, -1.0, 1.0)  # python bounds keep float32
    await check_op(s, "clip", np.clip, f32, None, 1.0)
    await check_op(s, "clip", np.clip, f32, -1.0, None)
    await check_op(s, "clip", np.clip, i32, -1, 3)
    await check_op(s, "clip", np.clip, i32, np.array([0, 1, 2], np.int64), 5)  # array bound promotes
    await check_op(s, "clip", np.clip, f32, np.array([0.0, 0.0, 0.0]), np.array([1.0]))
    cond = np.array([True, False, True])
    await check_op(s, "where", np.where, cond, i32, np.array([10, 20, 30], np.int64))
    await check_op(s, "where", np.where, cond, f32, 0.0)
    await check_op(s, "where", np.where, cond, 1, 0)
    await check_op(s, "where", np.where, cond[:, None], f32, np.float64(-1.0))  # broadcast to (3, 3)
    await check_op(s, "where", np.where, np.array([1, 0, 2]), 1.5, i32)  # non-bool condition: truthiness
    # keyword bounds through the module function too
    t = await s.constant(f32)
    np.testing.assert_array_equal(await (await at.clip(t, max=0.0)).numpy(), np.clip(f32, None, 0.0))


# -- operators ------------------------------------------------------------------------

OPERATORS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("+", operator.add),
    ("-", operator.sub),
    ("*", operator.mul),
    ("/", operator.truediv),
    ("//", operator.floordiv),
    ("%", operator.mod),
    ("**", operator.pow),
]


async def _awaited(expr: Any, what: str) -> np.ndarray:
    # operators on tensors give coroutines; awaiting one gives a tensor
    assert inspect.isawaitable(expr), f"{what} is not awaitable: {type(expr).__name__}"
    result = await expr
    assert isinstance(result, at.Tensor), f"{what} gave {type(result).__name__}"
    return await result.numpy()


@pytest.mark.parametrize(("symbol", "fn"), OPERATORS, ids=[sym for sym, _ in OPERATORS])
async def test_binary_operators(s: at.AsyncEagerSession, symbol: str, fn: Callable[[Any, Any], Any]) -> None:
    a = np.array([[1.5, -2.0, 3.0], [4.0, 5.0, -6.5]], np.float32)
    b = np.array([2.0, 3.0, 1.0], np.float32)
    ints = np.array([7, -3, 4], np.int64)
    ta, tb, ti = await s.constant(a), await s.constant(b), await s.constant(ints)
    cases: list[tuple[str, Any, Any, Any]] = [
        ("tensor op tensor", fn(ta, tb), a, b),
        ("tensor op int tensor", fn(ta, ti), a, ints),
        ("tensor op python int", fn(ta, 2), a, 2),
        ("tensor op python float", fn(ti, 2.0), ints, 2.0),
        ("python int op tensor", fn(2, ta), 2, a),
        ("python float op tensor", fn(3.0, tb), 3.0, b),
        ("ndarray op tensor", fn(np.ones(3), tb), np.ones(3), b),
        ("tensor op ndarray", fn(tb, np.full(3, 2.0)), b, np.full(3, 2.0)),
        ("numpy scalar op tensor", fn(np.float64(2.0), tb), np.float64(2.0), b),
    ]
    for label, expr, x1, x2 in cases:
        got = await _awaited(expr, f"{label} ({symbol})")
        assert_same(got, fn(x1, x2), f"{label} ({symbol})", exact=False, rtol=1e-6)


async def test_matmul_and_unary_operators(s: at.AsyncEagerSession) -> None:
    a = np.arange(6.0).reshape(2, 3)
    b = np.arange(12.0).reshape(3, 4)
    ta, tb = await s.constant(a), await s.constant(b)
    assert_same(await _awaited(ta @ tb, "t @ t"), a @ b, "t @ t", exact=True, rtol=0)
    assert_same(await _awaited(a @ tb, "ndarray @ t"), a @ b, "ndarray @ t", exact=True, rtol=0)
    assert_same(await _awaited(ta @ b, "t @ ndarray"), a @ b, "t @ ndarray", exact=True, rtol=0)
    assert_same(await _awaited(-ta, "-t"), -a, "-t", exact=True, rtol=0)
    assert_same(await _awaited(abs(ta), "abs(t)"), np.abs(a), "abs(t)", exact=True, rtol=0)
    neg = await s.constant(np.array([-1, 2, -3], np.int32))
    assert_same(await _awaited(abs(neg), "abs(int32 t)"), np.array([1, 2, 3], np.int32), "abs", exact=True, rtol=0)
    # chained: each operator awaits its operand first
    assert_same(await _awaited(await (ta + 1) * 2, "(t + 1) * 2"), (a + 1) * 2, "chain", exact=True, rtol=0)


# -- errstate and errors ------------------------------------------------------------------


async def test_kernels_follow_the_callers_errstate(s: at.AsyncEagerSession) -> None:
    zeros = await s.zeros(2)
    with np.errstate(divide="ignore"):
        got = await (await s.divide(1.0, zeros)).numpy()
    np.testing.assert_array_equal(got, [np.inf, np.inf])
    with np.errstate(divide="raise"), pytest.raises(at.AioTensorError) as info:
        await s.divide(1.0, zeros)
    assert isinstance(info.value.__cause__, FloatingPointError)


BAD_DATA: list[tuple[str, Any]] = [
    ("None", None),
    ("str", "abc"),
    ("list of str", ["a", "b", "c"]),
    ("object array", np.array([1, None, 2], dtype=object)),
    ("ragged list", [[1.0, 2.0], [3.0]]),
    ("dict", {"a": 1}),
]


@pytest.mark.parametrize(("label", "bad"), BAD_DATA, ids=[label for label, _ in BAD_DATA])
async def test_non_numeric_data_is_rejected(sc: at.AsyncEagerSession, label: str, bad: Any) -> None:
    x = await sc.constant([1.0, 2.0, 3.0])
    for name in BINARY:
        await assert_invalid(sc, lambda n=name: getattr(sc, n)(x, bad), name, "float64[3]")
        await assert_invalid(sc, lambda n=name: getattr(at, n)(bad, x), name, "float64[3]")
    for name in UNARY:
        await assert_invalid(sc, lambda n=name: getattr(sc, n)(bad), name)
    await assert_invalid(sc, lambda: sc.where(bad, x, 0.0), "where")
    await assert_invalid(sc, lambda: sc.where([True, False, True], x, bad), "where")
    await assert_invalid(sc, lambda: sc.clip(bad, 0, 1), "clip")
    if bad is not None:  # a None bound means "no bound"
        await assert_invalid(sc, lambda: sc.clip(x, bad, 1), "clip")
    # the session is still usable
    np.testing.assert_array_equal(await (await sc.add(x, 1.0)).numpy(), [2.0, 3.0, 4.0])


async def test_shape_mismatch_names_op_and_shapes(sc: at.AsyncEagerSession) -> None:
    a = await sc.ones((2, 3), dtype=np.float32)
    b = await sc.ones(4, dtype=np.int32)
    err = await assert_invalid(sc, lambda: sc.add(a, b), "add", "float32[2, 3]", "int32[4]")
    assert isinstance(err, ValueError)
    await assert_invalid(sc, lambda: a * b, "multiply", "float32[2, 3]")
    flags, ints = await sc.constant([True]), await sc.constant([2])
    await assert_invalid(sc, lambda: sc.subtract(flags, True), "subtract", "bool[1]")
    await assert_invalid(sc, lambda: sc.pow(ints, -1), "pow", "int64[1]")
    await assert_invalid(sc, lambda: sc.round(a, "x"), "round")  # type: ignore[arg-type]
    np.testing.assert_array_equal(await (await sc.add(a, 1)).numpy(), np.full((2, 3), 2.0, np.float32))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "bool"])
@pytest.mark.parametrize("size", [5, 4096, RELU_CHUNK, RELU_CHUNK + 7, 3 * RELU_CHUNK])
def test_relu_into_is_maximum_with_zero_bit_for_bit(dtype: str, size: int) -> None:
    # The chunked path compares with a block of zeros instead of a scalar: same bits,
    # NaN and signed zeros included, with or without an out buffer, and on a non-contiguous view.
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 3).astype(dtype)
    if x.dtype.kind == "f":
        x[:4] = [np.nan, -0.0, 0.0, -np.inf]
    expected = np.maximum(x, np.zeros((), x.dtype))
    got = relu_into(x)
    assert got.dtype == expected.dtype
    assert got.tobytes() == expected.tobytes()
    out = np.full_like(x, 7)
    assert relu_into(x, out) is out
    assert out.tobytes() == expected.tobytes()
    square = x[: (size // 2) * 2].reshape(2, -1)
    assert relu_into(square.T).tobytes() == np.maximum(square.T, np.zeros((), x.dtype)).tobytes()
    assert relu_into(square).shape == square.shape
    # A C-contiguous 2-D array: one chunk compares against zeros of its own shape.
    assert relu_into(square).tobytes() == np.maximum(square, np.zeros((), x.dtype)).tobytes()
    out2 = np.full_like(square, 7)
    assert relu_into(square, out2) is out2
    assert out2.tobytes() == np.maximum(square, np.zeros((), x.dtype)).tobytes()


async def test_relu_matches_numpy_on_large_tensors(s: at.AsyncEagerSession) -> None:
    x = np.random.default_rng(1).standard_normal((300, 301)).astype(np.float32)
    x[0, :3] = [np.nan, -0.0, -1.0]
    got = await (await s.relu(x)).numpy()
    np.testing.assert_array_equal(got, np.maximum(x, np.float32(0)))
    assert np.signbit(got[0, 1]) == np.signbit(np.maximum(np.float32(-0.0), np.float32(0)))


async def test_a_forgotten_await_without_any_tensor_names_the_op_and_argument(s: at.AsyncEagerSession) -> None:
    # With no tensor and no default session the coroutine is the reason: the error named
    # "this op" and the argument "#1" before module functions passed their op's name.
    x = await s.constant([1.0, -2.0])
    with pytest.raises(TypeError, match=r"^exp: argument 'x' is a coroutine .*forgotten `await`"):
        await at.exp(s.exp(x))
    with pytest.raises(TypeError, match=r"^astype: argument 'x' is a coroutine .*forgotten `await`"):
        await at.astype(at.greater(x, 0), np.int64)
    with pytest.raises(TypeError, match=r"^zeros_like: argument 'x' is a coroutine"):
        await at.zeros_like(s.ones(3))
