"""The beyond-standard ops (erf, gelu, silu, softplus, logsumexp, one_hot, top_k, bincount,
scatter_add, pad, median, quantile, layer_norm) against numpy, ``math`` and their
PyTorch/SciPy definitions written out in numpy.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._ops._erf import SMALL

from ._opcheck import Tolerance, assert_invalid, check_op
from ._results import one

_rng = np.random.default_rng(31)
FLOATS = [np.float32, np.float64]


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


def _elementwise(fn: Callable[[float], float]) -> Callable[[Any], Any]:
    """A float64 reference from a scalar function; float dtypes kept, others float64."""

    def ref(x: Any) -> Any:
        a = np.asarray(x)
        out = np.array([fn(v) for v in a.astype(np.float64).ravel().tolist()], dtype=np.float64).reshape(a.shape)
        return out.astype(a.dtype if a.dtype.kind == "f" else np.float64)

    return ref


math_erf = _elementwise(math.erf)
math_erfc = _elementwise(math.erfc)


def erf_points() -> np.ndarray:
    """Many points over every region of the approximation, the tails and the special values."""
    parts = [_rng.normal(scale=s, size=3000) for s in (1e-3, 0.3, 1.0, 2.5, 5.0, 12.0)] + [
        np.linspace(-8, 8, 4001),
        np.array([0.46875, -0.46875, 0.46874999999999994, 4.0, -4.0, 4.000000000000001, 26.5, 27.3, 30.0]),
        np.array([5e-324, -5e-324, 1e-310, 1e-300, 1e-20, 1e300, -1e300, 0.0, -0.0, np.inf, -np.inf, np.nan]),
    ]
    return np.concatenate(parts)


def test_erf_against_math_erf_element_by_element() -> None:
    """Both paths (Cody's numpy evaluation and the per-element one for small arrays) within 4 ulp.

    (Cody's approximation is exact to ~1e-17; its float64 evaluation rounds a few times.)
    """
    from aiotensor._ops._erf import erf, erfc

    xs = erf_points()
    assert xs.size > SMALL
    for got in (erf(xs), np.concatenate([erf(c) for c in np.array_split(xs, xs.size // SMALL + 1)])):
        for x, g in zip(xs.tolist(), got.tolist(), strict=True):
            want = math.erf(x)
            if math.isnan(want):
                assert math.isnan(g), x
                continue
            assert abs(g - want) <= 4 * math.ulp(want), (x, g, want)
            assert math.copysign(1.0, g) == math.copysign(1.0, want), (x, g)  # erf(-0.0) is -0.0
    tails = erfc(xs)
    for x, g in zip(xs.tolist(), tails.tolist(), strict=True):
        want = math.erfc(x)
        if math.isnan(want):
            assert math.isnan(g)
        elif want >= 2.2250738585072014e-308:  # normal results: relative; subnormal ones absolute
            assert abs(g - want) <= 8 * math.ulp(want), (x, g, want)  # erfc's product of three roundings
        else:
            assert abs(g - want) <= 1e-320, (x, g, want)


async def test_erf_op(s: at.AsyncEagerSession) -> None:
    for dt in (*FLOATS, np.int32, np.bool_):
        for n in (5, SMALL + 100):  # both evaluation paths
            x: np.ndarray = (_rng.normal(scale=2, size=n) * (3 if dt in (np.int32, np.bool_) else 1)).astype(dt)
            await check_op(s, "erf", math_erf, x, rtol=1e-15 if dt != np.float32 else 1e-7)
    await check_op(s, "erf", math_erf, np.array([[np.inf, -np.inf], [np.nan, -0.0]]))
    await check_op(s, "erf", math_erf, np.zeros((0, 3)))
    await check_op(s, "erf", math_erf, np.asarray(0.5))
    with np.errstate(all="raise"):  # the far tail underflows on purpose: no FloatingPointError
        got = await (await s.erf(np.linspace(-40, 40, 2 * SMALL))).numpy()
    assert got[0] == -1.0
    assert got[-1] == 1.0
    with pytest.raises(at.InvalidArgumentError, match="real input"):
        await s.erf(np.array([1j]))


def _gelu(x: Any, approximate: str = "none") -> Any:
    a = np.asarray(x)
    f = a.astype(np.float64)
    if approximate == "tanh":
        out = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f**3)))
    else:
        out = 0.5 * f * math_erfc(-f / math.sqrt(2))  # PyTorch's x * Phi(x), without 1 + erf's cancellation
    return out.astype(a.dtype if a.dtype.kind == "f" else np.float64)


async def test_gelu_silu_softplus(s: at.AsyncEagerSession) -> None:
    for dt in (*FLOATS, np.int64):
        x = (_rng.normal(scale=3, size=(4, 300))).astype(dt)
        r: Tolerance = {"rtol": 1e-5, "atol": 1e-6} if dt == np.float32 else {"rtol": 1e-12, "atol": 1e-300}
        await check_op(s, "gelu", _gelu, x, **r)
        await check_op(s, "gelu", _gelu, x, approximate="tanh", **r)
        await check_op(
            s, "silu", lambda a: _cast(a, a.astype(np.float64) / (1 + np.exp(-a.astype(np.float64)))), x, **r
        )
        for beta, threshold in ((1.0, 20.0), (2.0, 5.0), (0.5, 1.0)):
            await check_op(s, "softplus", _softplus, x, beta=beta, threshold=threshold, **r)
    # the negative tail of exact gelu: erfc keeps it accurate where 1 + erf(x) cancels
    tail = await (await s.gelu(np.array([-10.0, -30.0]))).numpy()
    np.testing.assert_allclose(
        tail, [-10 * 0.5 * math.erfc(10 / math.sqrt(2)), -30 * 0.5 * math.erfc(30 / math.sqrt(2))]
    )
    assert tail[0] != 0.0
    big = await (await s.softplus(np.array([1000.0, -1000.0]), threshold=1e9)).numpy()
    np.testing.assert_array_equal(big, [1000.0, 0.0])  # no overflow
    with pytest.raises(at.InvalidArgumentError, match="approximate"):
        await s.gelu(np.ones(2), approximate="erf")
    with pytest.raises(at.InvalidArgumentError, match="beta"):
        await s.softplus(np.ones(2), beta=0)


def _cast(a: Any, out: Any) -> Any:
    return out.astype(a.dtype if a.dtype.kind == "f" else np.float64)


def _softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> Any:
    f = np.asarray(x).astype(np.float64)
    with np.errstate(over="ignore"):
        out = np.where(f * beta > threshold, f, np.log1p(np.exp(beta * f)) / beta)
    return _cast(np.asarray(x), out)


def _logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """SciPy's definition in float64 (``log(sum(exp(x)))``, shifted by the max)."""
    a = np.asarray(x)
    f = a.astype(np.float64)
    m = np.max(f, axis=axis, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(f - m), axis=axis, keepdims=True)) + m
    if not keepdims:
        out = np.squeeze(out, axis=axis) if axis is not None else out.reshape(())
    return _cast(a, out)


async def test_logsumexp(s: at.AsyncEagerSession) -> None:
    for dt in (*FLOATS, np.int32):
        x = (_rng.normal(scale=3, size=(3, 4, 5)) * 10).astype(dt)
        r: Tolerance = {"rtol": 1e-5} if dt == np.float32 else {"rtol": 1e-12}
        for axis in (None, 0, -1, (0, 2)):
            for keepdims in (False, True):
                await check_op(s, "logsumexp", _logsumexp, x, axis=axis, keepdims=keepdims, **r)
    special = np.array([[1000.0, 1000.0], [-np.inf, -np.inf], [np.inf, 1.0], [np.nan, 1.0]])
    got = await (await s.logsumexp(special, axis=1)).numpy()
    np.testing.assert_array_equal(got, [1000.0 + math.log(2), -np.inf, np.inf, np.nan])
    await check_op(s, "logsumexp", _logsumexp, np.zeros((0, 3)), axis=0)  # empty: -inf
    await check_op(s, "logsumexp", _logsumexp, np.ones((2, 3)), axis=2)  # bad axis


def _one_hot(x: Any, num_classes: int, dtype: Any = None, axis: int = -1) -> Any:
    """``np.eye(n)[x]`` (torch.nn.functional.one_hot), refusing out-of-range indices as PyTorch does."""
    idx = np.asarray(x)
    if idx.dtype.kind not in "iu":
        raise TypeError("indices must be integers")
    if idx.size and (idx.min() < 0 or idx.max() >= num_classes):
        raise ValueError("class values must be in [0, num_classes)")
    out = np.eye(num_classes, dtype=dtype or np.int64)[idx]
    return np.moveaxis(out, -1, axis)


async def test_one_hot(s: at.AsyncEagerSession) -> None:
    labels = _rng.integers(0, 5, size=(3, 4))
    for dt in (None, np.float32, np.bool_):
        await check_op(s, "one_hot", _one_hot, labels, 5, dtype=dt, exact=True)
        await check_op(s, "one_hot", _one_hot, labels.astype(np.uint8), 7, dtype=dt, axis=0, exact=True)
    await check_op(s, "one_hot", _one_hot, labels, 5, axis=1, exact=True)
    await check_op(s, "one_hot", _one_hot, np.zeros(0, np.int64), 3, exact=True)
    await check_op(s, "one_hot", _one_hot, np.asarray(2), 3, exact=True)
    await check_op(s, "one_hot", _one_hot, labels, 4)  # an index out of range
    await check_op(s, "one_hot", _one_hot, -labels - 1, 5)  # negative
    await check_op(s, "one_hot", _one_hot, labels.astype(np.float64), 5)  # not integers
    with pytest.raises(at.InvalidArgumentError, match="num_classes"):
        await s.one_hot(labels, 0)


def _top_k(x: Any, k: int, axis: int = -1, largest: bool = True) -> tuple[Any, Any]:
    """torch.topk written out with a stable argsort: descending (NaN first) or ascending, ties by index."""
    a = np.moveaxis(np.asarray(x), axis, -1)
    if largest:
        key = np.where(np.isnan(a), np.inf, a) if a.dtype.kind == "f" else a.astype(np.float64)
        rank = np.argsort(-key, axis=-1, kind="stable")
        if a.dtype.kind == "f":  # NaN before +inf, as the largest
            nan_first = np.argsort(~np.isnan(np.take_along_axis(a, rank, -1)), axis=-1, kind="stable")
            rank = np.take_along_axis(rank, nan_first, -1)
    else:
        rank = np.argsort(a, axis=-1, kind="stable")
    idx = rank[..., :k]
    return np.moveaxis(np.take_along_axis(a, idx, -1), -1, axis), np.moveaxis(idx.astype(np.int64), -1, axis)


async def test_top_k(s: at.AsyncEagerSession) -> None:
    for dt in (np.float32, np.float64, np.int32, np.uint8, np.bool_):
        x = _rng.integers(0, 6, size=(3, 8)).astype(dt)  # many ties
        for k in (0, 1, 3, 8):
            for axis in (-1, 0) if k <= 3 else (-1,):
                for largest in (True, False):
                    values, indices = await s.top_k(x, k, axis=axis, largest=largest)
                    want_v, want_i = _top_k(x, k, axis=axis, largest=largest)
                    np.testing.assert_array_equal(await values.numpy(), want_v, strict=True)
                    np.testing.assert_array_equal(await indices.numpy(), want_i, strict=True)
    nan = np.array([1.0, np.nan, 3.0, np.inf, 3.0])
    values, indices = await s.top_k(nan, 3)
    np.testing.assert_array_equal(await values.numpy(), [np.nan, np.inf, 3.0])
    np.testing.assert_array_equal(await indices.numpy(), [1, 3, 2])
    for bad, fragment in [
        ((np.ones(3), 4), "larger than"),
        ((np.ones(3), -1), "k must be"),
        ((np.asarray(1.0), 1), "0-d"),
    ]:
        with pytest.raises(at.InvalidArgumentError, match=fragment):
            await s.top_k(*bad)
    with pytest.raises(at.InvalidArgumentError, match="top_k"):
        await s.top_k(np.ones((2, 3)), 1, axis=2)


async def test_bincount(s: at.AsyncEagerSession) -> None:
    x = _rng.integers(0, 7, size=50)
    await check_op(s, "bincount", np.bincount, x, exact=True)
    await check_op(s, "bincount", np.bincount, x.astype(np.uint8), minlength=10, exact=True)
    await check_op(s, "bincount", np.bincount, x, _rng.normal(size=50), rtol=1e-12)
    await check_op(s, "bincount", np.bincount, np.zeros(0, np.int64), exact=True)
    await check_op(s, "bincount", np.bincount, np.array([1, -1]))  # negative
    await check_op(s, "bincount", np.bincount, np.ones((2, 2), np.int64))  # not 1-d
    await check_op(s, "bincount", np.bincount, np.array([0.5, 1.0]))  # not integers


def _index_add(x: Any, indices: Any, updates: Any, axis: int = 0) -> Any:
    """torch.Tensor.index_add (functional), as numpy.add.at on a copy."""
    out = np.array(x, dtype=np.result_type(x, updates))
    np.add.at(np.moveaxis(out, axis, 0), indices, np.moveaxis(np.asarray(updates), axis, 0))
    return out


async def test_scatter_add(s: at.AsyncEagerSession) -> None:
    x = _rng.normal(size=(5, 3))
    idx = np.array([0, 2, 2, 4, 0, -1])  # repeats accumulate; -1 is the last row
    upd = _rng.normal(size=(6, 3))
    await check_op(s, "scatter_add", _index_add, x, idx, upd, rtol=1e-12)
    await check_op(s, "scatter_add", _index_add, x, np.array([1, 1]), _rng.normal(size=(5, 2)), axis=1, rtol=1e-12)
    await check_op(s, "scatter_add", _index_add, x.astype(np.float32), idx, upd.astype(np.float32), rtol=1e-6)
    await check_op(
        s, "scatter_add", _index_add, np.zeros(4, np.int64), np.array([1, 1, 3]), np.ones(3, np.int64), exact=True
    )
    await check_op(
        s, "scatter_add", _index_add, np.zeros(4, np.int32), np.array([1, 1]), np.ones(2), rtol=0
    )  # promotes
    await check_op(s, "scatter_add", _index_add, x, np.array([5]), np.ones((1, 3)))  # out of range
    await check_op(s, "scatter_add", _index_add, x, np.array([0.5]), np.ones((1, 3)))  # not integers
    src = await s.constant(x)
    await s.scatter_add(src, idx, upd)
    np.testing.assert_array_equal(await src.numpy(), x)  # functional: the input is unchanged


async def test_pad(s: at.AsyncEagerSession) -> None:
    x = _rng.integers(-5, 5, size=(3, 4)).astype(np.float32)
    for width in (1, (1, 2), ((0, 1), (2, 0)), [[1, 1], [0, 3]]):
        for mode in ("constant", "edge", "reflect", "symmetric", "wrap"):
            await check_op(s, "pad", np.pad, x, width, mode=mode, exact=True)
    await check_op(s, "pad", np.pad, x, 2, constant_values=7.5, exact=True)
    await check_op(s, "pad", np.pad, x.astype(np.int8), ((1, 0), (0, 1)), constant_values=3, exact=True)
    await check_op(s, "pad", np.pad, x, ((1, 0),) * 3)  # too many pairs
    await check_op(s, "pad", np.pad, x, -1)  # negative
    with pytest.raises(at.InvalidArgumentError, match="mode must be"):
        await s.pad(x, 1, mode="mean")
    with pytest.raises(at.InvalidArgumentError, match="pad_width"):
        await s.pad(x, "1")  # type: ignore[arg-type]


async def test_median_quantile(s: at.AsyncEagerSession) -> None:
    for dt in (*FLOATS, np.int64, np.bool_):
        x: np.ndarray = _rng.integers(-9, 9, size=(4, 5, 6)).astype(dt)
        for axis in (None, 0, -1, (0, 2)):
            for keepdims in (False, True):
                await check_op(s, "median", np.median, x, axis=axis, keepdims=keepdims, rtol=1e-6)
                await check_op(s, "quantile", np.quantile, x, 0.3, axis=axis, keepdims=keepdims, rtol=1e-6)
        await check_op(s, "quantile", np.quantile, x, np.array([0.0, 0.25, 1.0]), axis=1, rtol=1e-6)
        for method in ("lower", "higher", "midpoint", "nearest"):
            await check_op(s, "quantile", np.quantile, x, 0.5, axis=-1, method=method, rtol=1e-6)
    await check_op(s, "median", np.median, np.array([1.0, np.nan, 2.0]))  # NaN propagates
    await check_op(s, "quantile", np.quantile, np.ones(3), 1.5)  # q out of range
    await check_op(s, "median", np.median, np.ones((2, 3)), axis=2)
    with pytest.raises(at.InvalidArgumentError, match="empty"):
        await s.median(np.zeros(0))
    with pytest.raises(at.InvalidArgumentError, match="method must be"):
        await s.quantile(np.ones(3), 0.5, method="weibull")


def _layer_norm(x: Any, shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """torch.nn.functional.layer_norm in numpy: biased variance over the last len(shape) axes."""
    a = np.asarray(x)
    dims = tuple(range(a.ndim - (1 if isinstance(shape, int) else len(shape)), a.ndim))
    out = (a - a.mean(axis=dims, keepdims=True)) / np.sqrt(a.var(axis=dims, keepdims=True) + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


async def test_layer_norm(s: at.AsyncEagerSession) -> None:
    for dt in FLOATS:
        x = (_rng.normal(size=(2, 3, 8)) * 4 + 1).astype(dt)
        w, b = _rng.normal(size=8).astype(dt), _rng.normal(size=8).astype(dt)
        r: Tolerance = {"rtol": 1e-4, "atol": 1e-5} if dt == np.float32 else {"rtol": 1e-12, "atol": 1e-12}
        await check_op(s, "layer_norm", _layer_norm, x, 8, **r)
        await check_op(s, "layer_norm", _layer_norm, x, (3, 8), **r)
        await check_op(s, "layer_norm", _layer_norm, x, [8], w, b, eps=1e-3, **r)
        await check_op(s, "layer_norm", _layer_norm, x, (8,), None, b, **r)
    with pytest.raises(at.InvalidArgumentError, match="does not match"):
        await s.layer_norm(np.ones((2, 3)), 4)
    with pytest.raises(at.InvalidArgumentError, match="eps"):
        await s.layer_norm(np.ones((2, 3)), 3, eps=-1.0)


async def test_nn_ops_compose_in_expressions_and_fused_functions(s: at.AsyncEagerSession) -> None:
    x = await s.constant(_rng.normal(size=(4, 6)))
    got = await (await s.logsumexp(await s.gelu(x * 2.0 + 1.0), axis=1)).numpy()
    want = _logsumexp(_gelu(await (x * 2.0 + 1.0).eval()), axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12)

    @at.function
    def head(ops: at.FusedOps, a: Any) -> Any:
        values, _ = ops.top_k(ops.layer_norm(a, 6), 2)
        return ops.one_hot(ops.argmax(ops.silu(values), axis=1), 2)

    out = await one(await head(x)).numpy()
    assert out.shape == (4, 2)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out[:, 0], 1)  # the largest value comes first


async def test_bad_input_allocates_nothing(sc: at.AsyncEagerSession) -> None:
    await assert_invalid(sc, lambda: sc.erf("abc"), "erf")
    await assert_invalid(sc, lambda: sc.one_hot(np.array([3]), 2), "one_hot", "class indices")
    await assert_invalid(sc, lambda: sc.scatter_add(np.zeros(2), np.array([[0]]), 1.0), "scatter_add", "1-d")
    await assert_invalid(sc, lambda: sc.quantile(np.zeros(3), 2.0), "quantile")


#: One or two rows per new op for the parity matrix: (op, args, kwargs, reference).
PARITY_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], Callable[..., Any]]] = [
    ("erf", (_rng.normal(scale=2, size=(3, 4)),), {}, math_erf),
    ("erf", (_rng.normal(size=SMALL + 7).astype(np.float32),), {}, math_erf),
    ("gelu", (_rng.normal(size=(2, 5)),), {}, _gelu),
    ("gelu", (_rng.normal(size=(2, 5)).astype(np.float32),), {"approximate": "tanh"}, _gelu),
    ("silu", (_rng.normal(size=6),), {}, lambda a: a / (1 + np.exp(-a))),
    ("softplus", (_rng.normal(scale=10, size=6),), {"beta": 2.0}, _softplus),
    ("logsumexp", (_rng.normal(size=(3, 4)),), {"axis": 1}, _logsumexp),
    ("one_hot", (_rng.integers(0, 4, size=5), 4), {}, _one_hot),
    ("top_k", (_rng.normal(size=(3, 6)), 2), {}, _top_k),
    ("bincount", (_rng.integers(0, 5, size=20),), {"minlength": 7}, np.bincount),
    ("scatter_add", (np.zeros((4, 2)), np.array([0, 3, 0]), np.ones((3, 2))), {}, _index_add),
    ("pad", (_rng.normal(size=(2, 3)), ((1, 0), (0, 2))), {"mode": "reflect"}, np.pad),
    ("median", (_rng.normal(size=(4, 5)),), {"axis": 0}, np.median),
    ("quantile", (_rng.normal(size=(4, 5)), np.array([0.1, 0.9])), {"axis": 1}, np.quantile),
    ("layer_norm", (_rng.normal(size=(2, 4)), 4), {"eps": 1e-6}, _layer_norm),
]


def _all_parity_cases() -> list[tuple[str, tuple[Any, ...], dict[str, Any], Callable[..., Any]]]:
    from .test_ops_fft import PARITY_CASES as FFT_CASES
    from .test_ops_linalg import PARITY_CASES as LINALG_CASES

    return [*LINALG_CASES, *FFT_CASES, *PARITY_CASES]


def test_every_new_op_has_an_estimate_that_never_crashes() -> None:
    """The inline-or-pool estimate on real arrays and on the shapes a program sees (``Spec``)."""
    from aiotensor._cost import Spec, estimate_us, out_spec
    from aiotensor._opdef import OPS, Cost

    def as_spec(a: Any) -> Any:
        return Spec(a.shape, a.itemsize) if isinstance(a, np.ndarray) else a

    for name, args, kwargs, _ in _all_parity_cases():
        d = OPS[name]
        pargs, pkw, nbytes = d.prepare(*args, **kwargs)
        for a, kw in (
            (pargs, pkw),
            (tuple(as_spec(a) for a in pargs), {k: as_spec(v) for k, v in (pkw or {}).items()}),
        ):
            est = estimate_us(d, a, kw or None, nbytes)
            assert est > 0, name
            if d.cost is Cost.UNKNOWN:  # output size unknown ahead (data-dependent, or grown by an argument)
                assert est == math.inf, name
            spec = out_spec(d, a, kw or None)
            assert spec is None or isinstance(spec, Spec), name


async def test_every_new_op_takes_an_expression(s: at.AsyncEagerSession) -> None:
    """Each parity case with its first array given as an expression: the program path, same values."""
    for name, args, kwargs, _ in _all_parity_cases():
        if not isinstance(args[0], np.ndarray):
            continue
        t = await s.constant(args[0])
        direct = await getattr(s, name)(t, *args[1:], **kwargs)
        lazy = await getattr(s, name)(t + np.zeros((), args[0].dtype), *args[1:], **kwargs)
        pairs = zip(direct, lazy, strict=True) if isinstance(direct, list | tuple) else [(direct, lazy)]
        for a, b in pairs:
            np.testing.assert_array_equal(await b.numpy(), await a.numpy(), err_msg=name, strict=True)
