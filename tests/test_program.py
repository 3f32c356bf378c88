"""Programs: what a run accounts, pickling, writing into dying intermediates, runs in slices, views."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._engine._expressions import _is_tensor
from aiotensor._expr import Expr
from aiotensor._opdef import OPS
from aiotensor._programs import _program, _recycler
from aiotensor._programs._compile import compile_program, compiled

from ._formulas import formula as _formula


async def test_a_run_accounts_its_intermediates(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(1000))  # 8000 bytes
    before = s.stats()
    t = await ((a * 2.0 + 1.0) * 3.0)
    after = s.stats()
    # two intermediates allocated and freed inside the run, one result registered
    assert after.allocated - before.allocated == 3
    assert after.freed - before.freed == 2
    assert after.peak_bytes >= before.live_bytes + 2 * 8000
    del t


async def test_a_program_pickles_without_its_kernels(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.arange(4.0))
    e = _formula(a)
    e._used = True
    program, _, _ = compiled(e, _is_tensor, "numpy", Expr)
    program(np.arange(4.0))  # resolves its kernels
    clone = pickle.loads(pickle.dumps(program))
    np.testing.assert_allclose(clone(np.arange(4.0)), _formula(np.arange(4.0)))


# -- writing into dying intermediates, and runs in slices


def _compiled(roots: list[Expr]) -> tuple[_program.Program, list[Any]]:
    for r in roots:
        r._used = True
    return compile_program(roots, _is_tensor, "numpy", Expr)


def _chain(t: Any, other: Any) -> Any:
    y = t * 2.0 + 1.0
    y = y - 0.5
    y = y * y
    y = y / 3.0
    y = y + other
    y = abs(y)
    return 2.0**y - other


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
async def test_writing_into_dying_intermediates_gives_numpys_values(s: at.AsyncEagerSession, dtype: Any) -> None:
    rng = np.random.default_rng(3)
    v = rng.standard_normal((128, 128)).astype(dtype)  # above INTO_MIN_BYTES
    w = rng.standard_normal((128, 128)).astype(dtype)
    a, b = await s.constant(v), await s.constant(w)
    program, leaves = _compiled([_chain(a, b)])
    assert sum(1 for slot in _recycler.into_slots(program.steps, program.nleaves) if slot >= 0) >= 5
    bufs = [s._engine.peek(t) for t in leaves]
    before = [x.copy() for x in bufs]
    out = program(*bufs)
    np.testing.assert_array_equal(out, _chain(v, w))  # bit for bit: the same inner loops
    assert out.dtype == dtype
    for x, kept in zip(bufs, before, strict=True):
        np.testing.assert_array_equal(x, kept)  # the leaves are never written into
    # one buffer was made and reused all along: the budget saw one value of the output's size
    assert program.budget.count == 1
    assert program.budget.peak == v.nbytes


async def test_an_intermediate_something_views_is_not_written_into(s: at.AsyncEagerSession) -> None:
    v = np.arange(16384.0).reshape(128, 128)
    a = await s.constant(v)
    y = a * 2.0
    flat = y.reshape(-1)  # a view of y's buffer, alive after y's last use
    later = (y + 1.0) * 3.0
    program, leaves = _compiled([flat, later])
    y_slot = program.nleaves  # the first step's output
    assert y_slot not in _recycler.into_slots(program.steps, program.nleaves)
    got_flat, got_later = program(s._engine.peek(leaves[0]))
    np.testing.assert_array_equal(got_flat, (v * 2.0).reshape(-1))
    np.testing.assert_array_equal(got_later, (v * 2.0 + 1.0) * 3.0)
    t_flat, t_later = await s.run([flat, later])
    np.testing.assert_array_equal(t_flat, (v * 2.0).reshape(-1))
    np.testing.assert_array_equal(t_later, (v * 2.0 + 1.0) * 3.0)


@pytest.mark.parametrize(
    ("make", "expected_dtype"),
    [
        (lambda a, i: (a * 2.0 + 1.0) + a.astype(np.float64), np.float64),  # the other operand is wider
        (lambda a, i: (i * 2 + 1) / 3, np.float64),  # an int intermediate: true division widens
        (lambda a, i: abs(a * 2.0 + 1j) * 2.0, np.float32),  # a complex number widens to complex64
    ],
)
async def test_an_output_of_another_dtype_gets_a_buffer_of_its_own(
    s: at.AsyncEagerSession, make: Any, expected_dtype: Any
) -> None:
    v = np.linspace(-1, 1, 16384, dtype=np.float32)
    iv = np.arange(16384, dtype=np.int64)
    a, i = await s.constant(v), await s.constant(iv)
    got = await make(a, i).eval()
    want = make(v, iv)
    assert got.dtype == expected_dtype
    np.testing.assert_array_equal(got, want)


async def test_stats_count_the_buffers_a_run_really_made(session: at.AsyncEagerSession) -> None:
    a = await session.constant(np.ones((128, 128)))  # 128 KiB
    before = session.stats()
    t = await (((a * 2.0 + 1.0) * 3.0 - 1.0) / 2.0)  # four steps: one buffer, written into three times
    after = session.stats()
    assert after.allocated - before.allocated == 1
    assert after.freed - before.freed == 0
    assert after.live_bytes - before.live_bytes == t.nbytes
    np.testing.assert_array_equal(await t.numpy(), np.full((128, 128), 4.0))
    del t


async def test_a_run_in_slices_gives_what_a_whole_run_gives(s: at.AsyncEagerSession) -> None:
    v = np.random.default_rng(4).standard_normal((128, 128))
    a, b = await s.constant(v), await s.constant(v[::-1].copy())
    program, leaves = _compiled([_chain(a, b)])
    bufs = [s._engine.peek(t) for t in leaves]
    whole = program.fresh()(*bufs)
    run = program.fresh().sliced(*bufs)
    slices = 1
    while not run.advance(1e-9):  # a deadline long past: one step per slice
        slices += 1
    assert slices == len(program.steps)
    np.testing.assert_array_equal(run.result, whole)
    with pytest.raises(RuntimeError, match="over"):
        run.advance(1e-9)
    unbounded = program.fresh().sliced(*bufs)
    assert unbounded.advance(0.0)  # no deadline: all of it in one slice
    np.testing.assert_array_equal(unbounded.result, whole)


async def test_an_array_an_apply_returned_as_is_is_never_written_into(s: at.AsyncEagerSession) -> None:
    mine = np.ones((128, 128))  # the user's own array, writable, owning its memory

    def give(_: Any) -> Any:
        return mine

    a = await s.constant(np.zeros((128, 128)))
    e = Expr(OPS["apply"], (give, a), None, None)  # an apply node, as an expression argument makes one
    got = await ((e + 1.0) * 2.0).eval()
    np.testing.assert_array_equal(got, np.full((128, 128), 4.0))
    np.testing.assert_array_equal(mine, np.ones((128, 128)))  # untouched


@pytest.mark.parametrize("sliced", [False, True])
@pytest.mark.parametrize(
    ("make", "most"),
    [
        # (a * 2) is only reachable through the view once the view is taken: both count.
        (lambda a: (a * 2.0)[:] + 1.0, 2 * 8000),
        # a view of a view keeps the same buffer: counted once, until the last view goes
        (lambda a: (a * 2.0)[:][::1] + 1.0, 2 * 8000),
        # the view dies at the add: the product's bytes go with it, before the multiply
        (lambda a: ((a * 2.0)[:] + 1.0) * 3.0, 2 * 8000),
    ],
)
async def test_a_view_keeps_the_intermediate_it_views_counted(
    s: at.AsyncEagerSession, make: Any, most: int, sliced: bool
) -> None:
    a = await s.constant(np.ones(1000))  # 8000 bytes
    program, leaves = _compiled([make(a)])
    bufs = [s._engine.peek(t) for t in leaves]
    run = program.fresh()
    if sliced:
        steps = run.sliced(*bufs)
        while not steps.advance(1e-9):  # one step per slice: the views outlive a slice
            pass
        result = steps.result
    else:
        result = run(*bufs)
    np.testing.assert_array_equal(result, np.asarray(make(np.ones(1000))))
    assert run.budget.peak == most
    assert run.budget.live == 8000  # the result's bytes: every intermediate let go
    assert not run.budget.holders  # nothing left held by a view


async def test_the_memory_limit_counts_what_views_keep_alive() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=20_000)) as s:
        a = await s.constant(np.ones(1000))  # 8000 bytes; 12000 left
        # The product (8000) stays alive through the view while the sum (8000) is made.
        with pytest.raises(at.ResourceExhaustedError, match="16000 bytes of intermediates"):
            await ((a * 2.0)[:] + 1.0)
        assert s.stats().live_bytes == 8000
    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=40_000)) as s:
        a = await s.constant(np.ones(1000))
        t = await ((a * 2.0)[:] + 1.0)
        np.testing.assert_array_equal(await t.numpy(), np.full(1000, 3.0))
        assert s.stats().peak_bytes == 3 * 8000  # a, the viewed product and the sum at once


# -- a program of one step on leaves alone (``run_one``): as the step list runs it


def _budget(run: _program.Program) -> tuple[int, int, int, int]:
    b = run.budget
    return b.count, b.live, b.peak, b.escaped


def _both(program: _program.Program, bufs: list[Any]) -> tuple[Any, Any]:
    # (run_one's run, the step list's run of the same program) and their budgets compared.
    one = program.fresh()
    out = one(*bufs)
    assert one._kernels is not None
    assert one._kernels[3] is not None  # the one-step path was taken
    listed = program.fresh().sliced(*bufs)
    assert listed.advance(0.0)  # (sliced runs the step list, run_steps)
    assert _budget(one) == _budget(listed._program)
    return out, listed.result


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("matmul", [np.ones((3, 4)), np.ones((4, 2))]),  # a fresh result
        ("matrix_transpose", [np.ones((3, 4))]),  # a view of a leaf: no new memory
        ("real", [np.ones(5)]),  # a leaf returned as it is
        ("eigh", [np.diag([3.0, 1.0, 2.0])]),  # several results (a list)
        ("nonzero", [np.array([0.0, 1.0, 2.0])]),  # several results (a tuple)
        ("broadcast_arrays", [np.ones((3, 1)), np.ones(4)]),  # several views of leaves
    ],
)
def test_a_one_step_program_runs_and_accounts_as_the_step_list(name: str, values: list[Any]) -> None:
    d = OPS[name]
    refs = tuple(_program.Ref(i) for i in range(len(values)))
    program = _program.Program([(d, refs, None, 0, ())], [len(values)], len(values), "numpy")
    out, listed = _both(program, values)
    assert type(out) is type(listed)
    if isinstance(out, list):
        for x, y in zip(out, listed, strict=True):
            np.testing.assert_array_equal(x, y)
    else:
        np.testing.assert_array_equal(out, listed)


async def test_a_blocked_chain_is_one_step_run_as_the_step_list_runs_it(s: at.AsyncEagerSession) -> None:
    v = np.random.default_rng(5).standard_normal((256, 256)).astype(np.float32)
    a, b = await s.constant(v), await s.constant(v[::-1].copy())
    for e in (_chain(a, a), _chain(a, b)):
        program, leaves = _compiled([e])
        assert len(program.steps) == 1  # the whole chain: one blocked step
        out, listed = _both(program, [s._engine.peek(t) for t in leaves])
        np.testing.assert_array_equal(out, listed)
        np.testing.assert_array_equal(out, _chain(v, v if len(leaves) == 1 else v[::-1]))
        assert program.fresh().budget.count == 0  # (each run its own budget)


def test_a_one_step_program_fails_as_the_step_list_does() -> None:
    d = OPS["matmul"]
    program = _program.Program([(d, (_program.Ref(0), _program.Ref(1)), None, 0, ())], [2], 2, "numpy")
    bad = [np.ones((3, 4)), np.ones((5, 2))]
    with pytest.raises(at.InvalidArgumentError) as one:
        program.fresh()(*bad)
    with pytest.raises(at.InvalidArgumentError) as listed:
        program.fresh().sliced(*bad).advance(0.0)
    assert str(one.value) == str(listed.value)
    limited = program.fresh()
    limited.budget.limit = 10  # bytes: a 3x2 float64 result does not fit
    with pytest.raises(at.ResourceExhaustedError) as over:
        limited(np.ones((3, 4)), np.ones((4, 2)))
    sliced = program.fresh()
    sliced.budget.limit = 10
    with pytest.raises(at.ResourceExhaustedError) as over_listed:
        sliced.sliced(np.ones((3, 4)), np.ones((4, 2))).advance(0.0)
    assert str(over.value) == str(over_listed.value)
    assert _budget(limited) == _budget(sliced)
