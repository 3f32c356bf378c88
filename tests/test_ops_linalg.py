"""The ``linalg`` extension's ops against ``array_api_strict.linalg`` (the standard's reference) and numpy.

Batched stacks, float32/float64/complex, empty matrices, the standard's dtype rules
(integers refused where the reference refuses them) and singular or malformed input.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiotensor as at
from aiotensor._ops._linalg import RESULTS, EighResult, QRResult, SlogdetResult, SVDResult

from ._opcheck import Tolerance, assert_invalid, assert_same, check_op, running_session
from ._results import one

_rng = np.random.default_rng(28)
FLOATS = [np.float32, np.float64]
INEXACT = [np.float32, np.float64, np.complex64, np.complex128]


def strict(name: str) -> Callable[..., Any]:
    """``array_api_strict.linalg.<name>`` on numpy arrays, giving numpy arrays (a tuple for several)."""
    fn = getattr(xps.linalg, name)

    def ref(*args: Any, **kwargs: Any) -> Any:
        conv = [xps.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        kw: dict[str, Any] = {k: xps.asarray(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        if kw.get("dtype") is not None:
            kw["dtype"] = getattr(xps, np.dtype(kw["dtype"]).name)
        out = fn(*conv, **kw)
        return tuple(np.asarray(o._array) for o in out) if isinstance(out, tuple) else np.asarray(out._array)

    ref.__name__ = f"array_api_strict.linalg.{name}"
    return ref


def rand(*shape: int, dtype: Any = np.float64) -> np.ndarray:
    """Normal values; complex dtypes get an imaginary part too."""
    x = _rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * _rng.normal(size=shape)
    return np.asarray(x).astype(dtype)


def spd(*shape: int, dtype: Any = np.float64) -> np.ndarray:
    """Hermitian positive-definite matrices (well conditioned)."""
    a = rand(*shape, dtype=dtype)
    n = shape[-1]
    return np.asarray(a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)).astype(dtype)


def tol(dtype: Any) -> Tolerance:
    """Tolerances for a linear-algebra result of this dtype (the standard leaves them to the library)."""
    single = np.dtype(dtype) in (np.float32, np.complex64)
    return {"rtol": 2e-4, "atol": 2e-4} if single else {"rtol": 1e-10, "atol": 1e-10}


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


SQUARE_OPS = ["det", "inv", "eigvalsh"]


@pytest.mark.parametrize("name", SQUARE_OPS)
async def test_square_matrix_ops(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    for dt in INEXACT:
        for shape in [(3, 3), (2, 4, 4), (2, 1, 2, 2), (1, 1)]:
            x = spd(*shape, dtype=dt) if name == "eigvalsh" else rand(*shape, dtype=dt)
            await check_op(s, name, ref, x, **tol(dt))
    await check_op(s, name, ref, np.zeros((0, 3, 3)))  # an empty stack
    await check_op(s, name, ref, np.eye(3, dtype=np.int64))  # integers: refused as the reference does
    await check_op(s, name, ref, rand(2, 3))  # not square


async def test_det_of_empty_matrix(s: at.AsyncEagerSession) -> None:
    await check_op(s, "det", np.linalg.det, np.zeros((0, 0)))


async def test_cholesky(s: at.AsyncEagerSession) -> None:
    ref = strict("cholesky")
    for dt in INEXACT:
        for shape in [(3, 3), (2, 4, 4)]:
            x = spd(*shape, dtype=dt)
            await check_op(s, "cholesky", ref, x, **tol(dt))
            await check_op(s, "cholesky", ref, x, upper=True, **tol(dt))
            upper = await (await s.cholesky(x, upper=True)).numpy()
            np.testing.assert_allclose(np.conj(np.swapaxes(upper, -1, -2)) @ upper, x, **tol(dt))
    await check_op(s, "cholesky", ref, -np.eye(2))  # not positive definite


async def test_solve(s: at.AsyncEagerSession) -> None:
    ref = strict("solve")
    for dt in INEXACT:
        a = rand(2, 3, 3, dtype=dt) + 3 * np.eye(3, dtype=dt)
        await check_op(s, "solve", ref, a, rand(2, 3, 2, dtype=dt), **tol(dt))  # stacks of matrices
        await check_op(s, "solve", ref, a, rand(3, dtype=dt), **tol(dt))  # a 1-d x2 is a vector
        await check_op(s, "solve", ref, a[0], rand(4, 3, 1, dtype=dt), **tol(dt))  # x1 broadcast
    await check_op(s, "solve", ref, rand(3, 3, dtype=np.float32), rand(3))  # float32 with float64: float64
    await check_op(s, "solve", ref, np.ones((2, 2)), np.ones(2))  # singular
    await check_op(s, "solve", ref, np.eye(3), np.ones(2))  # shapes do not match
    await check_op(s, "solve", ref, np.eye(2, dtype=np.int32), np.ones(2))


async def test_singular_matrix_is_an_invalid_argument(sc: at.AsyncEagerSession) -> None:
    await assert_invalid(sc, lambda: sc.inv(np.ones((2, 2))), "inv", "singular matrix", "no inverse")
    await assert_invalid(sc, lambda: sc.solve(np.zeros((2, 2)), np.ones(2)), "solve", "singular matrix")
    await assert_invalid(sc, lambda: sc.cholesky(-np.eye(3)), "cholesky", "not positive definite")
    await assert_invalid(sc, lambda: sc.matrix_power(np.zeros((2, 2)), -1), "matrix_power", "singular")


async def test_multi_output_ops(s: at.AsyncEagerSession) -> None:
    """eigh, qr, slogdet and svd return the standard's named tuple of tensors."""
    assert dict(RESULTS) == {"eigh": EighResult, "qr": QRResult, "slogdet": SlogdetResult, "svd": SVDResult}
    assert EighResult._fields == xps.linalg.EighResult._fields
    assert QRResult._fields == xps.linalg.QRResult._fields
    assert SlogdetResult._fields == xps.linalg.SlogdetResult._fields
    assert SVDResult._fields == xps.linalg.SVDResult._fields
    for dt in INEXACT:
        t = tol(dt)
        for shape in [(3, 3), (2, 4, 4)]:
            x = rand(*shape, dtype=dt)
            sign, logabs = await _values(await s.slogdet(x))
            want = strict("slogdet")(x)
            assert_same(sign, want[0], "slogdet sign", exact=False, **t)
            assert_same(logabs, want[1], "slogdet logabsdet", exact=False, **t)
            h = spd(*shape, dtype=dt)
            w, v = await _values(await s.eigh(h))
            assert_same(w, strict("eigh")(h)[0], "eigh eigenvalues", exact=False, **t)
            np.testing.assert_allclose(h @ v, v * w[..., None, :], **t)  # eigenvectors up to sign/phase
        for shape in [(4, 3), (2, 3, 5)]:
            x = rand(*shape, dtype=dt)
            for mode in ("reduced", "complete"):
                q, r = await _values(await s.qr(x, mode=mode))
                wq, wr = strict("qr")(x, mode=mode)
                assert (q.shape, r.shape, q.dtype, r.dtype) == (wq.shape, wr.shape, wq.dtype, wr.dtype)
                np.testing.assert_allclose(q @ r, x, **t)
            for full in (True, False):
                u, sv, vh = await _values(await s.svd(x, full_matrices=full))
                wu, ws, wvh = strict("svd")(x, full_matrices=full)
                assert (u.shape, vh.shape, u.dtype, vh.dtype) == (wu.shape, wvh.shape, wu.dtype, wvh.dtype)
                assert_same(sv, ws, "svd S", exact=False, **t)
                k = min(x.shape[-2:])
                np.testing.assert_allclose((u[..., :k] * sv[..., None, :]) @ vh[..., :k, :], x, **t)
    for name in ("slogdet", "eigh", "qr", "svd"):
        with pytest.raises(at.InvalidArgumentError, match=name):
            await getattr(s, name)(np.eye(3, dtype=np.int64))
        with pytest.raises(at.InvalidArgumentError, match=name):
            await getattr(at, name)(await s.constant(np.ones(3)))


async def _values(tensors: tuple[at.Tensor, ...]) -> list[np.ndarray]:
    assert type(tensors) in RESULTS.values()
    assert all(isinstance(t, at.Tensor) for t in tensors)
    return [await t.numpy() for t in tensors]


async def _check_with_rtol(s: at.AsyncEagerSession, name: str, x: np.ndarray, rtol: Any, *, exact: bool) -> None:
    """``name(x, rtol=rtol)`` as a session method and a module function (an array rtol also as a tensor)."""
    want = strict(name)(x, rtol=rtol)
    t = await s.constant(x)
    rtols = [rtol] if not isinstance(rtol, np.ndarray) else [rtol, await s.constant(rtol)]
    for r in rtols:
        for how, fn in (("method", getattr(s, name)), ("module function", getattr(at, name))):
            got = await (await fn(t, rtol=r)).numpy()
            assert_same(got, want, f"{name}(rtol={r!r}) via {how}", exact=exact, rtol=1e-6 if exact else 1e-10)


async def test_svdvals_pinv_matrix_rank(s: at.AsyncEagerSession) -> None:
    for dt in INEXACT:
        for shape in [(4, 3), (2, 3, 5), (3, 3)]:
            x = rand(*shape, dtype=dt)
            await check_op(s, "svdvals", strict("svdvals"), x, **tol(dt))
            await check_op(s, "pinv", strict("pinv"), x, **tol(dt))
            await check_op(s, "matrix_rank", strict("matrix_rank"), x, exact=True)
    low = rand(5, 2) @ rand(2, 4)  # rank 2
    await check_op(s, "matrix_rank", strict("matrix_rank"), low, exact=True)
    # The ops' own rtol (check_op's rtol= is its comparison tolerance, not an op argument).
    steps = np.diag([1.0, 0.1, 1e-3])  # singular values 1, 0.1, 0.001: every rtol below changes the answer
    for rtol, rank in ((None, 3), (0.05, 2), (0.5, 1), (np.array([1e-9, 0.5]), [3, 1])):
        x = np.stack([steps, steps]) if isinstance(rtol, np.ndarray) else steps
        np.testing.assert_array_equal(strict("matrix_rank")(x, rtol=rtol), rank)  # the case can tell
        await _check_with_rtol(s, "matrix_rank", x, rtol, exact=True)
    for rtol in (None, 0.05, 0.5):
        await _check_with_rtol(s, "pinv", steps, rtol, exact=False)
    assert not np.allclose(strict("pinv")(steps, rtol=0.05), strict("pinv")(steps))
    await _check_with_rtol(s, "pinv", low, 1e-3, exact=False)
    # empty matrices have rank 0 (the reference's max over no singular values raises)
    await check_op(s, "matrix_rank", lambda x: np.zeros(x.shape[:-2], np.int64), np.zeros((2, 0, 3)), exact=True)
    await check_op(s, "matrix_rank", strict("matrix_rank"), np.ones(3))  # 1-d: refused
    await check_op(s, "svdvals", strict("svdvals"), np.eye(2, dtype=np.int8))


async def test_matrix_power(s: at.AsyncEagerSession) -> None:
    ref = strict("matrix_power")
    for dt in INEXACT:
        x = rand(2, 3, 3, dtype=dt) + 2 * np.eye(3, dtype=dt)
        for n in (0, 1, 2, 5, -1, -3):
            await check_op(s, "matrix_power", ref, x, n, **tol(dt))
    await check_op(s, "matrix_power", ref, rand(2, 3), 2)
    await check_op(s, "matrix_power", ref, np.eye(2, dtype=np.int64), 2)
    with pytest.raises(at.InvalidArgumentError, match="n must be an int"):
        await s.matrix_power(np.eye(2), 1.5)  # type: ignore[arg-type]


async def test_matrix_norm(s: at.AsyncEagerSession) -> None:
    ref = strict("matrix_norm")
    for dt in INEXACT:
        x = rand(2, 3, 4, dtype=dt)
        for order in ("fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf):
            for keepdims in (False, True):
                await check_op(s, "matrix_norm", ref, x, ord=order, keepdims=keepdims, **tol(dt))
    await check_op(s, "matrix_norm", ref, np.eye(3, dtype=np.int32))
    await check_op(s, "matrix_norm", ref, np.ones(3))
    with pytest.raises(at.InvalidArgumentError, match="ord must be one of"):
        await s.matrix_norm(np.eye(2), ord=3)
    zero = await (await s.matrix_norm(np.zeros((2, 0, 3)), keepdims=True)).numpy()
    assert zero.shape == (2, 1, 1)
    assert not zero.any()


async def test_vector_norm(s: at.AsyncEagerSession) -> None:
    ref = strict("vector_norm")
    for dt in INEXACT:
        x = rand(2, 3, 4, dtype=dt)
        for axis in (None, 0, -1, (0, 2), (1,), (0, 1, 2)):
            for order in (2, 1, np.inf, -np.inf, 0, 3, 0.5, -1):
                await check_op(s, "vector_norm", ref, x, axis=axis, ord=order, **tol(dt))
            await check_op(s, "vector_norm", ref, x, axis=axis, keepdims=True, **tol(dt))
    await check_op(s, "vector_norm", ref, np.asarray(-3.0))  # 0-d
    await check_op(s, "vector_norm", ref, np.zeros((0, 3)), axis=0)  # empty: zeros
    await check_op(s, "vector_norm", ref, np.arange(3))  # integers refused
    await check_op(s, "vector_norm", ref, rand(2, 3), axis=2)
    await check_op(s, "vector_norm", ref, rand(2, 3), axis=(0, 0))
    big = np.array([1e200, 1e200])
    with np.errstate(over="ignore"):  # kernels follow the caller's errstate
        assert np.isinf(await (await s.vector_norm(big)).numpy())  # as numpy: no rescaling


async def test_trace_diagonal(s: at.AsyncEagerSession) -> None:
    for dt in [np.int8, np.int32, np.uint8, np.float32, np.float64, np.complex64]:
        x = (rand(2, 3, 4) * 3).astype(dt)
        for offset in (0, 1, -1, 5):
            await check_op(s, "trace", strict("trace"), x, offset=offset, **tol(dt))
            await check_op(s, "diagonal", strict("diagonal"), x, offset=offset, exact=True)
    x = rand(3, 3)
    await check_op(s, "trace", strict("trace"), x, dtype=np.float32, rtol=1e-6)
    await check_op(s, "trace", strict("trace"), np.eye(3, dtype=bool))  # bool: refused, as the reference
    await check_op(s, "diagonal", strict("diagonal"), np.eye(3, dtype=bool), exact=True)
    await check_op(s, "diagonal", strict("diagonal"), np.ones(3))
    await check_op(s, "trace", strict("trace"), np.zeros((2, 0, 0)))


async def test_cross_outer(s: at.AsyncEagerSession) -> None:
    for dt in [np.int32, np.float32, np.float64, np.complex128]:
        a, b = (rand(4, 3) * 3).astype(dt), (rand(3) * 3).astype(dt)
        await check_op(s, "cross", strict("cross"), a, b, **tol(dt))
        await check_op(s, "cross", strict("cross"), (rand(3, 2) * 3).astype(dt), (rand(3, 2) * 3).astype(dt), axis=-2)
        await check_op(s, "outer", strict("outer"), a[0], (rand(5) * 3).astype(dt), **tol(dt))
    await check_op(s, "cross", strict("cross"), rand(2), rand(2))  # 2-vectors: refused (numpy allows them)
    await check_op(s, "cross", strict("cross"), rand(3, 3), rand(3, 3), axis=0)  # a positive axis
    await check_op(s, "cross", strict("cross"), rand(3), rand(3), axis=-2)
    await check_op(s, "outer", strict("outer"), rand(2, 2), rand(2))
    await check_op(s, "outer", strict("outer"), np.ones(2, bool), np.ones(2, bool))
    await check_op(s, "outer", strict("outer"), np.zeros(0), rand(3))


async def test_linalg_in_expressions_and_fused_functions(s: at.AsyncEagerSession) -> None:
    x = await s.constant(spd(3, 3))
    e = x.sum() + 0.0
    got = await (await s.inv(e * 0 + x)).numpy()
    np.testing.assert_allclose(got, np.linalg.inv(await x.numpy()), rtol=1e-12)

    @at.function
    def f(ops: at.FusedOps, a: Any) -> Any:
        w, v = ops.eigh(a)
        return ops.det(ops.inv(a)) + 0 * ops.sum(w) + 0 * ops.sum(v)

    np.testing.assert_allclose(await one(await f(x)).numpy(), 1 / np.linalg.det(await x.numpy()), rtol=1e-12)


async def test_factorization_cost_estimate() -> None:
    """Small matrices are inlined, large ones go to the pool (an n^3 estimate, not the element count)."""
    from aiotensor._cost import DEFAULT_INLINE_US, estimate_us
    from aiotensor._opdef import OPS

    for name in ("inv", "svd", "eigh", "det", "cholesky", "pinv", "qr", "svdvals"):
        d = OPS[name]
        assert estimate_us(d, (np.eye(4),), None, None) < DEFAULT_INLINE_US, name
        assert estimate_us(d, (np.eye(300),), None, None) > 100 * DEFAULT_INLINE_US, name
        assert estimate_us(d, (np.zeros((500, 8, 8)),), None, None) > DEFAULT_INLINE_US, name


#: One or two rows per new op for the parity matrix: (op, args, kwargs, reference).
PARITY_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], Callable[..., Any]]] = [
    ("cholesky", (spd(2, 3, 3),), {}, strict("cholesky")),
    ("cholesky", (spd(3, 3, dtype=np.float32),), {"upper": True}, strict("cholesky")),
    ("det", (rand(2, 3, 3),), {}, strict("det")),
    ("slogdet", (rand(2, 3, 3),), {}, strict("slogdet")),
    ("inv", (rand(3, 3) + 3 * np.eye(3),), {}, strict("inv")),
    ("inv", (rand(2, 2, 2, dtype=np.complex64) + 2 * np.eye(2, dtype=np.complex64),), {}, strict("inv")),
    ("eigh", (spd(2, 3, 3),), {}, strict("eigh")),
    ("eigvalsh", (spd(3, 3),), {}, strict("eigvalsh")),
    ("qr", (rand(4, 3),), {}, strict("qr")),
    ("svd", (rand(3, 4),), {"full_matrices": False}, strict("svd")),
    ("svdvals", (rand(2, 3, 4),), {}, strict("svdvals")),
    ("solve", (rand(3, 3) + 3 * np.eye(3), rand(3)), {}, strict("solve")),
    ("solve", (rand(2, 3, 3) + 3 * np.eye(3), rand(2, 3, 2)), {}, strict("solve")),
    ("matrix_rank", (rand(5, 2) @ rand(2, 4),), {}, strict("matrix_rank")),
    ("pinv", (rand(4, 3),), {}, strict("pinv")),
    ("matrix_power", (rand(3, 3), 3), {}, strict("matrix_power")),
    ("matrix_norm", (rand(2, 3, 4),), {"ord": "nuc"}, strict("matrix_norm")),
    ("matrix_norm", (rand(3, 4, dtype=np.float32),), {"keepdims": True}, strict("matrix_norm")),
    ("vector_norm", (rand(2, 3, 4),), {"axis": (0, 2), "ord": 3}, strict("vector_norm")),
    ("vector_norm", (rand(5, dtype=np.complex64),), {}, strict("vector_norm")),
    ("trace", (rand(2, 3, 3),), {"offset": 1}, strict("trace")),
    ("diagonal", (rand(2, 3, 4),), {"offset": -1}, strict("diagonal")),
    ("cross", (rand(4, 3), rand(3)), {}, strict("cross")),
    ("outer", (rand(3), rand(4)), {}, strict("outer")),
]


# -- differential: hypothesis-drawn stacks against array_api_strict ---------------------------------

_DTYPES = [np.float32, np.float64, np.complex64, np.complex128, np.int64]
# (op, square matrices, keyword arguments drawn per example)
_UNARY = [
    ("det", True),
    ("inv", True),
    ("slogdet", True),
    ("eigh", True),
    ("eigvalsh", True),
    ("cholesky", True),
    ("matrix_power", True),
    ("svd", False),
    ("svdvals", False),
    ("qr", False),
    ("pinv", False),
    ("matrix_rank", False),
    ("matrix_norm", False),
    ("vector_norm", False),
    ("trace", False),
    ("diagonal", False),
]
# Where the reference refuses what the standard leaves open: numpy's norm and max of no
# elements raise, aiotensor answers 0 (the norm and the rank of an empty matrix).
_EMPTY_ANSWERS = {"matrix_norm", "matrix_rank"}


@pytest.fixture(scope="module")
def runner() -> Iterator[tuple[asyncio.Runner, at.AsyncEagerSession]]:
    """One event loop and session for every hypothesis example of the module."""
    with running_session() as pair:
        yield pair


def _kwargs(name: str, draw: Any) -> dict[str, Any]:
    if name == "matrix_norm":
        return {
            "ord": draw(st.sampled_from(["fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf])),
            "keepdims": draw(st.booleans()),
        }
    if name == "vector_norm":
        return {"ord": draw(st.sampled_from([2, 1, 0, np.inf, -np.inf, 3])), "keepdims": draw(st.booleans())}
    if name in ("trace", "diagonal"):
        return {"offset": draw(st.integers(-2, 2))}
    if name == "qr":
        return {"mode": draw(st.sampled_from(["reduced", "complete"]))}
    if name == "svd":
        return {"full_matrices": draw(st.booleans())}
    if name == "cholesky":
        return {"upper": draw(st.booleans())}
    return {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_against_array_api_strict(runner: Any, data: Any) -> None:
    loop, session = runner
    name, square = data.draw(st.sampled_from(_UNARY), label="op")
    dt = data.draw(st.sampled_from(_DTYPES), label="dtype")
    batch = tuple(data.draw(st.lists(st.integers(0, 3), max_size=2), label="batch"))
    m = data.draw(st.integers(0, 4), label="rows")
    n = m if square else data.draw(st.integers(0, 4), label="cols")
    x = rand(*batch, m, n, dtype=dt) if np.dtype(dt).kind != "i" else _rng.integers(-3, 4, (*batch, m, n))
    if data.draw(st.booleans(), label="hermitian positive definite") and square:
        x = spd(*batch, m, n, dtype=dt) if np.dtype(dt).kind != "i" else x
    if data.draw(st.integers(0, 9), label="singular") == 0:
        x = np.ones_like(x)
    args: tuple[Any, ...] = (x, data.draw(st.integers(-2, 3), label="n")) if name == "matrix_power" else (x,)
    kwargs = _kwargs(name, data.draw)
    try:
        with np.errstate(all="ignore"):
            want = strict(name)(*args, **kwargs)
    except (TypeError, ValueError, IndexError) as exc:  # LinAlgError is a ValueError
        if name in _EMPTY_ANSWERS and x.size == 0:
            return
        with pytest.raises(at.InvalidArgumentError, match=name):
            loop.run(getattr(session, name)(*args, **kwargs))
        del exc
        return
    with np.errstate(all="ignore"):
        got = loop.run(getattr(session, name)(*args, **kwargs))
    gots = got if isinstance(got, list | tuple) else [got]
    wants = want if isinstance(want, tuple) else (want,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants, strict=True):
        assert_same(loop.run(g.numpy()), w, name, exact=False, **tol(x.dtype if x.dtype.kind != "i" else np.float64))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_solve_cross_outer_differential(runner: Any, data: Any) -> None:
    loop, session = runner
    dt1, dt2 = (data.draw(st.sampled_from(_DTYPES), label=f"dtype {i}") for i in (1, 2))
    if np.dtype(dt1).kind != np.dtype(dt2).kind:
        dt2 = dt1  # the reference refuses mixed kinds (the standard leaves them to the library)
    b1 = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="batch 1"))
    b2 = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="batch 2"))
    m = data.draw(st.integers(1, 4), label="m")
    name = data.draw(st.sampled_from(["solve", "cross", "outer"]), label="op")
    if name == "solve":
        x1 = rand(*b1, m, m, dtype=np.float64) + 4 * np.eye(m)
        shape2 = (m,) if data.draw(st.booleans(), label="vector") else (*b2, m, data.draw(st.integers(1, 3)))
        args: tuple[np.ndarray, ...] = (x1, rand(*shape2))
    elif name == "cross":
        args = (rand(*b1, 3), rand(*b2[-len(b1) :] if b1 else b2, 3))
        if data.draw(st.booleans(), label="wrong length"):
            args = (rand(*b1, m), args[1])
    else:
        args = (rand(m), rand(*b2))
    args = tuple(
        np.asarray(a if np.dtype(d).kind != "i" else a * 3).astype(d) for a, d in zip(args, (dt1, dt2), strict=True)
    )
    try:
        want = strict(name)(*args)
    except (TypeError, ValueError, IndexError):
        with pytest.raises(at.InvalidArgumentError, match=name):
            loop.run(getattr(session, name)(*args))
        return
    got = loop.run(loop.run(getattr(session, name)(*args)).numpy())
    single = any(np.dtype(d) in (np.float32, np.complex64) for d in (dt1, dt2))
    assert_same(got, want, name, exact=False, **tol(np.float32 if single else np.float64))
