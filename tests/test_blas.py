"""BLAS coordination: products on the pool pass the gate; set_blas_threads sizes it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends import _blas
from aiotensor.testing import RecordingBackend

CORES = os.cpu_count() or 1


@pytest.fixture
def restore_blas() -> Iterator[None]:
    yield
    at.set_blas_threads(None)


async def test_products_on_the_pool_pass_the_gate_and_small_ones_run_inline() -> None:
    backend = RecordingBackend()
    async with at.AsyncEagerSession(backend=backend) as s:
        small = await s.constant(np.eye(4))
        await s.matmul(small, small)
        assert backend.submitted == []  # 4x4: inline
        big = np.ones((256, 256))
        b = await s.constant(big)
        y = await s.matmul(b, b)
        np.testing.assert_array_equal(await y.numpy(), big @ big)
    assert backend.submitted[-1].blas is True  # the engine tells the backend; the local backend gates it


async def test_local_backend_runs_blas_kernels_inside_the_gate() -> None:
    seen: list[int] = []

    def kernel() -> Any:
        gate = _blas._gate
        assert gate is not None
        seen.append(gate._value)  # free slots while this kernel runs
        return np.zeros(1)

    _blas.gate_slots()
    slots = _blas.gate_slots()
    await at.LocalBackend().submit(kernel, (), {}, device="/cpu:0", blas=True)
    await at.LocalBackend().submit(kernel, (), {}, device="/cpu:0", blas=False)
    assert seen == [slots - 1, slots]


@pytest.mark.usefixtures("restore_blas")
def test_set_blas_threads_sizes_the_gate() -> None:
    pytest.importorskip("threadpoolctl")
    at.set_blas_threads(1)
    assert at.blas_threads() == 1
    assert _blas.gate_slots() == CORES  # one single-threaded product per core
    at.set_blas_threads(None)
    threads = at.blas_threads()
    assert threads is not None
    assert _blas.gate_slots() == max(1, CORES // threads)


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_set_blas_threads_rejects_bad_counts(bad: Any) -> None:
    with pytest.raises(at.InvalidArgumentError, match="threads"):
        at.set_blas_threads(bad)


def test_without_threadpoolctl_the_count_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_blas, "_threadpoolctl", lambda: None)
    assert at.blas_threads() is None
    with pytest.raises(at.InvalidArgumentError, match="threadpoolctl"):
        at.set_blas_threads(2)


def test_the_gate_passes_results_and_errors_through() -> None:
    assert _blas.Gated(np.add)(1, 2) == 3
    with pytest.raises(ValueError, match="mismatch"):
        _blas.Gated(np.matmul)(np.ones((2, 3)), np.ones((2, 3)))
