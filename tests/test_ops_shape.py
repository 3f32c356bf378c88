"""Linear algebra and shape ops against numpy: products, reshaping, joining, splitting, casts, indexing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._opcheck import assert_invalid, assert_same, check_op
from ._stdcheck import ParityCase, check_std, strict

_rng = np.random.default_rng(99)


def arr(*shape: int, dtype: Any = np.float64) -> np.ndarray:
    """Small integer values (exact in every dtype) of the given shape."""
    return np.asarray(_rng.integers(-4, 5, size=shape)).astype(dtype)


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


async def test_matmul(s: at.AsyncEagerSession) -> None:
    pairs = [
        (arr(3), arr(3)),  # vector . vector -> 0-d
        (arr(2, 3), arr(3, 4)),
        (arr(5, 2, 3), arr(3, 4)),  # batched, broadcast
        (arr(3), arr(3, 4)),
        (arr(2, 3), arr(3)),
        (arr(2, 3, dtype=np.int32), arr(3, 2, dtype=np.int32)),
        (arr(2, 3, dtype=np.float32), arr(3, 2)),  # float32 @ float64 -> float64
        (arr(2, 3, dtype=np.int64), arr(3, 2, dtype=np.float32)),
        (arr(2, 2, dtype=np.bool_), arr(2, 2, dtype=np.bool_)),
        (arr(0, 3), arr(3, 2)),
        (arr(2, 0), arr(0, 3)),  # empty contraction: zeros
    ]
    for a, b in pairs:
        await check_op(s, "matmul", np.matmul, a, b, rtol=1e-6)


async def test_tensordot_and_einsum(s: at.AsyncEagerSession) -> None:
    a, b = arr(2, 3, 4), arr(3, 4, 5)
    await check_op(s, "tensordot", np.tensordot, a, b)  # axes=2
    await check_op(s, "tensordot", np.tensordot, arr(2, 3), arr(3, 4), axes=1)
    await check_op(s, "tensordot", np.tensordot, a, b, axes=([1, 2], [0, 1]))
    await check_op(s, "tensordot", np.tensordot, arr(2), arr(3), axes=0)  # outer
    m, n = arr(3, 3), arr(3, 4)
    for subscripts, operands in [
        ("ij,jk->ik", (m, n)),
        ("ii->i", (m,)),
        ("i,i->", (m[0], m[1])),
        ("bij,bjk->bik", (arr(2, 3, 4), arr(2, 4, 2))),
        ("ij->ji", (n,)),
        ("ij,jk,kl->il", (m, n, arr(4, 2))),
        ("i,j->ij", (arr(3, dtype=np.int32), arr(2, dtype=np.float32))),
    ]:
        await check_op(s, "einsum", np.einsum, subscripts, *operands, rtol=1e-12)


async def test_reshape_permute_expand_squeeze(s: at.AsyncEagerSession) -> None:
    x = arr(2, 3, 4, dtype=np.float32)
    for shape in [(24,), (-1,), (4, -1), (2, 3, 4), (1, 24, 1), [6, 4], 24]:
        await check_op(s, "reshape", np.reshape, x, shape, exact=True)
    await check_op(s, "reshape", np.reshape, np.array(5), (1, 1), exact=True)
    await check_op(s, "reshape", np.reshape, arr(0, 3), (3, 0), exact=True)
    for axes in [(2, 0, 1), (0, 1, 2), [1, 0, 2], (-1, 0, 1)]:
        await check_op(s, "permute_dims", np.transpose, x, axes, exact=True)
    await check_op(s, "permute_dims", np.transpose, arr(4, dtype=np.int32), (0,), exact=True)
    for axis in [0, -1, 1, (0, 2), [0, -1]]:
        await check_op(s, "expand_dims", np.expand_dims, x, axis, exact=True)
    await check_op(s, "expand_dims", np.expand_dims, np.array(3.0), 0)
    y = arr(1, 3, 1, 2)
    for axis in [None, 0, 2, (0, 2), -2]:
        await check_op(s, "squeeze", np.squeeze, y, axis, exact=True)
    t = await s.constant(y)
    assert (await s.expand_dims(t)).shape == (1, 1, 3, 1, 2)  # default axis 0


async def test_concat_stack_broadcast(s: at.AsyncEagerSession) -> None:
    a, b = arr(2, 3), arr(1, 3)
    await check_op(s, "concat", np.concatenate, [a, b], exact=True)
    await check_op(s, "concat", np.concatenate, [a, arr(2, 2)], axis=1, exact=True)
    await check_op(s, "concat", np.concatenate, [a, arr(2, 1)], axis=-1, exact=True)
    await check_op(s, "concat", np.concatenate, [arr(2, dtype=np.int32), arr(3, dtype=np.float32)], exact=True)
    await check_op(s, "concat", np.concatenate, [arr(0, 3), b, arr(0, 3)], exact=True)
    await check_op(s, "concat", np.concatenate, [a, [[1, 2, 3]]], exact=True)  # a nested list joins a tensor
    await check_op(s, "concat", np.concatenate, [a], exact=True)
    for axis in [0, 1, -1]:
        await check_op(s, "stack", np.stack, [a, a + 1, a * 2], axis=axis, exact=True)
    await check_op(s, "stack", np.stack, [np.array(1, np.int8), np.array(2.5, np.float32)], exact=True)
    ta, tb = await s.constant(a), await s.constant(b)
    joined = await s.concat((ta, tb))  # a tuple is a sequence too
    np.testing.assert_array_equal(await joined.numpy(), np.concatenate([a, b]))
    for x, shape in [(arr(3), (2, 3)), (np.array(1.5), (4,)), (arr(2, 1, dtype=np.int32), (2, 3)), (arr(3), (0, 3))]:
        await check_op(s, "broadcast_to", np.broadcast_to, x, shape, exact=True)
    wide = await s.broadcast_to(await s.constant([1.0, 2.0]), (3, 2))
    assert wide.nbytes == 3 * 2 * 8  # materialized: the tensor owns all its elements


async def test_split_returns_a_list(s: at.AsyncEagerSession) -> None:
    x = arr(6, 4, dtype=np.int32)
    t = await s.constant(x)
    # (np.int64 is an integer to numpy and to the op, not an `int` to the checker)
    cases: list[tuple[Any, int]] = [(3, 0), ([1, 4], 0), (2, 1), ([0, 0, 3], 1), (1, 0), ((2,), -1), (np.int64(2), 0)]
    for sections, axis in cases:
        expected = np.split(x, sections, axis=axis)
        for how, result in [
            ("session method", await s.split(t, sections, axis=axis)),
            ("module function", await at.split(t, sections, axis=axis)),
        ]:
            where = f"split(int32[6, 4], {sections!r}, axis={axis}) via {how}"
            assert isinstance(result, list), f"{where}: {type(result).__name__}"
            assert len(result) == len(expected), where
            for i, (part, want) in enumerate(zip(result, expected, strict=True)):
                assert isinstance(part, at.Tensor)
                assert_same(await part.numpy(), want, f"{where}[{i}]", exact=True, rtol=0)
    named = await s.split(t, 2, name="half")
    assert [p.name for p in named] == ["half:0", "half:1"]


async def test_astype_and_take(s: at.AsyncEagerSession) -> None:
    f = np.array([[1.7, -2.2, 0.0], [3.5, 300.0, -0.4]])
    for x in (f, f.astype(np.float32), np.array([0, 1, 2], np.int64), np.array([True, False])):
        for dtype in (np.int32, np.float32, np.bool_, "float64", np.uint8, np.complex128):
            with np.errstate(invalid="ignore"):  # 300.0 -> uint8 and friends: numpy's unsafe casting
                await check_op(s, "astype", lambda a, dt: a.astype(dt), x, dtype, exact=True)
    x = arr(3, 4)
    for indices, axis in [([0, 2], None), ([0, 2], 0), ([3, -1, 0], 1), (np.array([[0, 1], [1, 0]]), 0), (2, 1)]:
        await check_op(s, "take", np.take, x, indices, axis=axis, exact=True)
    await check_op(s, "take", np.take, x, np.array([], dtype=np.int64), axis=0, exact=True)


async def test_indexing(s: at.AsyncEagerSession) -> None:
    x = np.arange(24.0).reshape(2, 3, 4)
    t = await s.constant(x)
    keys: list[Any] = [
        1,
        -1,
        slice(1, 3),
        (0, slice(None), 2),
        (Ellipsis, 1),
        (None, 0),
        (slice(None, None, -1),),
        (1, slice(0, 3, 2), slice(None, None, 2)),
        [0, 1, 1],
        ([0, 1], [2, 0]),
        np.array([True, False]),
        x > 10,
        (0, 0, 0),
        (slice(5, 9),),  # empty result
    ]
    for key in keys:
        want = x[key]
        ways: list[tuple[str, Awaitable[at.Tensor]]] = [
            ("t[key]", t[key]),
            ("s.getitem", s.getitem(t, key)),
            ("at.getitem", at.getitem(t, key)),
        ]
        for how, expr in ways:
            got = await (await expr).numpy()
            assert_same(got, want, f"{how} with key {key!r:.40}", exact=True, rtol=0)
    # tensors as indices: a bool mask, an int index array, inside a tuple
    mask = await s.greater(t, 10.0)
    assert_same(await (await t[mask]).numpy(), x[x > 10], "t[bool tensor]", exact=True, rtol=0)
    idx = await s.constant([2, 0])
    assert_same(await (await t[0, idx]).numpy(), x[0, [2, 0]], "t[0, int tensor]", exact=True, rtol=0)
    # the result owns its memory and is independent of the source
    part = await t[0]
    assert part.nbytes == 3 * 4 * 8


SHAPE_ERRORS: list[tuple[str, Callable[[at.AsyncEagerSession, at.Tensor], Awaitable[Any]], str, tuple[str, ...]]] = [
    ("matmul-mismatch", lambda s, t: s.matmul(t, t), "matmul", ("float64[2, 3], float64[2, 3]",)),
    ("matmul-0d", lambda s, t: s.matmul(t, 2.0), "matmul", ("float64[2, 3]",)),
    ("operator-matmul", lambda s, t: t @ np.ones(4), "matmul", ("float64[2, 3]", "float64[4]")),
    ("tensordot-mismatch", lambda s, t: s.tensordot(t, t, axes=1), "tensordot", ("float64[2, 3]",)),
    ("einsum-bad", lambda s, t: s.einsum("ijk->i", t), "einsum", ("float64[2, 3]",)),
    ("einsum-not-str", lambda s, t: s.einsum(3, t), "einsum", ("int",)),  # type: ignore[arg-type]
    ("reshape-impossible", lambda s, t: s.reshape(t, (4, 2)), "reshape", ("float64[2, 3]", "(4, 2)")),
    ("reshape-two-unknowns", lambda s, t: s.reshape(t, (-1, -1)), "reshape", ("float64[2, 3]",)),
    ("reshape-str", lambda s, t: s.reshape(t, "ab"), "reshape", ("'ab'",)),  # type: ignore[arg-type]
    ("permute-wrong-axes", lambda s, t: s.permute_dims(t, (0, 0)), "permute_dims", ("float64[2, 3]",)),
    ("permute-out-of-range", lambda s, t: s.permute_dims(t, (0, 2)), "permute_dims", ("out of bounds",)),
    ("permute-str", lambda s, t: s.permute_dims(t, "ab"), "permute_dims", ("'ab'",)),  # type: ignore[arg-type]
    ("expand-axis", lambda s, t: s.expand_dims(t, 5), "expand_dims", ("float64[2, 3]",)),
    ("expand-float-axis", lambda s, t: s.expand_dims(t, 1.5), "expand_dims", ("1.5",)),  # type: ignore[arg-type]
    ("squeeze-non-1", lambda s, t: s.squeeze(t, 0), "squeeze", ("float64[2, 3]",)),
    ("concat-shapes", lambda s, t: s.concat([t, np.ones(3)]), "concat", ("float64[2, 3]", "float64[3]")),
    ("concat-axis", lambda s, t: s.concat([t, t], axis=2), "concat", ("out of bounds",)),
    ("concat-not-a-list", lambda s, t: s.concat(t), "concat", ("Tensor",)),  # type: ignore[arg-type]
    ("concat-empty", lambda s, t: s.concat([]), "concat", ("at least one",)),
    ("concat-None", lambda s, t: s.concat([t, None]), "concat", ("None",)),
    ("stack-shapes", lambda s, t: s.stack([t, np.ones((3, 2))]), "stack", ("same shape",)),
    ("stack-str", lambda s, t: s.stack([t, "ab"]), "stack", ("'ab'",)),
    ("split-uneven", lambda s, t: s.split(t, 4, axis=1), "split", ("float64[2, 3]",)),
    ("split-float", lambda s, t: s.split(t, 2.5), "split", ("2.5",)),  # type: ignore[arg-type]
    ("split-axis", lambda s, t: s.split(t, 2, axis=3), "split", ("float64[2, 3]",)),
    ("broadcast-impossible", lambda s, t: s.broadcast_to(t, (3, 3)), "broadcast_to", ("float64[2, 3]",)),
    ("broadcast-negative", lambda s, t: s.broadcast_to(t, (-2, 3)), "broadcast_to", ()),
    ("astype-str", lambda s, t: s.astype(t, str), "astype", ("not numeric",)),
    ("astype-object", lambda s, t: s.astype(t, object), "astype", ("object",)),
    ("astype-None", lambda s, t: s.astype(t, None), "astype", ("None",)),  # type: ignore[arg-type]
    ("take-oob", lambda s, t: s.take(t, [7]), "take", ("float64[2, 3]", "out of bounds")),
    ("take-float-index", lambda s, t: s.take(t, [0.5]), "take", ("float64[2, 3]",)),
    ("take-axis", lambda s, t: s.take(t, [0], axis=4), "take", ("float64[2, 3]",)),
    ("getitem-oob", lambda s, t: t[5], "getitem", ("float64[2, 3]", "out of bounds")),
    ("getitem-too-many", lambda s, t: t[0, 0, 0], "getitem", ("float64[2, 3]",)),
    ("getitem-str", lambda s, t: t["a"], "getitem", ("float64[2, 3]",)),
    ("getitem-float", lambda s, t: t[1.5], "getitem", ("float64[2, 3]",)),
    ("getitem-mask-shape", lambda s, t: t[np.array([True, False, True])], "getitem", ("float64[2, 3]",)),
    ("data-None", lambda s, t: s.reshape(None, (1,)), "reshape", ("None",)),
    ("data-object", lambda s, t: s.permute_dims(np.array([None]), (0,)), "permute_dims", ("object",)),
    ("data-str-matmul", lambda s, t: s.matmul("ab", t), "matmul", ("'ab'",)),
]


@pytest.mark.parametrize(("label", "call", "op", "fragments"), SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
async def test_shape_errors(
    sc: at.AsyncEagerSession,
    label: str,
    call: Callable[[at.AsyncEagerSession, at.Tensor], Awaitable[Any]],
    op: str,
    fragments: tuple[str, ...],
) -> None:
    t = await sc.constant(np.arange(6.0).reshape(2, 3))
    err = await assert_invalid(sc, lambda: call(sc, t), op, *fragments)
    assert isinstance(err, ValueError)
    # the session is still usable, and t is intact
    np.testing.assert_array_equal(await (await sc.reshape(t, (3, 2))).numpy(), np.arange(6.0).reshape(3, 2))


# -- the standard's matrix_transpose, vecdot and keywords -------------------------------


def _matrix_transpose(x: Any) -> Any:
    if np.ndim(x) < 2:
        raise ValueError("needs 2 dimensions")
    return np.swapaxes(x, -1, -2)


def _vecdot(x1: Any, x2: Any, axis: int = -1) -> Any:
    return np.vecdot(x1, x2, axis=axis)  # type: ignore[call-overload]


async def test_matrix_transpose(s: at.AsyncEagerSession) -> None:
    for x in (arr(2, 3), arr(4, 2, 3, dtype=np.int32), arr(0, 3), arr(1, 2, 0, dtype=np.bool_)):
        await check_std(s, "matrix_transpose", _matrix_transpose, x, exact=True)
    await check_std(s, "matrix_transpose", strict("matrix_transpose"), arr(2, 3, 4, dtype=np.float32), exact=True)
    await check_std(s, "matrix_transpose", _matrix_transpose, arr(3))  # a vector has no matrix


async def test_vecdot(s: at.AsyncEagerSession) -> None:
    pairs = [
        (arr(3), arr(3)),
        (arr(2, 3), arr(3)),  # broadcast
        (arr(4, 1, 3, dtype=np.float32), arr(2, 3, dtype=np.float32)),
        (arr(2, 3, dtype=np.int32), arr(2, 3, dtype=np.int64)),
        (arr(0, 3), arr(3)),
        (arr(2, 0), arr(2, 0)),  # an empty sum: zeros
    ]
    for a, b in pairs:
        await check_std(s, "vecdot", _vecdot, a, b)
    await check_std(s, "vecdot", _vecdot, arr(3, 2), arr(3, 2), axis=0)
    c1, c2 = arr(2, 3) + 1j * arr(2, 3), arr(2, 3) - 2j * arr(2, 3)
    await check_std(s, "vecdot", strict("vecdot"), c1, c2)  # x1 is conjugated
    await check_std(s, "vecdot", strict("vecdot"), arr(2, 3), arr(2, 3), axis=-2)
    await check_std(s, "vecdot", _vecdot, arr(2, 3), arr(2, 4))  # sizes disagree


async def test_standard_keywords_of_reshape_and_astype(sc: at.AsyncEagerSession) -> None:
    x = arr(2, 3, dtype=np.float32)
    for copy in (None, True, False):  # tensors are immutable: a copy or none cannot be told apart
        await check_std(sc, "reshape", lambda a, shape, copy=None: np.reshape(a, shape), x, (3, 2), copy=copy)
    for copy in (True, False):
        for device in (None, "/cpu:0", "CPU"):
            await check_std(sc, "astype", lambda a, dt, **_: a.astype(dt), x, np.int16, copy=copy, device=device)
    t = await sc.constant(x)
    await assert_invalid(sc, lambda: sc.reshape(t, (6,), copy="no"), "reshape", "copy")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.astype(t, np.int8, copy=1), "astype", "copy")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.astype(t, np.int8, device="gpu 0"), "astype", "device")
    await assert_invalid(sc, lambda: sc.astype(t, np.int8, device=0), "astype", "device")  # type: ignore[arg-type]


PARITY_CASES: list[ParityCase] = [
    ("matrix_transpose", (arr(2, 3, 4),), {}, _matrix_transpose),
    ("vecdot", (arr(2, 3), arr(3)), {}, _vecdot),
]


@pytest.mark.parametrize("row", PARITY_CASES, ids=[row[0] for row in PARITY_CASES])
async def test_parity_rows_hold(s: at.AsyncEagerSession, row: ParityCase) -> None:
    # The rows the parity matrix takes: each holds on every surface here.
    name, args, kwargs, reference = row
    await check_std(s, name, reference, *args, exact=False, **kwargs)
