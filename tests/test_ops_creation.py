"""Creation ops against numpy: constants (copied), filled arrays, ranges, eye, seeded random values."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import numpy as np
import pytest

import aiotensor as at
from aiotensor.testing import OPS

from ._opcheck import assert_invalid, assert_same
from ._stdcheck import ParityCase, check_std, strict

CONSTANTS: list[tuple[Any, Any]] = [
    (1, None),
    (1.5, None),
    (True, None),
    (1 + 2j, None),
    ([1, 2, 3], None),
    ([[1.0, 2], [3, 4]], None),
    ([], None),
    ([[]], None),
    ([True, 0], None),
    ([1, 2], "float32"),
    ([1.7, -2.2], np.int32),
    ([0, 1, 2], np.bool_),
    (np.float32(2.5), None),
    (np.arange(6, dtype=np.int32).reshape(2, 3), None),
    (np.linspace(0, 1, 5, dtype=np.float32), np.float64),
    (np.zeros((0, 4), dtype=np.uint8), None),
    (np.array(7, dtype=np.int16), None),
]


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


async def _both(s: at.AsyncEagerSession, name: str, *args: Any, **kwargs: Any) -> list[tuple[str, at.Tensor]]:
    # The session method, and the module function through the default session.
    method = await getattr(s, name)(*args, **kwargs)
    with s.as_default():
        module = await getattr(at, name)(*args, **kwargs)
    return [("session method", method), ("module function", module)]


async def _check(s: at.AsyncEagerSession, name: str, expected: Any, *args: Any, **kwargs: Any) -> None:
    for how, t in await _both(s, name, *args, **kwargs):
        assert t.session is s
        assert_same(await t.numpy(), expected, f"{name}{args}{kwargs} via {how}", exact=False, rtol=1e-12)


@pytest.mark.parametrize("name", ["constant", "asarray"])
async def test_constant_matches_np_array(s: at.AsyncEagerSession, name: str) -> None:
    for value, dtype in CONSTANTS:
        await _check(s, name, np.array(value, dtype=dtype), value, dtype)
    t = await s.constant([1.0], name="weights")
    assert t.name == "weights"


@pytest.mark.parametrize("name", ["constant", "asarray"])
async def test_constant_copies_its_input(s: at.AsyncEagerSession, name: str) -> None:
    source = np.array([1.0, 2.0, 3.0])
    nested = [[1, 2], [3, 4]]
    t = await getattr(s, name)(source)
    u = await getattr(s, name)(nested)
    from_tensor = await getattr(s, name)(t)  # a tensor is data too: copied into a new buffer
    source[0] = 100.0
    nested[0][0] = 100
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(await u.numpy(), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(await from_tensor.numpy(), [1.0, 2.0, 3.0])
    assert from_tensor.name != t.name
    # the caller's array stays writable: the tensor did not take it over
    assert source.flags.writeable


async def test_filled_creation_ops(s: at.AsyncEagerSession) -> None:
    for shape in [3, (2, 3), (), (0,), [2, 0, 1], np.int64(2)]:
        await _check(s, "zeros", np.zeros(shape), shape)
        await _check(s, "ones", np.ones(shape), shape)
        for dtype in ["float32", np.int32, np.bool_, np.complex64]:
            await _check(s, "zeros", np.zeros(shape, dtype), shape, dtype)
            await _check(s, "ones", np.ones(shape, dtype), shape, dtype)
    for fill in [7, 2.5, True, 1 - 1j, np.float32(0.25), np.int8(-3)]:
        await _check(s, "full", np.full((2, 2), fill), (2, 2), fill)
    await _check(s, "full", np.full(3, 2.7, np.int32), 3, 2.7, np.int32)
    for like in [np.arange(6, dtype=np.int32).reshape(2, 3), np.array(1.5, np.float32), np.zeros(0, bool)]:
        for dtype in [None, np.float64, "int8"]:
            await _check(s, "zeros_like", np.zeros_like(like, dtype=dtype), like, dtype)
            await _check(s, "ones_like", np.ones_like(like, dtype=dtype), like, dtype)
    t = await s.constant(np.arange(4, dtype=np.float32))
    for how, z in await _both(s, "zeros_like", t):
        assert_same(await z.numpy(), np.zeros(4, np.float32), f"zeros_like(tensor) via {how}", exact=True, rtol=0)
    await _check(s, "ones_like", np.ones_like([[1, 2]]), [[1, 2]])


async def test_ranges_and_eye(s: at.AsyncEagerSession) -> None:
    for args in [(5,), (0,), (2, 7), (7, 2), (1, 10, 3), (0, 1, 0.25), (5.0,), (-3, 3, 2), (10, 0, -3)]:
        await _check(s, "arange", np.arange(*args), *args)
    await _check(s, "arange", np.arange(4, dtype=np.float32), 4, dtype=np.float32)
    await _check(s, "arange", np.arange(2, 8, 2, dtype=np.int16), 2, 8, 2, np.int16)
    for start, stop, num, endpoint in [(0, 1, 5, True), (0, 1, 4, False), (-2.5, 2.5, 1, True), (0, 1, 0, True)]:
        await _check(s, "linspace", np.linspace(start, stop, num, endpoint=endpoint), start, stop, num, endpoint)
    await _check(s, "linspace", np.linspace(0, 10, 6, dtype=np.int32), 0, 10, 6, dtype=np.int32)
    await _check(s, "linspace", np.linspace(0, 1), 0, 1)  # numpy's default num=50
    for eye_args in [(3,), (2, 4), (4, 2, 1), (3, 3, -1), (0,), (3, None, 5)]:
        await _check(s, "eye", np.eye(*eye_args), *eye_args)  # type: ignore[arg-type]
    await _check(s, "eye", np.eye(2, dtype=np.int32), 2, dtype=np.int32)


@pytest.mark.parametrize("name", ["random_uniform", "random_normal"])
async def test_random_is_reproducible_with_a_seed(s: at.AsyncEagerSession, name: str) -> None:
    op: Callable[..., Awaitable[at.Tensor]] = getattr(s, name)
    a = await (await op((3, 4), seed=42)).numpy()
    b = await (await op((3, 4), seed=42)).numpy()
    c = await (await op((3, 4), seed=43)).numpy()
    with s.as_default():
        d = await (await getattr(at, name)((3, 4), seed=42)).numpy()
    assert a.dtype == np.float64
    assert a.shape == (3, 4)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, d)
    assert not np.array_equal(a, c)
    unseeded = [await (await op(8)).numpy() for _ in range(2)]
    first, second = unseeded
    assert not np.array_equal(first, second)
    for dtype in (np.float32, "float16", np.float64):
        t = await op(5, dtype=dtype, seed=1)
        assert t.dtype == np.dtype(dtype)
        assert (await t.numpy()).dtype == np.dtype(dtype)
    empty = await op((0, 3), seed=1)
    assert empty.shape == (0, 3)


async def test_random_uniform_bounds_and_moments(s: at.AsyncEagerSession) -> None:
    n = 20_000
    for low, high, dtype in [(0.0, 1.0, np.float64), (-2.0, 3.0, np.float32), (5, 6, None)]:
        x = await (await s.random_uniform(n, low, high, dtype=dtype, seed=7)).numpy()
        assert x.min() >= low
        assert x.max() < high
        width = high - low
        # mean of n uniforms: standard error width / sqrt(12 n); allow 6 of them
        assert abs(x.mean() - (low + high) / 2) < 6 * width / np.sqrt(12 * n)
        assert abs(x.std() - width / np.sqrt(12)) < 0.02 * width


async def test_random_normal_moments(s: at.AsyncEagerSession) -> None:
    n = 20_000
    for mean, stddev, dtype in [(0.0, 1.0, np.float64), (10.0, 0.5, np.float32), (-3, 2, None)]:
        x = await (await s.random_normal(n, mean, stddev, dtype=dtype, seed=11)).numpy()
        assert abs(x.mean() - mean) < 6 * stddev / np.sqrt(n)
        assert abs(x.std() - stddev) < 0.05 * stddev
        assert x.min() < mean - 2 * stddev < mean + 2 * stddev < x.max()  # it has tails


CREATION_ERRORS: list[tuple[str, Callable[[at.AsyncEagerSession], Awaitable[Any]], str, tuple[str, ...]]] = [
    ("ragged", lambda s: s.constant([[1, 2], [3]]), "constant", ("inhomogeneous",)),
    ("None", lambda s: s.constant(None), "constant", ("object",)),
    ("str", lambda s: s.constant("abc"), "constant", ("<U3",)),
    ("list-of-str", lambda s: s.constant(["a", "b"]), "constant", ("not numeric",)),
    ("object-array", lambda s: s.constant(np.array([1, None], dtype=object)), "constant", ("object",)),
    ("bytes", lambda s: s.asarray(b"xy"), "constant", ("not numeric",)),
    ("value-vs-dtype", lambda s: s.constant("x", dtype=float), "constant", ("could not convert",)),
    ("dtype-str", lambda s: s.constant([1], dtype="U3"), "constant", ("<U3",)),
    ("dtype-object", lambda s: s.zeros(3, dtype=object), "zeros", ("object",)),
    ("dtype-bogus", lambda s: s.ones(3, dtype="not-a-dtype"), "ones", ("not-a-dtype",)),
    ("shape-negative", lambda s: s.zeros((2, -1)), "zeros", ("(2, -1)",)),
    ("shape-None", lambda s: s.ones(None), "ones", ("None",)),  # type: ignore[arg-type]
    ("shape-float", lambda s: s.zeros((2.5,)), "zeros", ("2.5",)),  # type: ignore[arg-type]
    ("full-str", lambda s: s.full(3, "a"), "full", ("str",)),  # type: ignore[arg-type]
    ("full-None", lambda s: s.full(3, None), "full", ("NoneType",)),  # type: ignore[arg-type]
    ("like-None", lambda s: s.zeros_like(None), "zeros_like", ("None",)),
    ("like-str", lambda s: s.ones_like("ab"), "ones_like", ("'ab'",)),
    ("arange-step0", lambda s: s.arange(0, 5, 0), "arange", ()),
    ("arange-str", lambda s: s.arange("5"), "arange", ()),  # type: ignore[arg-type]
    ("linspace-negative", lambda s: s.linspace(0, 1, -2), "linspace", ("-2",)),
    ("linspace-float-num", lambda s: s.linspace(0, 1, 2.5), "linspace", ("2.5",)),  # type: ignore[arg-type]
    ("eye-negative", lambda s: s.eye(-1), "eye", ("-1",)),
    ("uniform-int-dtype", lambda s: s.random_uniform(3, dtype=np.int32), "random_uniform", ("int32",)),
    ("normal-bad-shape", lambda s: s.random_normal((-3,)), "random_normal", ("-3",)),
    ("normal-str-dtype", lambda s: s.random_normal(3, dtype=str), "random_normal", ()),
]


@pytest.mark.parametrize(("label", "call", "op", "fragments"), CREATION_ERRORS, ids=[c[0] for c in CREATION_ERRORS])
async def test_creation_errors(
    sc: at.AsyncEagerSession,
    label: str,
    call: Callable[[at.AsyncEagerSession], Awaitable[Any]],
    op: str,
    fragments: tuple[str, ...],
) -> None:
    await assert_invalid(sc, lambda: call(sc), op, *fragments)
    t = await sc.zeros(2)  # the session is still usable
    np.testing.assert_array_equal(await t.numpy(), [0.0, 0.0])


async def test_module_creation_needs_a_session() -> None:
    with pytest.raises(at.NoSessionError, match="no session"):
        await at.zeros(3)
    with pytest.raises(at.NoSessionError):
        await at.constant([1, 2])


async def test_arange_size_is_checked_before_allocating(s: at.AsyncEagerSession) -> None:
    with pytest.raises(at.ResourceExhaustedError, match="arange: requested"):
        await s.arange(0, 1e15, 0.5)
    assert s.stats().allocated == 0
    limited = at.AsyncEagerSession(config=at.SessionConfig(memory_limit=800))
    async with limited:
        await limited.arange(100)  # exactly 800 bytes of int64
        with pytest.raises(at.ResourceExhaustedError, match="memory_limit=800"):
            await limited.arange(101)


async def test_names_must_be_strings(s: at.AsyncEagerSession) -> None:
    with pytest.raises(at.InvalidArgumentError, match="name must be a str"):
        await s.zeros(2, name=5)  # type: ignore[arg-type]
    assert (await s.zeros(2, name="z")).name == "z"


# -- the standard's creation functions and keywords ------------------------------------

DEVICES = [None, "/cpu:0", "cpu", "CPU:0"]


async def test_device_keyword_of_every_creation_op(s: at.AsyncEagerSession) -> None:
    # Every creation function of the standard takes device=; a device name of the session's runs there.
    x = np.arange(6.0).reshape(2, 3)
    for device in DEVICES:
        calls: list[tuple[str, tuple[Any, ...], dict[str, Any], Any]] = [
            ("zeros", ((2, 3),), {}, np.zeros((2, 3))),
            ("ones", (3,), {"dtype": np.int8}, np.ones(3, np.int8)),
            ("empty", ((2,),), {}, np.zeros(2)),
            ("full", ((2,), 1.5), {}, np.full(2, 1.5)),
            ("arange", (1, 7, 2), {}, np.arange(1, 7, 2)),
            ("linspace", (0.0, 1.0, 5), {"endpoint": False}, np.linspace(0.0, 1.0, 5, endpoint=False)),
            ("eye", (3, 4), {"k": 1}, np.eye(3, 4, k=1)),
            ("constant", ([1, 2],), {}, np.array([1, 2])),
            ("asarray", ([1.5],), {"dtype": np.float32, "copy": True}, np.array([1.5], np.float32)),
            ("zeros_like", (x,), {}, np.zeros_like(x)),
            ("ones_like", (x,), {"dtype": np.int32}, np.ones_like(x, np.int32)),
            ("empty_like", (x,), {}, np.zeros_like(x)),
            ("full_like", (x, 7), {}, np.full_like(x, 7)),
        ]
        for name, args, kwargs, want in calls:
            targs = tuple([await s.constant(a) if isinstance(a, np.ndarray) else a for a in args])
            for how, t in await _both(s, name, *targs, device=device, **kwargs):
                assert t.device == "/cpu:0"
                assert_same(await t.numpy(), want, f"{name}(device={device!r}) via {how}", exact=True, rtol=0)


def _full_like(x: Any, fill_value: Any, dtype: Any = None) -> Any:
    return np.full_like(x, fill_value, dtype=dtype)


async def test_empty_and_full_like(s: at.AsyncEagerSession) -> None:
    for dt in (np.float32, np.int64, np.bool_, np.complex64):
        x = np.arange(6).reshape(2, 3).astype(dt)
        for fill in (0, 1, True, 2.5):
            await check_std(s, "full_like", _full_like, x, fill, exact=True)
            await check_std(s, "full_like", _full_like, x, fill, exact=True, dtype=np.float64)
        await check_std(s, "empty_like", lambda a, dtype=None: np.zeros_like(a, dtype=dtype), x, exact=True)
        await check_std(s, "empty_like", lambda a, dtype=None: np.zeros_like(a, dtype=dtype), x, dtype=np.int8)
    await check_std(s, "full_like", strict("full_like"), np.zeros((0, 2), np.float32), 3.0, exact=True)
    await check_std(s, "full_like", _full_like, np.array(1), 5, exact=True)
    empty = await s.empty((3, 0), dtype=np.int16)
    assert empty.shape == (3, 0)
    assert empty.dtype == np.int16


def _triangle(fn: Any) -> Any:
    def ref(x: Any, k: int = 0) -> Any:
        if np.ndim(x) < 2:
            raise ValueError("needs 2 dimensions")
        return fn(x, k=k)

    return ref


@pytest.mark.parametrize("name", ["tril", "triu"])
async def test_tril_triu(s: at.AsyncEagerSession, name: str) -> None:
    ref = _triangle(getattr(np, name))
    for dt in (np.float64, np.int32, np.bool_, np.complex128):
        for shape in [(3, 3), (2, 4), (4, 2), (2, 3, 3), (0, 3)]:
            for k in (0, 1, -1, 5, -5):
                x = (np.arange(int(np.prod(shape))).reshape(shape) % 3).astype(dt)
                await check_std(s, name, ref, x, exact=True, k=k)
    await check_std(s, name, strict(name), np.arange(12.0).reshape(3, 4), exact=True, k=-1)
    await check_std(s, name, ref, np.arange(3.0))  # a vector: the standard needs a matrix


async def test_from_dlpack(s: at.AsyncEagerSession) -> None:
    for x in (np.arange(6.0).reshape(2, 3), np.array([True, False]), np.zeros((0, 4), np.int8), np.array(2.5)):
        for how, t in await _both(s, "from_dlpack", x):
            assert_same(await t.numpy(), x, f"from_dlpack via {how}", exact=True, rtol=0)
    source = np.arange(3.0)
    t = await s.from_dlpack(source, copy=True)
    source[0] = 99.0  # the tensor holds a copy
    assert (await t.numpy()).tolist() == [0.0, 1.0, 2.0]
    again = await s.from_dlpack(t)  # a tensor's buffer is read through DLPack too
    assert (await again.numpy()).tolist() == [0.0, 1.0, 2.0]
    strided = np.arange(12.0).reshape(3, 4)[:, ::2]
    assert (await (await s.from_dlpack(strided)).numpy()).tolist() == strided.tolist()


def _meshgrid(*arrays: Any, indexing: Literal["xy", "ij"] = "xy") -> Any:
    return list(np.meshgrid(*arrays, indexing=indexing))


async def test_meshgrid(s: at.AsyncEagerSession) -> None:
    a, b, c = np.arange(3.0), np.arange(2, dtype=np.int32), np.array([1.5, 2.5, 3.5, 4.5], np.float32)
    for arrays in [(a, b), (a, b, c), (a,), (np.zeros(0), b)]:
        for indexing in ("xy", "ij"):
            await check_std(s, "meshgrid", _meshgrid, *arrays, exact=True, indexing=indexing, container=list)
    await check_std(s, "meshgrid", strict("meshgrid"), a, a[:2], exact=True, indexing="ij")


async def test_standard_creation_errors(sc: at.AsyncEagerSession) -> None:
    x = await sc.constant(np.ones((2, 2)))
    await assert_invalid(sc, lambda: sc.zeros(2, device="gpu 0"), "zeros", "device")
    await assert_invalid(sc, lambda: sc.arange(3, device=0), "arange", "device")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.asarray([1, 2], copy=False), "constant", "copy=False")
    await assert_invalid(sc, lambda: sc.constant([1], copy="yes"), "constant", "copy")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.from_dlpack([1, 2]), "from_dlpack", "DLPack")
    await assert_invalid(sc, lambda: sc.from_dlpack(np.ones(2), copy=False), "from_dlpack", "copy=False")
    await assert_invalid(sc, lambda: sc.full_like(x, "a"), "full_like", "str")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.empty_like(x, dtype=object), "empty_like", "object")
    await assert_invalid(sc, lambda: sc.empty((-1,)), "empty", "-1")
    await assert_invalid(sc, lambda: sc.tril(x, k=1.5), "tril", "k")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.meshgrid(x, indexing="ji"), "meshgrid", "indexing")


PARITY_CASES: list[ParityCase] = [
    ("empty", ((2, 3),), {}, np.zeros),
    ("empty_like", (np.ones((2, 3), np.float32),), {}, np.zeros_like),
    ("full_like", (np.ones((2, 3), np.int32), 4), {}, _full_like),
    ("tril", (np.arange(9.0).reshape(3, 3),), {"k": -1}, _triangle(np.tril)),
    ("triu", (np.arange(9.0).reshape(3, 3),), {}, _triangle(np.triu)),
    ("from_dlpack", (np.arange(4.0),), {}, np.array),
    ("meshgrid", (np.arange(3.0), np.arange(2.0)), {"indexing": "ij"}, _meshgrid),
]


@pytest.mark.parametrize("row", PARITY_CASES, ids=[row[0] for row in PARITY_CASES])
async def test_parity_rows_hold(s: at.AsyncEagerSession, row: ParityCase) -> None:
    # The rows the parity matrix takes: each holds on every surface here.
    name, args, kwargs, reference = row
    await check_std(s, name, reference, *args, exact=False, **kwargs)


async def test_linspace_with_complex_bounds_reserves_their_size(s: at.AsyncEagerSession) -> None:
    t = await s.linspace(0j, 1 + 1j, 5)
    np.testing.assert_array_equal(await t.numpy(), np.linspace(0j, 1 + 1j, 5))
    # The bytes reserved before the kernel runs: complex128's, unless a dtype says otherwise.
    assert OPS["linspace"].prepare(0j, 1j, 5)[2] == 5 * 16
    assert OPS["linspace"].prepare(0.0, 1.0, 5)[2] == 5 * 8
    assert OPS["linspace"].prepare(0.0, 1j, 5, dtype=np.complex64)[2] == 5 * 8
