"""Module-level ops: which session runs them, and that they mirror the session methods exactly."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _generated_functional

from ._opcheck import nothing_allocated
from ._results import one

#: The op library as issue 2 fixes it (public contract).
ISSUE_OPS = [
    "constant",
    "asarray",
    "zeros",
    "ones",
    "full",
    "zeros_like",
    "ones_like",
    "arange",
    "linspace",
    "eye",
    "random_uniform",
    "random_normal",
    "add",
    "subtract",
    "multiply",
    "divide",
    "floor_divide",
    "remainder",
    "pow",
    "negative",
    "abs",
    "sign",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "square",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "maximum",
    "minimum",
    "clip",
    "round",
    "floor",
    "ceil",
    "where",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_not",
    "isnan",
    "isfinite",
    "matmul",
    "tensordot",
    "einsum",
    "reshape",
    "permute_dims",
    "expand_dims",
    "squeeze",
    "concat",
    "stack",
    "split",
    "broadcast_to",
    "astype",
    "take",
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "std",
    "var",
    "argmax",
    "argmin",
    "softmax",
    "log_softmax",
    "apply",
]


def _session_ops() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(at.AsyncEagerSession)
        if not name.startswith("_")
        and inspect.iscoroutinefunction(member)
        and member.__qualname__.split(".")[0].endswith("Ops")  # the op mixins, not lifecycle (close, run)
    }


def test_every_op_of_the_issue_exists_both_ways() -> None:
    for name in ISSUE_OPS:
        assert inspect.iscoroutinefunction(getattr(at.AsyncEagerSession, name, None)), f"session lacks {name}"
        assert inspect.iscoroutinefunction(getattr(at, name, None)), f"at.{name} missing or not async"
        assert name in at.__all__, name


def test_module_functions_mirror_the_session_methods() -> None:
    assert set(_generated_functional.__all__) == _session_ops()
    for name in _generated_functional.__all__:
        fn = getattr(at, name)
        method = getattr(at.AsyncEagerSession, name)
        assert fn.__name__ == name
        assert fn.__module__ == "aiotensor"
        assert fn.__doc__ == method.__doc__, name
        params = list(inspect.signature(method).parameters.values())[1:]  # without self
        assert list(inspect.signature(fn).parameters.values()) == params, name
        assert not hasattr(fn, "__wrapped__")  # help() shows the op, not a wrapper chain


async def test_session_comes_from_tensor_arguments(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1.0, 2.0])
    async with at.AsyncEagerSession() as other:
        with other.as_default():  # a tensor argument beats the default session
            for result in [
                await at.add(t, 1),
                await at.add(1, t),  # not the first argument
                await at.clip(t, max=1.5),
                await at.concat([[0.0], t]),  # inside a list
                await at.where([True, False], 0.0, t),
                await at.apply(lambda *, x: -x, x=t),  # a keyword value
                await at.getitem(t, 0),
            ]:
                assert one(result).session is s
        assert other.stats().allocated == 0


async def test_default_session_then_no_session_error(s: at.AsyncEagerSession) -> None:
    with pytest.raises(at.NoSessionError, match="as_default"):
        await at.ones(2)
    with s.as_default():
        t = await at.ones(2)
        u = await at.add(1.0, 2.0)  # no tensor at all: still the default session
    assert t.session is s
    assert u.session is s
    np.testing.assert_array_equal(await u.numpy(), 3.0)
    with pytest.raises(at.NoSessionError):
        await at.linspace(0, 1, 3)  # the default ended with the block
    assert isinstance(at.NoSessionError("x"), at.AioTensorError)


async def test_defaults_are_per_task(s: at.AsyncEagerSession) -> None:
    async with at.AsyncEagerSession() as other:

        async def make(session: at.AsyncEagerSession) -> at.Tensor:
            with session.as_default():
                await asyncio.sleep(0)  # let the other task set its own default meanwhile
                return await at.zeros(1)

        a, b = await asyncio.gather(make(s), make(other))
        assert a.session is s
        assert b.session is other


async def test_tensors_of_another_session_are_rejected(s: at.AsyncEagerSession) -> None:
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as other:
        mine = await s.constant([1.0])
        theirs = await other.constant([2.0], name="theirs")
        call: Callable[[], Awaitable[Any]]
        for call in (
            lambda: at.add(mine, theirs),
            lambda: at.add(theirs, mine),
            lambda: other.multiply(mine, 2),
            lambda: at.stack([theirs, mine]),
        ):
            with nothing_allocated(other), pytest.raises(at.InvalidArgumentError, match="another session") as info:
                await call()
            assert isinstance(info.value, ValueError)
        np.testing.assert_array_equal(await (await at.add(theirs, 1)).numpy(), [3.0])  # still usable


async def test_a_child_reads_its_parents_tensors_and_owns_the_results() -> None:
    strategy = at.ResourceCleanupStrategy.ON_SESSION_CLOSE
    async with at.AsyncEagerSession(cleanup=strategy) as parent:
        weights = await parent.constant([[1.0, 2.0], [3.0, 4.0]], name="weights")
        before = parent.stats()
        async with at.AsyncEagerSession(parent=parent, cleanup=strategy) as child:
            x = await child.constant([1.0, 1.0])
            results = [
                await child.matmul(weights, x),  # a session method with the parent's tensor
                await at.matmul(weights, x),  # module function: the child's tensor picks the child
                await at.matmul(x, weights),
            ]
            with child.as_default():
                results.append(await at.relu(weights))  # only parent tensors, the child as default
            for r in results:
                assert r.session is child
            np.testing.assert_array_equal(await results[0].numpy(), [3.0, 7.0])
            np.testing.assert_array_equal(await results[2].numpy(), [4.0, 6.0])
            assert child.stats().live_tensors == 1 + len(results)
            async with at.AsyncEagerSession(parent=child) as grandchild:
                deep = await at.add(weights, await grandchild.ones(1))
                assert deep.session is grandchild
            with pytest.raises(at.InvalidArgumentError, match="another session"):
                await parent.add(weights, x)  # a parent cannot read its child's tensors
        after = parent.stats()
        assert (after.allocated, after.live_tensors) == (before.allocated, before.live_tensors)
        np.testing.assert_array_equal(await weights.numpy(), [[1.0, 2.0], [3.0, 4.0]])
        # without the child as default, a parent-only op stays in the parent
        assert (await at.relu(weights)).session is parent
