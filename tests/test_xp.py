"""aiotensor.xp: the Array API namespace, lazy over the op table, checked against numpy and array-api-strict."""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _xpnames, xp
from aiotensor.testing import OPS

array_api_strict = pytest.importorskip("array_api_strict")


#: The reference speaks the standard aiotensor.xp implements (conftest.py).
pytestmark = pytest.mark.usefixtures("strict_2024_12")


def _standard_names() -> list[tuple[str, str | None]]:
    """(name, extension) of every function of the standard 2024.12, from array-api-strict's namespace."""
    with array_api_strict.ArrayAPIStrictFlags(api_version="2024.12"):
        return _names_in(array_api_strict)


def _names_in(strict: Any) -> list[tuple[str, str | None]]:
    skip = {"get_array_api_strict_flags", "set_array_api_strict_flags", "reset_array_api_strict_flags"}
    names: list[tuple[str, str | None]] = [
        (n, None)
        for n in strict.__all__
        if n not in skip and callable(getattr(strict, n)) and not isinstance(getattr(strict, n), type)
    ]
    names += [(n, "linalg") for n in strict.linalg.__all__]
    names += [(n, "fft") for n in strict.fft.__all__]
    return names


def _op_missing(name: str, extension: str | None) -> bool:
    """Whether the function has no op in the table yet (it arrives with the ops branches)."""
    if name in _xpnames.HAND_WRITTEN and name not in {"unique_all", "unique_counts", "unique_inverse"}:
        return name in {"eigh", "qr", "slogdet", "svd"} and name not in OPS
    if extension == "linalg" and name in _xpnames.LINALG_MAIN:
        return name not in OPS and name != "matrix_transpose"
    return _xpnames.op_for(name, extension) not in OPS


@pytest.mark.parametrize(
    ("name", "extension"),
    [
        pytest.param(
            n,
            ext,
            marks=pytest.mark.xfail(reason="its op is not in the table yet", strict=False)
            if _op_missing(n, ext)
            else (),
            id=f"{ext}.{n}" if ext else n,
        )
        for n, ext in _standard_names()
    ],
)
def test_every_standard_function_is_there(name: str, extension: str | None) -> None:
    namespace = getattr(xp, extension) if extension else xp
    assert callable(getattr(namespace, name, None)), f"aiotensor.xp{'.' + extension if extension else ''} lacks {name}"


def test_the_name_table_is_the_standards() -> None:
    assert sorted(n for n, ext in _standard_names() if ext is None) == sorted(_xpnames.MAIN)
    assert sorted(n for n, ext in _standard_names() if ext == "linalg") == sorted(_xpnames.LINALG)
    assert sorted(n for n, ext in _standard_names() if ext == "fft") == sorted(_xpnames.FFT)


def test_namespace_constants_dtypes_and_info() -> None:
    assert xp.__array_api_version__ == "2024.12"
    assert (xp.e, xp.pi, xp.inf) == (math.e, math.pi, math.inf)
    assert math.isnan(xp.nan)
    assert xp.newaxis is None
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        assert getattr(xp, name) == np.dtype(name)
    for name in ("float32", "float64", "complex64", "complex128"):
        assert getattr(xp, name) == np.dtype(name)
    info = xp.__array_namespace_info__()
    caps = info.capabilities()
    assert caps["boolean indexing"] is True
    assert caps["data-dependent shapes"] is True
    assert info.default_device() in info.devices()
    assert info.default_dtypes()["real floating"] == xp.float64
    assert info.default_dtypes()["indexing"] == xp.int64
    assert set(info.dtypes()) == {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
    assert set(info.dtypes(kind="real floating")) == {"float32", "float64"}


def test_every_public_name_is_documented_and_listed() -> None:
    public = {n for n in vars(xp) if not n.startswith("_") and not inspect.ismodule(getattr(xp, n))}
    public -= {"annotations"}
    constants = {"e", "pi", "inf", "nan", "newaxis", *xp.__array_namespace_info__().dtypes()}
    assert public - constants <= set(xp.__all__)
    for n in xp.__all__:
        obj = getattr(xp, n)
        if callable(obj) and not isinstance(obj, np.dtype):
            assert inspect.getdoc(obj), n


def test_dtype_functions_follow_the_standard() -> None:
    strict = array_api_strict
    pairs = [("int8", "uint8"), ("int8", "int64"), ("float32", "float64"), ("uint8", "uint16"), ("bool", "bool")]
    for a, b in pairs:
        assert (
            xp.result_type(getattr(xp, a), getattr(xp, b)).name
            == str(strict.result_type(getattr(strict, a), getattr(strict, b))).split(".")[-1]
        ), (a, b)
    assert xp.result_type(xp.float32, 1.0) == xp.float32  # Python scalars are weak
    assert xp.result_type(xp.int32, xp.float32) == xp.float64  # mixed kinds: numpy 2's rule
    assert xp.can_cast(xp.int8, xp.int16)
    assert not xp.can_cast(xp.float64, xp.float32)
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps
    assert xp.finfo(xp.float64).smallest_normal == np.finfo(np.float64).smallest_normal
    assert xp.iinfo(xp.int8).min == -128
    assert xp.isdtype(xp.int8, "integral")
    assert xp.isdtype(xp.float32, ("real floating", "complex floating"))
    assert not xp.isdtype(xp.uint8, "signed integer")
    assert xp.broadcast_shapes((2, 1), (3,)) == (2, 3)


async def test_functions_are_lazy_and_composable(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.linspace(-2.0, 2.0, 12).reshape(3, 4))
    before = s.stats().allocated
    e = xp.sum(xp.where(x > 0.0, xp.exp(x), xp.zeros_like(x)), axis=1)[:, None] / xp.maximum(xp.max(x), 1.0)
    assert isinstance(e, at.Expr)
    assert s.stats().allocated == before  # nothing ran
    assert e.shape == (3, 1)
    assert e.dtype == xp.float64
    v = np.linspace(-2.0, 2.0, 12).reshape(3, 4)
    expected = np.sum(np.where(v > 0, np.exp(v), 0.0), axis=1)[:, None] / max(v.max(), 1.0)
    np.testing.assert_allclose(await s.run(e), expected)
    np.testing.assert_allclose(await (await e).numpy(), expected)


async def test_creation_functions_evaluate_in_the_given_session(s: at.AsyncEagerSession) -> None:
    cases: list[tuple[at.Expr, Any]] = [
        (xp.zeros(3), np.zeros(3)),
        (xp.ones((2, 2), dtype=xp.int32), np.ones((2, 2), np.int32)),
        (xp.empty((0, 2)), np.empty((0, 2))),
        (xp.full((2,), 7), np.full((2,), 7)),
        (xp.arange(5), np.arange(5)),
        (xp.arange(1.0, 2.0, 0.25), np.arange(1.0, 2.0, 0.25)),
        (xp.linspace(0, 1, 5, endpoint=False), np.linspace(0, 1, 5, endpoint=False)),
        (xp.eye(3, 4, k=1), np.eye(3, 4, k=1)),
        (xp.asarray([[1, 2], [3, 4]], dtype=xp.float32), np.array([[1, 2], [3, 4]], np.float32)),
        (xp.from_dlpack(np.arange(3.0)), np.arange(3.0)),
        (xp.full(3, 2.0) + xp.ones(3), np.full(3, 3.0)),
    ]
    for expr, expected in cases:
        got = await s.run(expr)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(await xp.arange(3).eval(session=s), [0, 1, 2])
    with pytest.raises(at.InvalidDeviceError):
        xp.zeros(3, device="/gpu:0")
    assert xp.zeros(3, device=xp.__array_namespace_info__().default_device()).shape == (3,)


async def test_like_functions_and_casts(s: at.AsyncEagerSession) -> None:
    v = np.arange(6, dtype=np.int16).reshape(2, 3)
    x = await s.constant(v)
    cases: list[tuple[at.Expr, np.ndarray]] = [
        (xp.zeros_like(x), np.zeros_like(v)),
        (xp.ones_like(x, dtype=xp.float32), np.ones_like(v, dtype=np.float32)),
        (xp.empty_like(x), np.zeros_like(v)),
        (xp.full_like(x, 2.7), np.full_like(v, 2.7)),
        (xp.full_like(x, True, dtype=xp.bool), np.full_like(v, True, dtype=bool)),
        (xp.astype(x, xp.float64), v.astype(np.float64)),
        (xp.asarray(x), v),
        (xp.asarray(x, dtype=xp.int64), v.astype(np.int64)),
        (xp.positive(x), v),
        (xp.matrix_transpose(x), v.T),
    ]
    for expr, expected in cases:
        got = await s.run(expr)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


async def test_several_results(s: at.AsyncEagerSession) -> None:
    a, b = await s.constant([1, 2, 3]), await s.constant([10, 20])
    for indexing in ("xy", "ij"):
        got = await s.run(xp.meshgrid(a, b, indexing=indexing))
        for g, e in zip(got, np.meshgrid([1, 2, 3], [10, 20], indexing=indexing), strict=True):
            np.testing.assert_array_equal(g, e)
    m = await s.constant(np.arange(6.0).reshape(2, 3))
    got = await s.run(xp.broadcast_arrays(m, a))
    for g, e in zip(got, np.broadcast_arrays(np.arange(6.0).reshape(2, 3), np.array([1, 2, 3])), strict=True):
        np.testing.assert_array_equal(g, e)
    parts = xp.unstack(m, axis=1)
    assert isinstance(parts, tuple)
    assert len(parts) == 3
    np.testing.assert_array_equal(await s.run(parts[2]), [2.0, 5.0])
    with pytest.raises(IndexError):
        xp.unstack(m, axis=2)


async def test_boolean_masks_and_data_dependent_shapes(s: at.AsyncEagerSession) -> None:
    v = np.arange(12.0).reshape(4, 3)
    x = await s.constant(v)
    lab = await s.constant([0, 1, 0, 2])
    picked = x[lab == 0]
    assert picked.shape == (None, 3)
    np.testing.assert_array_equal(await s.run(picked), v[np.array([0, 1, 0, 2]) == 0])
    np.testing.assert_array_equal(await s.run(xp.mean(x[lab == 0], axis=0)), v[[0, 2]].mean(axis=0))
    with pytest.raises(IndexError):
        await x[np.ones((4, 3, 1), bool)]  # more mask dimensions than the array
    with pytest.raises(at.InvalidArgumentError):
        await x[7]  # out of range: an IndexError and an InvalidArgumentError


async def test_array_namespace_is_how_generic_code_finds_it(s: at.AsyncEagerSession) -> None:
    def standardize(x: Any) -> Any:
        ns = x.__array_namespace__()
        return (x - ns.mean(x, axis=0)) / ns.std(x, axis=0)

    v = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 10.0]])
    t = await s.constant(v)
    expected = standardize(array_api_strict.asarray(v))
    np.testing.assert_allclose(await s.run(standardize(t)), np.asarray(expected._array))
    assert t.__array_namespace__() is xp


def test_a_forgotten_await_in_an_xp_call_is_named() -> None:
    async def not_awaited() -> None:
        return None

    coro = not_awaited()
    with pytest.raises(TypeError, match=r"'x' is a coroutine"):
        xp.sum(coro, axis=0)


def test_a_missing_op_is_absent_not_broken() -> None:
    for n in ("unique_all", "unique_counts", "unique_inverse"):
        assert hasattr(xp, n) == (n in OPS)
    for n in ("svd", "eigh", "qr", "slogdet"):
        assert hasattr(xp.linalg, n) == (n in OPS)


async def test_complex_sign_is_x_over_its_magnitude(s: at.AsyncEagerSession) -> None:
    v = np.array([3 + 4j, -2j, 0j, 2.1667606e-39j], np.complex128)
    got = await s.run(xp.sign(await s.constant(v)))
    np.testing.assert_allclose(got, [0.6 + 0.8j, -1j, 0j, 1j], rtol=1e-15)
    assert got.dtype == np.complex128


async def test_an_op_with_several_results_gives_a_tuple(s: at.AsyncEagerSession) -> None:
    from aiotensor.xp._node import results  # how a generated multi-output function (nonzero) builds its tuple

    x = await s.constant(np.arange(12.0).reshape(2, 6))
    parts = results(OPS["split"], (x, [1, 4]), {"axis": 1})
    assert isinstance(parts, tuple)
    assert [p.shape for p in parts] == [(2, 1), (2, 3), (2, 2)]
    for got, expected in zip(
        await s.run(list(parts)), np.split(np.arange(12.0).reshape(2, 6), [1, 4], axis=1), strict=True
    ):
        np.testing.assert_array_equal(got, expected)


def test_metadata_of_creation_functions() -> None:
    assert xp.asarray([[1, 2], [3, 4]]).shape == (2, 2)
    assert xp.asarray(1.5).dtype == xp.float64
    assert xp.zeros((2, 3), dtype=xp.int8).dtype == xp.int8
    assert xp.arange(10**9).shape is None  # not made to learn its shape
    assert xp.eye(3, 2).shape == (3, 2)


async def test_creation_functions_run_in_the_default_session(strategy: at.ResourceCleanupStrategy) -> None:
    # The contract: an expression of no tensor runs in the default session when awaited.
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        with s.as_default():
            t = await xp.zeros(3)
            assert isinstance(t, at.Tensor)
            np.testing.assert_array_equal(await t.numpy(), np.zeros(3))
            np.testing.assert_array_equal(await (xp.arange(4) * 2).eval(), [0, 2, 4, 6])
            np.testing.assert_array_equal(await xp.asarray([1, 2]).eval(), [1, 2])
            assert t.device == xp.ones(2).device
            del t
        e = xp.ones(2)
        with pytest.raises(at.NoSessionError, match=r"as_default\(\)"):
            await e
        with pytest.raises(at.NoSessionError, match="session="):
            await e.eval()
        np.testing.assert_array_equal(await e.eval(session=s), [1.0, 1.0])


async def test_shapes_of_large_inputs_and_data_dependent_inputs(s: at.AsyncEagerSession) -> None:
    # Sizes known before running are in the shape, whatever the input's size; a
    # data-dependent size is None, the other dimensions stay known.
    big = await s.zeros((3000, 4))
    n = await s.constant([1, 0, 2, 2])
    u = xp.unique_values(n)
    cases: list[tuple[at.Expr, Any, Any]] = [
        (xp.sort(big, axis=0), (3000, 4), np.float64),
        (xp.argsort(big[:, 0]), (3000,), np.int64),
        (xp.cumulative_sum(big, axis=0), (3000, 4), np.float64),
        (xp.cumulative_sum(big[:, 0], include_initial=True), (3001,), np.float64),
        (xp.flip(big, axis=0), (3000, 4), np.float64),
        (xp.roll(big, 3, axis=0), (3000, 4), np.float64),
        (xp.tril(big), (3000, 4), np.float64),
        (big.mT, (4, 3000), np.float64),
        (xp.moveaxis(big, 0, 1), (4, 3000), np.float64),
        (xp.isin(big, n), (3000, 4), np.bool_),
        (xp.repeat(big, 2, axis=0), (6000, 4), np.float64),
        (xp.repeat(n, 3), (12,), np.int64),
        (xp.repeat(n, n), (None,), np.int64),
        (xp.astype(u, xp.float64), (None,), np.float64),
        (xp.sort(u), (None,), np.int64),
        (xp.cumulative_sum(u), (None,), np.int64),
        (xp.count_nonzero(big > 0, axis=0), (4,), np.int64),
        (xp.count_nonzero(big, axis=1, keepdims=True), (3000, 1), np.int64),
        (xp.linalg.vector_norm(big, axis=1), (3000,), np.float64),
        (xp.vecdot(big, big[:1]), (3000,), np.float64),
        (xp.diff(big, axis=0, n=2), (2998, 4), np.float64),
        (xp.searchsorted(xp.sort(big[:, 0]), big[:5, 1]), (5,), np.int64),
        (xp.astype(xp.unique_values(big), xp.float32), (None,), np.float32),
    ]
    for expr, shape, dtype in cases:
        assert expr.shape == shape, expr
        assert expr.dtype == np.dtype(dtype), expr
        value = await s.run(expr)
        assert value.dtype == dtype
        assert value.ndim == len(shape)
        assert all(a is None or a == b for a, b in zip(shape, value.shape, strict=True)), (expr, value.shape)


def _score(x: Any, w: Any, y: Any) -> dict[str, Any]:
    """A scoring function written once against the standard (a user's, from issue 28)."""
    ns = x.__array_namespace__()
    logits = ns.matmul(x, w)
    p = ns.exp(logits - ns.max(logits, axis=-1, keepdims=True))
    p = p / ns.sum(p, axis=-1, keepdims=True)
    picked = ns.take_along_axis(p, ns.reshape(y, (-1, 1)), axis=1)
    entropy = -ns.sum(p * ns.log(p + 1e-12), axis=1)
    return {
        "nll": -ns.mean(ns.log(ns.clip(picked, 1e-12, 1.0))),
        "accuracy": ns.mean(ns.astype(ns.argmax(p, axis=-1) == y, ns.float64)),
        "top": ns.argsort(-p[:, 0], stable=True)[:5],
        "uncertain": ns.sum(ns.where(entropy > ns.mean(entropy), 1.0, 0.0)),
        "norms": ns.linalg.vector_norm(x, axis=1),
        "positive": ns.count_nonzero(x > 0, axis=0),
        "outlier": ns.any(x > 3),
    }


async def test_generic_code_gives_numpys_numbers_bit_for_bit(session: at.AsyncEagerSession) -> None:
    rng = np.random.default_rng(2)
    v, w, y = rng.normal(size=(200, 8)), rng.normal(size=(8, 3)), rng.integers(0, 3, 200)
    expected = _score(v, w, y)  # numpy 2 arrays answer __array_namespace__ with numpy
    got = await session.run(_score(*[await session.constant(a) for a in (v, w, y)]))
    for name, want in expected.items():
        value = got[name]
        assert value.dtype == np.asarray(want).dtype, name
        assert value.tobytes() == np.asarray(want).tobytes(), name
