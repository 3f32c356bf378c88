"""Hostile and mistaken input: each gives a precise AioTensorError, and the session stays usable.

After every bad call the test checks that nothing was left allocated (the registry
holds exactly the tensors the test still references) and that a normal op still
works and matches numpy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._results import one


def _deep(n: int) -> list[Any]:
    x: list[Any] = [1.0]
    for _ in range(n):
        x = [x]
    return x


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("repr exploded")


_BAD_OFFSETS = {"names": ["a"], "formats": ["i4"], "offsets": [-1]}

Bad = Callable[[at.AsyncEagerSession, at.Tensor], Awaitable[Any]]

# Each entry: (id, the bad call, the exact error class, a fragment the message must contain).
# The fragment is what a user needs to act on: the op's name and the offending value or rule.
BAD_CALLS: list[tuple[str, Bad, type[at.AioTensorError], str]] = [
    # non-numeric and object data, strings, None, ragged lists
    ("constant-str", lambda s, t: s.constant("abc"), at.InvalidArgumentError, "not numeric"),
    ("constant-bytes", lambda s, t: s.constant(b"abc"), at.InvalidArgumentError, "not numeric"),
    ("constant-None", lambda s, t: s.constant(None), at.InvalidArgumentError, "not numeric"),
    ("constant-object", lambda s, t: s.constant(object()), at.InvalidArgumentError, "not numeric"),
    ("constant-dict", lambda s, t: s.constant({1: 2}), at.InvalidArgumentError, "not numeric"),
    ("constant-mixed", lambda s, t: s.constant([1, "a"]), at.InvalidArgumentError, "not numeric"),
    ("constant-list-None", lambda s, t: s.constant([1.0, None]), at.InvalidArgumentError, "not numeric"),
    ("constant-ragged", lambda s, t: s.constant([[1, 2], [3]]), at.InvalidArgumentError, "constant"),
    ("constant-ragged-deep", lambda s, t: s.constant([[[1]], [2]]), at.InvalidArgumentError, "constant"),
    # regression: a list nested 5,000 deep raised a raw RecursionError while the error
    # message was built (and, in apply, while its arguments were prepared)
    ("constant-deep", lambda s, t: s.constant(_deep(5000)), at.InvalidArgumentError, "list of 1"),
    ("add-deep", lambda s, t: s.add(t, _deep(5000)), at.InvalidArgumentError, "add(float64[2], [[[["),
    ("apply-deep", lambda s, t: s.apply(lambda x: x, _deep(5000)), at.InvalidArgumentError, "returned list"),
    # regression: an argument whose __repr__ raises replaced the op's error with its own
    ("add-bad-repr", lambda s, t: s.add(t, _BadRepr()), at.InvalidArgumentError, "add(float64[2], _BadRepr)"),
    ("constant-bigint", lambda s, t: s.constant(2**70), at.InvalidArgumentError, "not numeric"),
    ("constant-overflow", lambda s, t: s.constant([300], dtype=np.uint8), at.InvalidArgumentError, "uint8"),
    ("constant-object-array", lambda s, t: s.constant(np.array([1, None])), at.InvalidArgumentError, "not numeric"),
    ("add-str", lambda s, t: s.add(t, "abc"), at.InvalidArgumentError, "add("),
    ("add-None", lambda s, t: s.add(t, None), at.InvalidArgumentError, "add("),
    ("add-ragged", lambda s, t: s.add(t, [[1.0], [2.0, 3.0]]), at.InvalidArgumentError, "add("),
    ("add-broadcast", lambda s, t: s.add(t, [1.0, 2.0, 3.0]), at.InvalidArgumentError, "broadcast"),
    ("full-str", lambda s, t: s.full(3, "x"), at.InvalidArgumentError, "fill_value"),  # type: ignore[arg-type]
    ("where-str", lambda s, t: s.where(t, t, "x"), at.InvalidArgumentError, "where("),
    ("clip-str", lambda s, t: s.clip(t, "a", 1), at.InvalidArgumentError, "clip("),
    # absurd shapes: refused before any allocation
    ("zeros-1e15", lambda s, t: s.zeros(10**15), at.ResourceExhaustedError, "bytes"),
    ("ones-1e15-2d", lambda s, t: s.ones((10**8, 10**7)), at.ResourceExhaustedError, "bytes"),
    ("full-1e15", lambda s, t: s.full((10**5, 10**10), 1.0), at.ResourceExhaustedError, "bytes"),
    ("eye-1e8", lambda s, t: s.eye(10**8), at.ResourceExhaustedError, "bytes"),
    ("uniform-1e15", lambda s, t: s.random_uniform(10**15), at.ResourceExhaustedError, "bytes"),
    ("normal-1e15", lambda s, t: s.random_normal((10**15,)), at.ResourceExhaustedError, "bytes"),
    ("linspace-1e15", lambda s, t: s.linspace(0, 1, 10**15), at.ResourceExhaustedError, "bytes"),
    ("arange-1e15", lambda s, t: s.arange(0, 10**15), at.ResourceExhaustedError, "arange"),
    # negative or non-integer dims
    ("zeros-negative", lambda s, t: s.zeros(-1), at.InvalidArgumentError, "negative"),
    ("zeros-negative-2d", lambda s, t: s.zeros((2, -3)), at.InvalidArgumentError, "negative"),
    ("zeros-float", lambda s, t: s.zeros(2.5), at.InvalidArgumentError, "shape must be"),  # type: ignore[arg-type]
    ("zeros-float-1e15", lambda s, t: s.zeros((1e15,)), at.InvalidArgumentError, "shape must be"),  # type: ignore[arg-type]
    ("zeros-str", lambda s, t: s.zeros("ab"), at.InvalidArgumentError, "shape must be"),  # type: ignore[arg-type]
    ("zeros-None", lambda s, t: s.zeros(None), at.InvalidArgumentError, "shape must be"),  # type: ignore[arg-type]
    ("eye-negative", lambda s, t: s.eye(-1), at.InvalidArgumentError, "n_rows"),
    ("linspace-negative", lambda s, t: s.linspace(0, 1, -3), at.InvalidArgumentError, "num"),
    ("reshape-size", lambda s, t: s.reshape(t, (3,)), at.InvalidArgumentError, "reshape"),
    ("reshape-float", lambda s, t: s.reshape(t, (1.5,)), at.InvalidArgumentError, "reshape"),  # type: ignore[arg-type]
    ("broadcast-huge", lambda s, t: s.broadcast_to(t, (10**8, 10**8)), at.InvalidArgumentError, "broadcast_to"),
    ("split-unequal", lambda s, t: s.split(t, 3), at.InvalidArgumentError, "split"),
    ("arange-zero-step", lambda s, t: s.arange(0, 1, 0), at.InvalidArgumentError, "arange"),
    # bad axes
    # Out of range: the standard's IndexError, and an InvalidArgumentError too (issue 28).
    ("sum-axis", lambda s, t: s.sum(t, axis=3), at.IndexOutOfRangeError, "axis 3"),
    ("sum-float-axis", lambda s, t: s.sum(t, axis=1.5), at.InvalidArgumentError, "sum("),  # type: ignore[arg-type]
    ("softmax-axis", lambda s, t: s.softmax(t, axis=4), at.IndexOutOfRangeError, "axis 4"),
    ("expand-axis", lambda s, t: s.expand_dims(t, 7), at.IndexOutOfRangeError, "axis 7"),
    ("permute-axes", lambda s, t: s.permute_dims(t, (1, 0)), at.InvalidArgumentError, "permute_dims"),
    ("take-index", lambda s, t: s.take(t, [5]), at.IndexOutOfRangeError, "out of bounds"),
    ("getitem-index", lambda s, t: s.getitem(t, 10), at.IndexOutOfRangeError, "out of bounds"),
    ("getitem-str", lambda s, t: s.getitem(t, "a"), at.InvalidArgumentError, "getitem("),
    ("einsum-subscripts", lambda s, t: s.einsum("ij->", t), at.InvalidArgumentError, "einsum"),
    ("einsum-not-str", lambda s, t: s.einsum(3, t), at.InvalidArgumentError, "subscripts"),  # type: ignore[arg-type]
    ("concat-empty", lambda s, t: s.concat([]), at.InvalidArgumentError, "at least one"),
    ("concat-tensor", lambda s, t: s.concat(t), at.InvalidArgumentError, "sequence"),  # type: ignore[arg-type]
    # bad dtypes
    ("dtype-unknown", lambda s, t: s.zeros(3, dtype="foo"), at.InvalidArgumentError, "not a dtype"),
    ("dtype-int", lambda s, t: s.zeros(3, dtype=12345), at.InvalidArgumentError, "not a dtype"),  # type: ignore[arg-type]
    ("dtype-object", lambda s, t: s.zeros(3, dtype=object), at.InvalidArgumentError, "not numeric"),
    ("dtype-str", lambda s, t: s.ones(3, dtype="U3"), at.InvalidArgumentError, "not numeric"),
    ("dtype-struct", lambda s, t: s.zeros(3, dtype=[("a", int)]), at.InvalidArgumentError, "not numeric"),
    # regression: np.dtype("i4,,") raises SyntaxError, which escaped as a raw SyntaxError
    ("dtype-syntax", lambda s, t: s.zeros(3, dtype="i4,,"), at.InvalidArgumentError, "not a dtype"),
    ("dtype-syntax-astype", lambda s, t: s.astype(t, "f8,("), at.InvalidArgumentError, "not a dtype"),
    ("dtype-bad-offsets", lambda s, t: s.zeros(3, dtype=_BAD_OFFSETS), at.InvalidArgumentError, "not a dtype"),  # type: ignore[arg-type]
    ("dtype-datetime", lambda s, t: s.zeros(3, dtype="M8"), at.InvalidArgumentError, "not numeric"),
    ("astype-str", lambda s, t: s.astype(t, "U"), at.InvalidArgumentError, "not numeric"),
    ("astype-None", lambda s, t: s.astype(t, None), at.InvalidArgumentError, "astype"),  # type: ignore[arg-type]
    ("ones_like-str", lambda s, t: s.ones_like(t, dtype="U"), at.InvalidArgumentError, "not numeric"),
    ("uniform-int", lambda s, t: s.random_uniform(3, dtype=np.int32), at.InvalidArgumentError, "float dtype"),
    ("uniform-seed", lambda s, t: s.random_uniform(3, seed=-1), at.InvalidArgumentError, "random_uniform"),
    # apply functions that return the wrong type or raise
    ("apply-not-callable", lambda s, t: s.apply(5), at.InvalidArgumentError, "callable"),  # type: ignore[arg-type]
    ("apply-str", lambda s, t: s.apply(lambda: "str"), at.InvalidArgumentError, "returned str"),
    ("apply-None", lambda s, t: s.apply(lambda: None), at.InvalidArgumentError, "returned NoneType"),
    ("apply-empty", lambda s, t: s.apply(list), at.InvalidArgumentError, "empty"),
    ("apply-str-array", lambda s, t: s.apply(lambda: np.array(["a"])), at.InvalidArgumentError, "dtype <U1"),
    ("apply-object-array", lambda s, t: s.apply(lambda: np.array([None])), at.InvalidArgumentError, "dtype object"),
    ("apply-tuple-bad", lambda s, t: s.apply(lambda: (np.ones(2), "x")), at.InvalidArgumentError, "returned str"),
    # regression: an ndarray subclass became the buffer (numpy() gave a MaskedArray hiding data)
    (
        "apply-masked",
        lambda s, t: s.apply(lambda: np.ma.array([1.0, 2.0], mask=[0, 1])),  # type: ignore[arg-type]
        at.InvalidArgumentError,
        "Mask",
    ),
    ("apply-raises", lambda s, t: s.apply(lambda x: 1 / 0, t), at.KernelError, "ZeroDivisionError"),
    ("apply-raises-value", lambda s, t: s.apply(lambda x: int("x"), t), at.KernelError, "ValueError"),
    ("apply-memory", lambda s, t: s.apply(_raise_memory, t), at.ResourceExhaustedError, "out of memory"),
    ("apply-writes-input", lambda s, t: s.apply(_write_input, t), at.KernelError, "read-only"),
]


def _raise_memory(x: Any) -> Any:
    raise MemoryError("simulated")


def _write_input(x: Any) -> Any:
    x[0] = 1.0  # inputs are read-only: a kernel cannot change another tensor
    return x


@pytest.mark.parametrize(("bad", "error", "fragment"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
async def test_bad_input_gives_precise_error_and_session_stays_usable(
    session: at.AsyncEagerSession, bad: Bad, error: type[at.AioTensorError], fragment: str
) -> None:
    t = await session.constant([1.0, 2.0])
    before = session.stats()
    with pytest.raises(error) as info:
        await bad(session, t)
    assert type(info.value) is error
    assert fragment in str(info.value)
    after = session.stats()
    # nothing left allocated by the failed call (nor reserved: the next op may use the room)
    assert after.live_tensors == before.live_tensors == 1
    assert after.live_bytes == before.live_bytes
    u = await session.add(t, 1.0)
    np.testing.assert_array_equal(await u.numpy(), [2.0, 3.0])
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0])


async def test_the_table_covers_every_kind_of_bad_input() -> None:
    # the figure quoted in docs/reliability.md
    assert len(BAD_CALLS) >= 70


async def test_tensor_of_another_session() -> None:
    async with at.AsyncEagerSession() as a, at.AsyncEagerSession() as b:
        ta = await a.constant([1.0])
        with pytest.raises(at.InvalidArgumentError, match=r"belongs to another session.*parent="):
            await b.add(ta, ta)
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await b.run([ta])
        assert b.stats().live_tensors == 0
        np.testing.assert_array_equal(await (await b.constant([2.0])).numpy(), [2.0])


async def test_tensor_of_a_closed_session() -> None:
    async with at.AsyncEagerSession() as a:
        t = await a.constant([1.0, 2.0])
    with pytest.raises(at.SessionClosedError, match="closed"):
        await t.numpy()
    with pytest.raises(at.SessionClosedError):
        await (t + 1)
    with pytest.raises(at.SessionClosedError, match="freed because its session closed"):
        np.asarray(t)
    assert "freed" in repr(t)
    async with at.AsyncEagerSession() as b:
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await b.add(t, 1.0)
        np.testing.assert_array_equal(await (await b.constant([3.0])).numpy(), [3.0])


async def test_child_reading_a_closed_parent_says_the_parent_closed() -> None:
    parent = at.AsyncEagerSession()
    async with parent:
        w = await parent.constant([1.0])
        child = at.AsyncEagerSession(parent=parent)
        await child.__aenter__()
    with pytest.raises(at.SessionClosedError, match="freed because its session closed"):
        await child.add(w, 1.0)
    await child.close()


async def test_session_used_from_another_thread_and_loop(session: at.AsyncEagerSession) -> None:
    t = await session.constant([1.0, 2.0])
    errors: list[BaseException] = []

    def other_thread() -> None:
        for call in (lambda: session.add(t, t), t.numpy, lambda: session.zeros(2), session.close):
            try:
                asyncio.run(call())
            except BaseException as exc:  # collected for the assertions below
                errors.append(exc)

    await asyncio.to_thread(other_thread)
    assert len(errors) == 4
    for exc in errors:
        assert isinstance(exc, at.WrongEventLoopError)
        assert "bound to the event loop it first ran on" in str(exc)
        assert "one session per event loop" in str(exc)
    # nothing allocated by the refused calls, and the session still works on its loop
    assert session.stats().live_tensors == 1
    np.testing.assert_array_equal(await (await session.add(t, t)).numpy(), [2.0, 4.0])


def test_session_used_from_a_second_loop_in_the_same_thread() -> None:
    s = at.AsyncEagerSession()

    async def first() -> at.Tensor:
        await s.__aenter__()
        return await s.constant([1.0])

    with asyncio.Runner() as r1:
        t = r1.run(first())
        with asyncio.Runner() as r2, pytest.raises(at.WrongEventLoopError, match="bound to the event loop"):
            r2.run(s.add(t, t))
        np.testing.assert_array_equal(r1.run(t.numpy()), [1.0])
        r1.run(s.close())
    assert s.stats().live_tensors == 0


async def test_numpy_returns_a_copy(session: at.AsyncEagerSession) -> None:
    t = await session.constant([1.0, 2.0])
    value = await t.numpy()
    value[0] = 99.0
    (ran,) = await session.run([t])
    ran[1] = 77.0
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0])


async def test_asarray_cannot_be_made_writeable(session: at.AsyncEagerSession) -> None:
    # Regression: __array__ returned the buffer itself, which owns its memory, so
    # `a.flags.writeable = True` succeeded and `a[0] = 99` changed the tensor.
    t = await session.constant([1.0, 2.0])
    a = np.asarray(t)
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 99.0
    with pytest.raises(ValueError, match="WRITEABLE"):
        a.flags.writeable = True
    b = np.array(t)  # a copy, writeable
    b[0] = 5.0
    c = np.asarray(t, dtype=np.float32)  # a converted copy
    c[0] = 6.0
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0])


async def test_apply_result_held_by_the_user_is_not_shared(session: at.AsyncEagerSession) -> None:
    # Regression: apply kept an array the user still held (a global, a cache) as the
    # tensor's buffer, made the user's array read-only, and let the user change the
    # tensor by setting WRITEABLE back.
    held = np.zeros(3)
    other = np.ones(2)
    single = await session.apply(lambda: held)
    pair = await session.apply(lambda: (np.full(2, 7.0), other))
    assert isinstance(single, at.Tensor)
    assert isinstance(pair, tuple)
    assert held.flags.writeable
    assert other.flags.writeable
    held[0] = 42.0
    other[0] = 42.0
    np.testing.assert_array_equal(await single.numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(await pair[1].numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(await pair[0].numpy(), [7.0, 7.0])


async def test_apply_keeps_fresh_results_without_a_copy(session: at.AsyncEagerSession) -> None:
    addresses: list[int] = []

    def fresh() -> Any:
        a = np.arange(4.0)
        addresses.append(a.ctypes.data)
        return a

    t = await session.apply(fresh)
    assert np.asarray(t).ctypes.data == addresses[0]


async def test_kernel_inputs_are_read_only(session: at.AsyncEagerSession) -> None:
    t = await session.constant([1.0, 2.0])

    def sneaky(x: Any) -> Any:
        x.flags.writeable = True  # the buffer is reachable only through a read-only path
        return x

    with pytest.raises(at.KernelError, match="WRITEABLE"):
        await session.apply(sneaky, t)
    with pytest.raises(at.KernelError, match="WRITEABLE"):
        await session.apply(lambda xs, k: sneaky(xs[0]), [t], k=t)
    with pytest.raises(at.KernelError, match="WRITEABLE"):
        await session.apply(lambda k: sneaky(k), k=t)
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0])


async def test_apply_result_subclasses_become_plain_arrays(session: at.AsyncEagerSession, tmp_path: Any) -> None:
    # Regression: an np.matrix result was kept as the buffer, so a later sum(axis=1)
    # failed inside numpy ("matrix.sum() got an unexpected keyword argument 'keepdims'")
    # and numpy() returned a matrix; a memmap result kept its file mapped.
    with pytest.warns(PendingDeprecationWarning, match="matrix subclass"):
        mat = np.matrix([[1.0, 2.0], [3.0, 4.0]])
    m = await session.apply(lambda: mat)
    assert isinstance(m, at.Tensor)
    value = await m.numpy()
    assert type(value) is np.ndarray
    total = await session.sum(m, axis=1)
    np.testing.assert_array_equal(await total.numpy(), [3.0, 7.0])
    mapped = np.memmap(tmp_path / "a.bin", dtype=np.float64, mode="w+", shape=(3,))
    mapped[:] = [1.0, 2.0, 3.0]
    t = one(await session.apply(lambda: mapped))
    assert type(np.asarray(t).base) is not np.memmap
    mapped[0] = 9.0
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0, 3.0])
