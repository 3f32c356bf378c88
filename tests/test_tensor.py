"""Tensor handles: metadata, data access, read-only views, protocols and repr."""

from __future__ import annotations

import numpy as np
import pytest

import aiotensor as at


def test_users_cannot_construct_handles() -> None:
    with pytest.raises(TypeError, match="made by session ops"):
        at.Tensor()


async def test_metadata_are_plain_properties(s: at.AsyncEagerSession) -> None:
    t = await s.zeros((2, 3), dtype="float32", name="w")
    assert t.shape == (2, 3)
    assert t.dtype == np.float32
    assert (t.ndim, t.size, t.nbytes) == (2, 6, 24)
    assert t.name == "w"
    assert t.device == "/cpu:0"
    assert t.session is s
    assert len(t) == 2
    unnamed = await s.ones(1)
    assert unnamed.name.startswith("ones:")


async def test_numpy_returns_an_owned_copy_that_outlives_the_session() -> None:
    async with at.AsyncEagerSession() as s:
        t = await s.constant([1.0, 2.0, 3.0])
        value = await t.numpy()
        value[0] = 100.0  # the caller owns it
        np.testing.assert_array_equal(await t.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(value, [100.0, 2.0, 3.0])


async def test_asarray_is_a_read_only_view(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1, 2, 3])
    view = np.asarray(t)
    np.testing.assert_array_equal(view, [1, 2, 3])
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[0] = 5
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), [1.0, 2.0, 3.0])
    copied = np.array(t, copy=True)
    copied[0] = 7
    np.testing.assert_array_equal(await t.numpy(), [1, 2, 3])


async def test_eval_uses_its_session_or_a_child(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1, 2])
    np.testing.assert_array_equal(await t.eval(), [1, 2])
    np.testing.assert_array_equal(await t.eval(session=s), [1, 2])
    async with at.AsyncEagerSession(parent=s) as child:
        np.testing.assert_array_equal(await t.eval(session=child), [1, 2])
    async with at.AsyncEagerSession() as other:
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await t.eval(session=other)


async def test_misleading_protocols_raise(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1, 2])
    with pytest.raises(TypeError, match="truth value"):
        bool(t)
    with pytest.raises(TypeError, match="not iterable"):
        list(t)
    scalar = await s.constant(3)
    with pytest.raises(TypeError, match="0-d"):
        len(scalar)


async def test_repr_shows_metadata_and_a_few_values(s: at.AsyncEagerSession) -> None:
    small = await s.constant([1.5, 2.5], dtype="float32", name="a")
    assert repr(small) == "Tensor(name='a', shape=(2,), dtype=float32, device='/cpu:0', values=[1.5 2.5])"
    big = await s.arange(1000, name="r")
    text = repr(big)
    assert text.startswith("Tensor(name='r', shape=(1000,), dtype=int64")
    assert "values=[0 1 2 3 4 5 ...]" in text
    assert "999" not in text
    await s.close()
    assert repr(small).endswith(", freed)")


async def test_numpy_ufuncs_defer_to_tensor_operators(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1.0, 2.0])
    result = await (np.array([10.0, 20.0]) + t)  # numpy hands over to Tensor.__radd__
    assert isinstance(result, at.Tensor)
    np.testing.assert_array_equal(await result.numpy(), [11.0, 22.0])
