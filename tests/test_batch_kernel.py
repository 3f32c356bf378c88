"""The kernel of a batch: stacking, splitting, and recycled temporaries that never change a live array."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._fusion import _batch_kernel as bk
from aiotensor._fusion._fused_ops import FusedOps
from aiotensor._programs import _interpreter as interp
from aiotensor._programs import _recycler
from aiotensor._programs._interpreter import RECYCLER, Budget

from ._recycling import BIG, ENGINE

# Nothing kept or learned by an earlier test (on this thread): conftest's fresh_recycler.
pytestmark = pytest.mark.usefixtures("fresh_recycler")


def ops() -> FusedOps:
    return FusedOps(ENGINE, Budget("a test"), recycle=True)


def big(seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal(BIG).astype(np.float32)


def kept() -> int:
    return sum(len(v) for v in RECYCLER.free.values())


def test_a_dead_intermediate_is_reused_as_the_output_of_a_later_op() -> None:
    a, b = big(0), big(1)
    o = ops()
    o.multiply(a, b)  # each op learns its output's shape and dtype on its first call
    o.relu(a)
    RECYCLER.clear()
    v = o.add(a, b)
    first = id(np.asarray(v).base)  # the buffer behind the read-only view (an id: a reference would keep it)
    np.testing.assert_array_equal(np.asarray(v), a + b)
    del v
    assert kept() == 1
    w = o.multiply(a, b)  # same shape and dtype: served from the kept buffer
    assert id(np.asarray(w).base) == first
    np.testing.assert_array_equal(np.asarray(w), a * b)
    assert kept() == 0
    r = o.relu(w)
    del w
    r2 = o.relu(r)  # takes w's buffer
    assert id(np.asarray(r2).base) == first
    np.testing.assert_array_equal(np.asarray(r2), np.maximum(a * b, 0))


def test_a_buffer_something_still_refers_to_is_never_reused() -> None:
    a, b = big(0), big(1)
    o = ops()
    o.add(a, b)  # learn the spec; dropped at once and kept
    assert kept() == 1
    RECYCLER.clear()
    v = o.add(a, b)
    view = np.asarray(v)  # escapes the value
    del v
    assert kept() == 0
    w = o.multiply(a, b)
    np.testing.assert_array_equal(view, a + b)  # unchanged
    assert not np.shares_memory(view, np.asarray(w))


def test_small_outputs_scalars_and_keywords_are_not_recycled() -> None:
    small = np.ones((4, 4), np.float32)
    o = ops()
    del_me = o.add(small, small)
    del del_me
    assert kept() == 0
    a = big()
    o.add(a, 1.0)  # a Python scalar may pick the dtype (numpy 1.x): never recycled
    o.add(a, np.float32(1.0))
    o.sum(a, axis=0)
    assert _recycler.SPECS == {}
    assert kept() == 0


def test_what_is_kept_per_thread_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    a = big()
    o = ops()
    o.add(a, a)  # learn the spec
    values = [o.add(a, a) for _ in range(_recycler.PER_SPEC + 3)]
    del values
    assert kept() == _recycler.PER_SPEC
    assert RECYCLER.nbytes == _recycler.PER_SPEC * a.nbytes
    RECYCLER.clear()
    monkeypatch.setattr(_recycler, "CAP", 2 * a.nbytes)
    values = [o.add(a, a) for _ in range(4)]
    del values
    assert RECYCLER.nbytes <= 2 * a.nbytes


def test_the_reference_count_of_a_lone_array_is_calibrated() -> None:
    assert isinstance(interp._ALONE, int)
    assert interp._ALONE >= 1


def test_the_kernel_stacks_splits_and_copies_what_it_does_not_own() -> None:
    from aiotensor._kernels import KernelResult, normalize

    xs = (np.arange(6.0).reshape(3, 2), np.arange(6.0, 10.0).reshape(2, 2))
    kernel = bk.BatchKernel(lambda ops, x, k: (x * k, x + 0.0), ENGINE, Budget("b"), [3, 2], "batched(f)")
    result = kernel(xs, 2.0)
    assert kernel.multi
    # Per caller, per output: owned, read-only copies, taken by the engine as they are.
    assert type(result) is KernelResult
    assert result.multi
    pieces = [b.handle for b in result.buffers]
    assert len(pieces) == 4
    for piece, b in zip(pieces, result.buffers, strict=True):
        assert piece.base is None
        assert not piece.flags.writeable
        assert (b.shape, b.dtype, b.nbytes) == (piece.shape, piece.dtype, piece.nbytes)
    assert normalize(result) is result
    np.testing.assert_array_equal(pieces[0], xs[0] * 2)
    np.testing.assert_array_equal(pieces[1], xs[0])
    np.testing.assert_array_equal(pieces[2], xs[1] * 2)
    np.testing.assert_array_equal(pieces[3], xs[1])
    x = np.ones((2, 2))
    alone = bk.BatchKernel(lambda ops, x: x, ENGINE, Budget("b"), [2], "batched(f)")((x,))
    assert alone is not x  # the caller's array is never taken over


def test_outputs_without_one_row_per_input_row_are_refused() -> None:
    kernel = bk.BatchKernel(lambda ops, x: ops.sum(x, axis=0), ENGINE, Budget("b"), [2, 1], "batched(f)")
    with pytest.raises(at.InvalidArgumentError, match=r"one row per input row \(3 rows"):
        kernel((np.ones((2, 4)), np.ones((1, 4))))


async def test_many_batches_on_the_pool_stay_right_and_earlier_results_never_change(s: at.AsyncEagerSession) -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    tw = await s.constant(w)

    @at.batched(max_batch_size=256)
    def layer(ops: at.FusedOps, x: Any, w: Any) -> Any:
        h = ops.relu(x @ w)
        return ops.exp(ops.negative(h)) + h  # several big intermediates per run

    def reference(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        h = np.maximum(x @ w, 0)
        return np.exp(-h) + h

    held: list[tuple[np.ndarray[Any, Any], at.Tensor]] = []
    for round_ in range(6):
        # Odd rounds: 8 x 32 rows, one batch of the same shapes each time (its buffers recycled).
        counts = [32] * 8 if round_ % 2 else [int(n) for n in rng.integers(20, 60, size=8)]
        xs = [rng.standard_normal((n, 64)).astype(np.float32) for n in counts]
        ys = await asyncio.gather(*[layer(x, tw) for x in xs])
        for x, y in zip(xs, ys, strict=True):
            assert isinstance(y, at.Tensor)
            held.append((x, y))
        for x, y in held:  # every earlier result too: recycling never wrote into one
            np.testing.assert_allclose(np.asarray(y), reference(x), rtol=1e-5, atol=1e-6, err_msg=f"round {round_}")
    del held, ys, y


def test_recycling_fused_ops_note_whether_an_output_was_worth_recycling() -> None:
    small = ops()
    np.testing.assert_array_equal(np.asarray(small.add(np.ones((4, 4)), 1.0)), np.full((4, 4), 2.0))
    assert not small._big  # under MIN_BYTES: nothing to recycle
    large = ops()
    x = big()
    np.testing.assert_array_equal(np.asarray(large.add(x, x)), x + x)
    assert large._big


def test_a_lone_caller_known_to_make_small_outputs_takes_plain_fused_ops() -> None:
    x, w = np.arange(6.0).reshape(3, 2), np.arange(4.0).reshape(2, 2)

    def f(ops: Any, x: Any, w: Any) -> Any:
        return ops.relu(x @ w - 3.0) * 2.0

    kernel = bk.BatchKernel(f, ENGINE, Budget("b"), [3], "batched(f)", measure=False, recycle=False)
    np.testing.assert_array_equal(kernel((x,), w), np.maximum(x @ w - 3.0, 0) * 2.0)
    assert kernel.blas is None  # nothing learned from plain fused ops
    assert kernel.big is None
    # Several callers always stack into recycled buffers, whatever the lone runs said.
    stacked = bk.BatchKernel(f, ENGINE, Budget("b"), [3, 3], "batched(f)", measure=False, recycle=False)
    result = stacked((x, x + 1.0), w)
    np.testing.assert_array_equal(result.buffers[1].handle, np.maximum((x + 1.0) @ w - 3.0, 0) * 2.0)
    assert stacked.big is False
    assert stacked.blas is True
    alone = bk.BatchKernel(lambda ops, x: x, ENGINE, Budget("b"), [3], "batched(f)", measure=False, recycle=False)
    assert alone((x,)) is not x  # the caller's array is never taken over, on this path either


def test_split_outputs_of_a_non_numeric_dtype_are_refused_as_normalize_would() -> None:
    from aiotensor._kernels import BadOutputError

    kernel = bk.BatchKernel(lambda ops, x: np.full(x.shape, "a"), ENGINE, Budget("b"), [2, 1], "batched(f)")
    with pytest.raises(BadOutputError, match="dtype <U1"):
        kernel((np.ones((2, 4)), np.ones((1, 4))))


@pytest.mark.parametrize("counts", [[2, 2, 2], [1, 3, 2]], ids=["equal", "unequal"])
def test_split_pieces_are_per_caller_then_per_output_owned_and_read_only(counts: list[int]) -> None:
    from aiotensor._kernels import KernelResult

    xs = tuple(np.arange(4.0 * n).reshape(n, 4) + 100 * i for i, n in enumerate(counts))
    kernel = bk.BatchKernel(lambda ops, x: (x * 2.0, x[:, :1]), ENGINE, Budget("b"), counts, "batched(f)")
    result = kernel(xs)
    assert type(result) is KernelResult
    assert len(result.buffers) == 2 * len(counts)
    for i, x in enumerate(xs):
        doubled, first = result.buffers[2 * i], result.buffers[2 * i + 1]
        np.testing.assert_array_equal(doubled.handle, x * 2.0)
        np.testing.assert_array_equal(first.handle, x[:, :1])
        for b in (doubled, first):
            assert b.handle.base is None
            assert not b.handle.flags.writeable
            assert b.handle.flags.c_contiguous
            assert (b.shape, b.dtype, b.nbytes) == (b.handle.shape, b.handle.dtype, b.handle.nbytes)
