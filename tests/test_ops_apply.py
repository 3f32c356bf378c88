"""``apply``: user kernels get read-only arrays, results become tensors, failures become precise errors."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._opcheck import nothing_allocated
from ._results import one


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


async def test_single_array_result(s: at.AsyncEagerSession) -> None:
    x = np.arange(6.0).reshape(2, 3)
    t = await s.constant(x)
    for how, result in [
        ("method", await s.apply(np.cumsum, t, axis=1)),
        ("module", await at.apply(np.cumsum, t, axis=1)),
    ]:
        assert isinstance(result, at.Tensor), how
        assert result.session is s
        assert result.name.startswith("apply(cumsum)")
        np.testing.assert_array_equal(await result.numpy(), np.cumsum(x, axis=1), strict=True)
        assert not np.asarray(result).flags.writeable
    scalar = one(await s.apply(np.sum, t))  # a numpy scalar becomes a 0-d tensor
    assert scalar.shape == ()
    assert scalar.dtype == np.float64
    assert float(await scalar.numpy()) == 15.0


async def test_tuple_result_gives_a_tuple_of_tensors(s: at.AsyncEagerSession) -> None:
    t = await s.constant([4.0, 9.0])
    result = await s.apply(lambda a: (np.sqrt(a), a.astype(np.int32), a > 5), t)
    assert isinstance(result, tuple)
    assert len(result) == 3
    root, ints, mask = result
    np.testing.assert_array_equal(await root.numpy(), [2.0, 3.0])
    assert ints.dtype == np.int32
    np.testing.assert_array_equal(await mask.numpy(), [False, True])
    q, r = await at.apply(np.divmod, t, 4.0)
    np.testing.assert_array_equal(await q.numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(await r.numpy(), [0.0, 1.0])


async def test_arguments_arrive_as_read_only_arrays(s: at.AsyncEagerSession) -> None:
    a = await s.constant([1.0, 2.0])
    b = await s.constant([[3, 4]])
    seen: dict[str, Any] = {}

    def kernel(first: Any, pair: Any, scale: float, *, extra: Any, plain: Any) -> Any:
        seen.update(first=first, pair=pair, scale=scale, extra=extra, plain=plain, thread=threading.get_ident())
        return first * scale + pair[1].sum() + extra[0]

    plain = np.array([10.0, 20.0])
    result = one(await s.apply(kernel, a, [a, b], 2.0, extra=b, plain=plain))
    np.testing.assert_array_equal(await result.numpy(), [2.0 + 7 + 3, 4.0 + 7 + 4])
    for key in ("first", "extra"):
        assert type(seen[key]) is np.ndarray, key
        assert not seen[key].flags.writeable, key
    assert isinstance(seen["pair"], list)
    assert all(type(e) is np.ndarray and not e.flags.writeable for e in seen["pair"])
    assert seen["scale"] == 2.0  # python scalars pass as they are
    np.testing.assert_array_equal(seen["plain"], plain)  # the caller's own arrays too
    assert seen["thread"] != threading.get_ident()  # always on the pool, never on the loop


async def test_returning_an_input_or_a_view_gives_an_independent_tensor(s: at.AsyncEagerSession) -> None:
    t = await s.constant(np.arange(6.0))
    same = one(await s.apply(lambda a: a, t))
    strided = one(await s.apply(lambda a: a[::2], t))
    assert same.name != t.name
    np.testing.assert_array_equal(await same.numpy(), np.arange(6.0))
    np.testing.assert_array_equal(await strided.numpy(), [0.0, 2.0, 4.0])
    assert strided.nbytes == 3 * 8  # owns exactly its elements, not the source buffer
    del t  # the source going away leaves the results intact
    np.testing.assert_array_equal(await same.numpy(), np.arange(6.0))


async def test_writing_to_an_input_is_a_kernel_error(sc: at.AsyncEagerSession) -> None:
    t = await sc.constant([1.0, 2.0])

    def scribble(a: Any) -> Any:
        a[0] = 100.0
        return a

    def scribble_kw(*, into: Any) -> Any:
        into += 1
        return into

    def scribble_listed(xs: list[Any]) -> Any:
        xs[1][...] = 0
        return xs[0]

    cases: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
        (scribble, (t,), {}),
        (scribble_kw, (), {"into": t}),
        (scribble_listed, ([t, t],), {}),
    ]
    for fn, args, kwargs in cases:
        with nothing_allocated(sc), pytest.raises(at.KernelError, match="read-only") as info:
            await sc.apply(fn, *args, **kwargs)
        assert isinstance(info.value.__cause__, ValueError)
        assert fn.__name__ in str(info.value)
    np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0])  # unchanged


class Boom(Exception):
    """A user error, to be chained."""


async def test_fn_raising_is_a_kernel_error_with_the_cause(sc: at.AsyncEagerSession) -> None:
    t = await sc.constant(np.zeros((2, 3), np.float32))

    def explode(a: Any) -> Any:
        raise Boom(f"bad shape {a.shape}")

    for fn in (explode, lambda a: 1 // 0, lambda a: a.reshape(7)):
        with nothing_allocated(sc), pytest.raises(at.KernelError) as info:
            await sc.apply(fn, t)
        err = info.value
        assert err.__cause__ is not None
        assert "float32[2, 3]" in str(err)  # names the inputs
        assert type(err.__cause__).__name__ in str(err)
    with pytest.raises(at.KernelError, match=r"apply\(explode\).*Boom: bad shape \(2, 3\)") as info:
        await at.apply(explode, t)
    assert isinstance(info.value.__cause__, Boom)
    assert not isinstance(info.value, at.InvalidArgumentError)  # a user's ValueError is not an argument error


BAD_RESULTS: list[tuple[str, Any]] = [
    ("None", lambda a: None),
    ("str", lambda a: "done"),
    ("dict", lambda a: {"x": a}),
    ("str-array", lambda a: np.array(["a", "b"])),
    ("object-array", lambda a: np.array([1, None], dtype=object)),
    ("empty-tuple", lambda a: ()),
    ("tuple-with-None", lambda a: (a, None)),
    ("list-of-str", lambda a: ["x"]),
]


@pytest.mark.parametrize(("label", "fn"), BAD_RESULTS, ids=[label for label, _ in BAD_RESULTS])
async def test_wrong_return_type_is_invalid_argument(sc: at.AsyncEagerSession, label: str, fn: Any) -> None:
    t = await sc.constant([1.0, 2.0])
    with nothing_allocated(sc), pytest.raises(at.InvalidArgumentError, match=r"apply\(<lambda>\)") as info:
        await sc.apply(fn, t)
    assert "float64[2]" in str(info.value)
    assert (await one(await sc.apply(np.negative, t)).numpy()).tolist() == [-1.0, -2.0]  # still usable


async def test_apply_arguments_and_sessions(s: at.AsyncEagerSession) -> None:
    with pytest.raises(at.InvalidArgumentError, match="callable"):
        await s.apply(np.ones(3))  # type: ignore[arg-type]
    with pytest.raises(at.NoSessionError):
        await at.apply(np.ones, 3)
    with s.as_default():
        made = one(await at.apply(np.ones, (2, 2)))  # no tensor argument: the default session
    assert made.session is s
    np.testing.assert_array_equal(await made.numpy(), np.ones((2, 2)))
    async with at.AsyncEagerSession() as other:
        foreign = await other.constant([1.0])
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await s.apply(np.negative, foreign)


async def test_apply_on_an_expression_returns_what_apply_on_a_tensor_returns(s: at.AsyncEagerSession) -> None:
    # Issue 27 (5): one result normalization, whatever the argument.
    x = await s.constant(np.arange(3.0))
    on_tensor = await s.apply(np.cumsum, x)
    on_expr = await s.apply(np.cumsum, x * 2.0)
    assert isinstance(on_tensor, at.Tensor)
    assert isinstance(on_expr, at.Tensor)
    np.testing.assert_array_equal(await on_expr.numpy(), np.cumsum(np.arange(3.0) * 2.0))
    pair = await s.apply(lambda a: (a + 1, a * 2), x * 2.0)
    assert isinstance(pair, tuple)
    assert len(pair) == 2
    one = await s.apply(lambda a: (a + 1,), x * 2.0)  # a 1-tuple stays a 1-tuple, as on a tensor
    assert isinstance(one, tuple)
    assert isinstance(await s.apply(lambda a: (a + 1,), x), tuple)


def _writes_into(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a[0] = 5.0
    return a


async def test_a_kernel_cannot_write_into_an_expression_it_is_given(s: at.AsyncEagerSession) -> None:
    # Issue 27 (6): read-only for a tensor, and for an expression's intermediate alike.
    x = await s.constant(np.arange(3.0))
    with pytest.raises(at.KernelError):
        await s.apply(_writes_into, x)
    with pytest.raises(at.KernelError):
        await s.apply(_writes_into, x * 2.0)
    with pytest.raises(at.KernelError):
        await s.apply(lambda arrays: _writes_into(arrays[0]), [x * 2.0])
    np.testing.assert_array_equal(await x.numpy(), np.arange(3.0))
