"""Compiling expressions into programs: the cache keyed on an expression's signature, CSE, and the cost estimate."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._engine._expressions import _is_tensor
from aiotensor._expr import Expr
from aiotensor._programs import _compile
from aiotensor._programs._compile import compile_program, compiled

from ._formulas import formula as _formula


async def test_a_formula_in_a_loop_compiles_once_and_reads_each_calls_tensors(s: at.AsyncEagerSession) -> None:
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(8).astype(np.float32) for _ in range(5)]
    before = len(_compile._CACHE)
    for v in values:
        t = await s.constant(v)
        np.testing.assert_allclose(await _formula(t).eval(), _formula(v), rtol=1e-6)
        del t
    assert len(_compile._CACHE) <= before + 1  # at most one new entry for the five evaluations


async def test_the_cached_program_is_the_compiled_one(s: at.AsyncEagerSession) -> None:
    t = await s.constant(np.arange(6.0).reshape(2, 3))
    e = _formula(t)
    e._used = True
    fresh, leaves = compile_program([e], _is_tensor, "numpy", Expr)
    first, leaves1, _ = compiled(e, _is_tensor, "numpy", Expr)
    again, leaves2, _ = compiled(_formula(t), _is_tensor, "numpy", Expr)
    assert [id(x) for x in leaves] == [id(x) for x in leaves1] == [id(x) for x in leaves2]
    assert again.steps is first.steps  # a hit: the same compiled steps
    assert again.budget is not first.budget  # but a budget of its own per run
    assert [(st[0], st[3], st[4]) for st in again.steps] == [(st[0], st[3], st[4]) for st in fresh.steps]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        # two-node formulas (one node takes the op path) whose constants differ in value, type
        # (NEP 50: numpy scalars are strong) and zero's sign
        (lambda a, b: [a * 2.0 - 1, a * 3.0 - 1], lambda av, bv: [av * 2.0 - 1, av * 3.0 - 1]),
        (lambda a, b: [-(a + 1), -(a + 1.0)], lambda av, bv: [-(av + 1), -(av + 1.0)]),
        (lambda a, b: [-(a * 2.0), -(a * np.float64(2.0))], lambda av, bv: [-(av * 2.0), -(av * np.float64(2.0))]),
        (lambda a, b: [(a + 1.0) * 0.0, (a + 1.0) * -0.0], lambda av, bv: [(av + 1.0) * 0.0, (av + 1.0) * -0.0]),
        # where the tensors go: a + b against a + a
        (lambda a, b: [-(a + b), -(a + a)], lambda av, bv: [-(av + bv), -(av + av)]),
        (lambda a, b: [-(a - b), -(b - a)], lambda av, bv: [-(av - bv), -(bv - av)]),
        # arrays are told apart by identity only: never cached
        (
            lambda a, b: [(a + np.ones(3, np.float32)) * 2.0, (a + np.full(3, 5, np.float32)) * 2.0],
            lambda av, bv: [(av + 1) * 2.0, (av + 5) * 2.0],
        ),
        # axes and other keyword values
        (lambda a, b: [(a * 1.0).sum(axis=0), (a * 1.0).sum(axis=None)], lambda av, bv: [av.sum(0), av.sum()]),
        (lambda a, b: [(a + 0.5)[0:1], (a + 0.5)[1:3]], lambda av, bv: [(av + 0.5)[0:1], (av + 0.5)[1:3]]),
    ],
)
async def test_formulas_that_differ_never_share_a_program(s: at.AsyncEagerSession, make: Any, expected: Any) -> None:
    av = np.array([1.0, -2.0, 3.0], np.float32)
    bv = np.array([0.5, 4.0, -1.0], np.float32)
    a, b = await s.constant(av), await s.constant(bv)
    for _ in range(2):  # the second pass evaluates from the cache
        for e, want in zip(make(a, b), expected(av, bv), strict=True):
            got = await e.eval()
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


async def test_common_subexpressions_keep_the_sign_of_zero(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(2))
    neg, pos = await s.run([a * -0.0, a * 0.0])  # one program: the two nodes must not merge
    assert np.signbit(neg).all()
    assert not np.signbit(pos).any()


async def test_a_shared_subexpression_is_not_expanded(s: at.AsyncEagerSession) -> None:
    # y = y + y forty times: 2**40 nodes if expanded; the signature gives up, compiling does not.
    a = await s.constant(np.ones(4))
    y: Any = a * 1.0
    for _ in range(40):
        y = y + y
    assert y._sig is None
    np.testing.assert_array_equal(await y.eval(), np.full(4, 2.0**40))


async def test_the_cache_is_bounded(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(2))
    for i in range(_compile._CACHE_ENTRIES + 20):
        np.testing.assert_array_equal(await ((a + float(i)) * 2.0).eval(), np.full(2, (1.0 + i) * 2.0))
    assert len(_compile._CACHE) <= _compile._CACHE_ENTRIES


async def test_an_int_constant_and_a_float_constant_differ(s: at.AsyncEagerSession) -> None:
    i = await s.constant(np.array([1, 2], np.int32))
    for _ in range(2):
        as_int, as_float = await (-(i + 1)).eval(), await (-(i + 1.0)).eval()
        assert as_int.dtype == np.int32
        assert as_float.dtype == np.float64
        np.testing.assert_array_equal(as_float, [-2.0, -3.0])


async def test_common_subexpressions_keep_complex_signed_zeros_apart(s: at.AsyncEagerSession) -> None:
    # Issue 27 (2): complex constants equal under == but with a zero of another sign.
    a = await s.constant(np.ones(2))
    constants = [0j, complex(-0.0, 0.0), complex(0.0, -0.0), complex(-0.0, -0.0)]
    got = await s.run([(a * c) * 1.0 for c in constants])
    for c, value in zip(constants, got, strict=True):
        want = (np.ones(2) * c) * 1.0
        np.testing.assert_array_equal(np.signbit(value.real), np.signbit(want.real))
        np.testing.assert_array_equal(np.signbit(value.imag), np.signbit(want.imag))


async def test_common_subexpressions_tell_numpy_scalars_apart(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(2, dtype=np.float32))
    got = await s.run([a * np.float32(-0.0), a * np.float32(0.0), a * np.float64(0.0), a * np.float32(2)])
    want = [np.ones(2, np.float32) * c for c in (np.float32(-0.0), np.float32(0.0), np.float64(0.0), np.float32(2))]
    for value, w in zip(got, want, strict=True):
        assert value.dtype == w.dtype
        np.testing.assert_array_equal(value, w)
        np.testing.assert_array_equal(np.signbit(value), np.signbit(w))
