"""``run`` fetch structures (nested list/tuple/dict/namedtuple) and the descriptions in error messages."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
import pytest

import aiotensor as at
from aiotensor._structure import describe, flatten, input_specs, unflatten


def is_tensor(x: Any) -> bool:
    """The leaves of a fetch structure here."""
    return isinstance(x, at.Tensor)


class Pair(NamedTuple):
    """A namedtuple fetch."""

    left: Any
    right: Any


async def test_run_keeps_the_structure(s: at.AsyncEagerSession) -> None:
    a = await s.constant([1.0, 2.0])
    b = await s.constant(3)
    single = await s.run(a)
    assert isinstance(single, np.ndarray)
    np.testing.assert_array_equal(single, [1.0, 2.0])
    fetched = await s.run({"a": a, "nested": [b, (a, b)], "pair": Pair(a, [b]), "empty": []})
    assert list(fetched) == ["a", "nested", "pair", "empty"]
    np.testing.assert_array_equal(fetched["a"], [1.0, 2.0])
    nested = fetched["nested"]
    assert isinstance(nested, list)
    assert isinstance(nested[1], tuple)
    assert nested[0] == 3
    np.testing.assert_array_equal(nested[1][0], [1.0, 2.0])
    pair = fetched["pair"]
    assert type(pair) is Pair
    np.testing.assert_array_equal(pair.left, [1.0, 2.0])
    assert pair.right == [3]
    assert fetched["empty"] == []
    assert await s.run([]) == []
    assert await s.run(()) == ()
    assert await s.run({}) == {}


async def test_run_values_are_owned_copies(s: at.AsyncEagerSession) -> None:
    a = await s.constant([1.0, 2.0])
    first, second = await s.run([a, a])  # the same tensor twice: two independent copies
    first[0] = 100.0
    np.testing.assert_array_equal(second, [1.0, 2.0])
    np.testing.assert_array_equal(await a.numpy(), [1.0, 2.0])


@pytest.mark.parametrize(
    ("fetches", "found"),
    [
        (3, "int 3"),
        ("name", "str 'name'"),
        (None, "NoneType None"),
        (np.ones(2), "ndarray"),
        ([1.5], "float 1.5"),
        ({"k": {"x": object()}}, "object"),
        ({1, 2}, "set"),
    ],
    ids=["int", "str", "None", "ndarray", "float-in-list", "object-in-dict", "set"],
)
async def test_bad_fetches_are_invalid(s: at.AsyncEagerSession, fetches: Any, found: str) -> None:
    t = await s.constant([1.0])
    for bad in (fetches, [t, fetches], {"ok": t, "bad": fetches}):
        with pytest.raises(at.InvalidArgumentError, match="run: fetches must be Tensors") as info:
            await s.run(bad)
        assert found in str(info.value)
    np.testing.assert_array_equal(await s.run(t), [1.0])  # still usable


async def test_run_rejects_tensors_of_another_session(s: at.AsyncEagerSession) -> None:
    async with at.AsyncEagerSession() as other:
        theirs = await other.ones(1)
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await s.run([theirs])


async def test_flatten_and_unflatten(s: at.AsyncEagerSession) -> None:
    a, b, c = [await s.constant(i) for i in range(3)]
    fetches = OrderedDict(x=[a, (b,)], y=Pair(c, {"z": a}))
    leaves = flatten(fetches, is_tensor)
    assert leaves == [a, b, c, a]  # depth first, dict order
    rebuilt = unflatten(fetches, is_tensor, iter(["A", "B", "C", "A2"]))
    assert rebuilt == {"x": ["A", ("B",)], "y": Pair("C", {"z": "A2"})}
    assert type(rebuilt["y"]) is Pair
    with pytest.raises(at.InvalidArgumentError, match="str"):
        flatten([a, "oops"], is_tensor)


async def test_describe_inputs(s: at.AsyncEagerSession) -> None:
    t = await s.zeros((2, 3), dtype=np.float32)
    assert describe((t, np.ones(4, np.int8), 2.5)) == "float32[2, 3], int8[4], 2.5"
    assert describe(([t, 1],)) == "[float32[2, 3], 1]"
    assert describe(((t,),)) == "(float32[2, 3],)"
    assert describe(([1, 2, 3, 4, 5],)) == "list of 5"
    assert describe(("x" * 100,)) == "str"  # long values by type only
    assert describe(()) == ""


async def test_input_specs(s: at.AsyncEagerSession) -> None:
    t = await s.zeros((2, 3), dtype=np.float32)

    class BadShape:
        @property
        def shape(self) -> tuple[int, ...]:
            raise RuntimeError("no shape")

    assert input_specs((t, np.ones(4, np.int8), 2.5, [1, 2, 3, 4, 5], BadShape())) == (
        {"dtype": "float32", "shape": [2, 3]},
        {"dtype": "int8", "shape": [4]},
        {"value": "2.5"},
        {"value": "list of 5"},
        {"value": "BadShape"},
    )
    assert input_specs(()) == ()
