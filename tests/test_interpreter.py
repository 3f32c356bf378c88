"""The step executor of multi-op kernels: one recycler, one budget, one error mapping for every driver."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._fusion._fused_ops import FusedOps
from aiotensor._programs import _recycler
from aiotensor._programs._interpreter import RECYCLER, Budget, Interpreter, checked

from ._recycling import BIG, ENGINE

# Nothing kept or learned by an earlier test (on this thread): conftest's fresh_recycler.
pytestmark = pytest.mark.usefixtures("fresh_recycler")


def big(seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(BIG).astype(np.float32)


def test_fused_ops_are_the_interpreter_driven_by_python() -> None:
    ops = FusedOps(ENGINE, Budget("a test"), measure=False)
    assert isinstance(ops, Interpreter)
    assert ops._fast  # numpy, not measured, not recycling: the hot path
    for recycle in (False, True):  # FusedOps.__init__ writes Interpreter.__init__ out: the same state
        for measure in (False, True):
            ours = FusedOps(ENGINE, Budget("a test"), measure=measure, recycle=recycle)
            base = Interpreter(Budget("a test"), np, measure=measure, recycle=recycle)
            for name in Interpreter.__slots__:
                if name != "_budget":
                    assert getattr(ours, name) == getattr(base, name), name
    assert not FusedOps(ENGINE, Budget("a test"), measure=False, recycle=True)._fast
    assert FusedOps(ENGINE, Budget("a test"), measure=False, recycle=True)._keeps  # a batch's hot path
    assert not FusedOps(ENGINE, Budget("a test"), measure=True, recycle=True)._keeps
    assert not FusedOps(ENGINE, Budget("a test"), measure=True)._fast


def test_a_buffer_kept_by_one_run_serves_a_later_run_on_the_same_thread() -> None:
    a, b = big(0), big(1)
    first = FusedOps(ENGINE, Budget("first"), recycle=True)
    first.multiply(a, b)  # learns the output's shape and dtype; dropped at once and kept
    assert sum(len(v) for v in RECYCLER.free.values()) == 1
    kept = id(next(iter(RECYCLER.free.values()))[0])  # (an id: a reference would be one more holder)
    del first
    second = FusedOps(ENGINE, Budget("second"), recycle=True)  # another run (a later batch)
    v = second.multiply(a, b)
    assert id(np.asarray(v).base) == kept  # (the buffer behind the read-only view)
    assert RECYCLER.nbytes == 0
    np.testing.assert_array_equal(np.asarray(v), a * b)


def test_what_one_thread_keeps_is_not_served_on_another() -> None:
    a = big()
    FusedOps(ENGINE, Budget("here"), recycle=True).add(a, a)
    assert RECYCLER.nbytes == a.nbytes
    seen: list[int] = []
    worker = threading.Thread(target=lambda: seen.append(RECYCLER.nbytes))
    worker.start()
    worker.join()
    assert seen == [0]


def test_values_count_in_the_budget_until_they_die_whatever_the_path() -> None:
    a = big()
    for measure, recycle in ((False, False), (True, False), (True, True), (False, True)):
        budget = Budget("a test")
        ops = FusedOps(ENGINE, budget, measure=measure, recycle=recycle)
        v = ops.add(a, a)
        w = ops.exp(v)
        assert budget.live == 2 * a.nbytes, (measure, recycle)
        assert budget.count == 2
        del v, w
        assert budget.live == 0
        assert budget.peak == 2 * a.nbytes


def test_a_budget_limit_raises_on_every_path() -> None:
    a = big()
    for measure, recycle in ((False, False), (True, False), (True, True), (False, True)):
        budget = Budget("a test")
        budget.limit = a.nbytes
        ops = FusedOps(ENGINE, budget, measure=measure, recycle=recycle)
        v = ops.add(a, a)
        with pytest.raises(at.ResourceExhaustedError, match="inside a test"):
            ops.multiply(v, 2.0)
        del v


def test_the_hot_path_of_a_batch_kernel_recycles_as_the_general_path_does() -> None:
    from aiotensor._fusion._fused_value import FusedValue

    a, b = big(0), big(1)
    ops = FusedOps(ENGINE, Budget("a test"), measure=False, recycle=True)  # _keeps: ops and operators take _kept
    v = ops.multiply(a, b)  # learns the output's shape and dtype
    want = a * b
    np.testing.assert_array_equal(v._arr, want)
    assert not v._arr.flags.writeable
    del v  # dropped: kept
    kept = id(next(iter(RECYCLER.free.values()))[0])
    x: Any = FusedValue(a, ops)  # (as a kernel's arguments arrive)
    y: Any = FusedValue(b, ops)
    w = x * y  # an operator on values: served the kept buffer
    assert id(w._arr) == kept
    np.testing.assert_array_equal(w._arr, want)
    assert not w._arr.flags.writeable
    np.testing.assert_array_equal((-x)._arr, -a)
    np.testing.assert_array_equal((2.0 * x)._arr, 2.0 * a)
    with pytest.raises(at.InvalidArgumentError):
        ops.add(x, np.ones(3, np.float32))  # shapes that do not broadcast: the op's own error
    with pytest.raises(at.InvalidArgumentError):
        _ = x + FusedValue(np.ones(3, np.float32), ops)


def test_measured_runs_sum_the_cost_model_over_their_ops() -> None:
    from aiotensor._cost import estimate_us
    from aiotensor._opdef import OPS

    a = np.ones(64)
    ops = FusedOps(ENGINE, Budget("a test"), measure=True)
    ops.exp(ops.add(a, 1.0))
    want = estimate_us(OPS["add"], (a, 1.0), None, None) + estimate_us(OPS["exp"], (a,), None, None)
    assert ops._estimate == pytest.approx(want)


def test_data_arguments_are_checked_numeric_as_the_op_checks_them() -> None:
    a = np.ones(3)
    assert checked((a, 2.0, "keep"), 2)[0] is a
    with pytest.raises(TypeError, match="not numeric"):  # (kernel_error maps it to the op's error)
        checked((np.array(["x"]),), 1)
    with pytest.raises(TypeError):
        checked((None,), 1)
    assert checked(("not data",), 0) == ("not data",)


async def test_a_fused_op_on_a_non_numeric_array_fails_as_the_session_op_does(s: at.AsyncEagerSession) -> None:
    strings = np.array(["a", "b"])

    @s.function
    def f(ops: at.FusedOps, x: Any) -> Any:
        return ops.add(x, strings)

    t = await s.constant(np.ones(2))
    with pytest.raises(at.InvalidArgumentError) as fused:
        await f(t)
    with pytest.raises(at.InvalidArgumentError) as op:
        await s.add(t, strings)
    assert type(fused.value) is type(op.value)


def test_a_statically_dying_intermediate_is_written_into_only_when_it_fits() -> None:
    y = np.ones(4)
    assert _recycler.writable_into(y, y)
    assert _recycler.writable_into(y, 2.0)
    assert _recycler.writable_into(y, np.zeros(4))
    assert not _recycler.writable_into(y, np.zeros(4, np.float32))  # another dtype
    assert not _recycler.writable_into(y, np.zeros((2, 4)))  # broadcasts to another shape
    assert not _recycler.writable_into(y[:2], 1.0)  # a view: someone else's memory
    assert not _recycler.writable_into(np.ones(4, np.int64), 1.0)  # integers: not a float
