"""Kernel output normalization: owned, read-only, numeric buffers."""

from __future__ import annotations

import numpy as np
import pytest

import aiotensor as at
from aiotensor._kernels import BadOutputError, finalize, kernel_error, run_kernel


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
