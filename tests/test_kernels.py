"""Kernel output normalization: owned, read-only, numeric buffers."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _kernels
from aiotensor._kernels import (
    ALIGN_FROM,
    BadOutputError,
    aligned_fresh,
    finalize,
    kernel_error,
    numeric_array,
    parked,
    run_kernel,
)


def test_views_and_inputs_are_copied_into_owned_read_only_buffers() -> None:
    base = np.arange(10.0)
    base.flags.writeable = False
    view = base[2:4]
    out = finalize(view)
    assert out.flags.owndata
    assert not out.flags.writeable
    assert not np.shares_memory(out, base)
    same = finalize(base)  # an input returned as-is must not be owned twice
    assert same is not base
    fresh = np.ones(3)
    assert finalize(fresh) is fresh  # a fresh result is kept without a copy
    assert not fresh.flags.writeable


def test_scalars_become_0d_arrays() -> None:
    out = finalize(np.float32(2.5))
    assert out.shape == ()
    assert out.dtype == np.float32
    assert finalize(3).dtype == np.asarray(3).dtype


@pytest.mark.parametrize("bad", ["text", None, [1, 2], object(), np.array(["a"]), np.array([None])])
def test_non_numeric_outputs_are_rejected(bad: object) -> None:
    with pytest.raises(BadOutputError):
        finalize(bad)


def test_run_kernel_reports_single_and_multiple_outputs() -> None:
    single = run_kernel(np.add, (np.ones(2), 1), {})
    assert not single.multi
    assert single.buffers[0].shape == (2,)
    assert single.buffers[0].nbytes == 16
    multi = run_kernel(np.split, (np.arange(6), 3), {})
    assert multi.multi
    assert [b.shape for b in multi.buffers] == [(2,), (2,), (2,)]
    with pytest.raises(BadOutputError, match="empty"):
        run_kernel(lambda: (), (), {})


class _Unprintable(ValueError):
    def __str__(self) -> str:
        raise AttributeError("'_Unprintable' object has no attribute 'axis'")


def test_an_error_whose_str_fails_is_still_mapped() -> None:
    # Issue 27 (11): Dask rebuilds numpy's AxisError without its .axis; str() of it raised.
    error = kernel_error("sum", (np.ones(2),), _Unprintable(5, 2), False)
    assert isinstance(error, at.InvalidArgumentError)
    assert "sum(float64[2]): 5, 2" in str(error)
    assert isinstance(kernel_error("apply(f)", (), _Unprintable(1), True), at.KernelError)


def test_aligned_fresh_asks_malloc_again_until_a_chunk_is_32_byte_aligned() -> None:
    # Chunks 16 bytes off a 32-byte boundary are held while the next is asked for; the
    # first aligned one is the array (its own memory); none aligned in four: the first.
    raw = np.empty((1 << 18) + 64, np.uint8)
    start = -raw.ctypes.data % 32
    aligned = raw[start : start + (1 << 18)].view(np.float32).reshape(256, 256)
    off = [raw[start + 16 : start + 16 + (1 << 18)].view(np.float32).reshape(256, 256) for _ in range(5)]
    asked: list[tuple[Any, ...]] = []

    def empty(answers: list[Any]) -> Callable[..., Any]:
        def make(shape: tuple[int, ...], dtype: Any) -> Any:
            asked.append((shape, dtype))
            return answers.pop(0)

        return make

    f32 = np.dtype(np.float32)
    assert aligned_fresh((256, 256), f32, empty([off[0], off[1], aligned])) is aligned
    assert len(asked) == 3
    assert aligned_fresh((256, 256), f32, empty([aligned])) is aligned
    assert len(asked) == 4
    assert aligned_fresh((256, 256), f32, empty(off[1:5])) is off[1]
    assert asked == [((256, 256), f32)] * 8
    got = aligned_fresh((256, 256), f32)
    assert got.base is None
    assert got.flags.c_contiguous
    assert got.flags.writeable
    assert got.shape == (256, 256)
    assert got.dtype == f32


def test_aligned_fresh_parks_the_misaligned_chunks_it_was_handed_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # With park, the misaligned chunks are kept (the last PARKED of them, each at most
    # PARK_MAX_BYTES) so that malloc does not hand them back first next time; without,
    # they are freed as before. The array returned is the same either way.
    monkeypatch.setattr(_kernels, "_parked", collections.deque(maxlen=_kernels.PARKED))
    raw = np.empty((1 << 20) + 64, np.uint8)
    start = -raw.ctypes.data % 32

    def chunk(offset: int, nbytes: int = 1 << 18) -> Any:
        return raw[start + offset : start + offset + nbytes].view(np.float32)

    def empty(answers: list[Any]) -> Callable[..., Any]:
        return lambda shape, dtype: answers.pop(0)

    f32 = np.dtype(np.float32)
    aligned, off = chunk(0), [chunk(16) for _ in range(6)]
    n = (1 << 18) // 4
    assert aligned_fresh((n,), f32, empty([off[0], aligned])) is aligned
    assert list(_kernels._parked) == []  # (not asked to park)
    assert aligned_fresh((n,), f32, empty([off[0], off[1], aligned]), park=True) is aligned
    assert [id(x) for x in _kernels._parked] == [id(off[0]), id(off[1])]
    assert parked() == 2 << 18
    assert aligned_fresh((n,), f32, empty(off[2:6]), park=True) is off[2]  # none aligned: the first
    assert [id(x) for x in _kernels._parked] == [id(x) for x in off[3:6]]  # the last PARKED
    big = [chunk(16, _kernels.PARK_MAX_BYTES + 32) for _ in range(2)]
    assert aligned_fresh((big[0].size,), f32, empty([big[0], big[1][: big[0].size]]), tries=2, park=True) is big[0]
    assert [id(x) for x in _kernels._parked] == [id(x) for x in off[3:6]]  # (too large to keep)
    assert _kernels.PARKED * _kernels.PARK_MAX_BYTES <= 2 << 20


@pytest.mark.parametrize("order", ["C", "F"])
def test_numeric_array_copies_large_arrays_as_numpy_does(order: Literal["C", "F"]) -> None:
    # The aligned copy of a large C-ordered array: numpy's copy, values, dtype and order;
    # a Fortran-ordered one (or a cast) is numpy's own copy, in its order.
    value = np.asarray(np.arange(ALIGN_FROM // 4 * 2, dtype=np.float32).reshape(256, -1), order=order)
    for dtype in (None, np.dtype(np.float32), np.dtype(np.float64), np.dtype(">f4")):
        got = numeric_array(value, dtype)
        want = np.array(value, dtype=dtype)
        assert got.dtype == want.dtype
        assert got.strides == want.strides
        assert got.base is None
        assert not np.shares_memory(got, value)
        np.testing.assert_array_equal(got, want)
    small = np.ones(10, np.float32)
    assert numeric_array(small, None).base is None


async def test_a_large_constant_is_copied_into_an_aligned_fresh_buffer(
    session: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 256 KiB constant's buffer is the array aligned_fresh made (malloc's heap chunks:
    # the first 32-byte-aligned one; mmapped chunks, before glibc's threshold has grown,
    # are all 16 bytes off, so the test does not ask malloc for an address).
    made: list[Any] = []

    def spy(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        out = aligned_fresh(shape, dtype)
        made.append(out)
        return out

    monkeypatch.setattr(_kernels, "aligned_fresh", spy)
    value = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    t = await session.constant(value)
    assert len(made) == 1
    assert t._registry._buffers[t._rid][0] is made[0]
    np.testing.assert_array_equal(await t.numpy(), value)
    small = await session.constant(np.ones(16, np.float32))  # (under ALIGN_FROM: numpy's copy)
    assert len(made) == 1
    del t, small
