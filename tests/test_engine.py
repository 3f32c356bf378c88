"""The engine (the op path): argument resolution, error mapping, and results that arrive after close."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._kernels import BadOutputError, KernelResult, info, kernel_error


async def test_tensors_are_resolved_one_level_deep_and_data_is_left_alone(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1.0, 2.0])
    nested = [[1.0, 2.0], [3.0, 4.0]]
    assert s._engine._seq(nested, "op") is nested  # plain data: not walked, not rebuilt
    resolved = s._engine._seq([t, 3.0], "op")
    assert resolved[0] is s._engine.buffer(t, "op")
    assert resolved[1] == 3.0
    both = await s.concat([t, np.array([5.0])])
    np.testing.assert_array_equal(await both.numpy(), [1.0, 2.0, 5.0])


@pytest.mark.parametrize(
    ("raised", "user_kernel", "expected"),
    [
        (ValueError("bad"), False, at.InvalidArgumentError),
        (TypeError("bad"), False, at.InvalidArgumentError),
        (FloatingPointError("bad"), False, at.InvalidArgumentError),
        (BadOutputError("bad"), True, at.InvalidArgumentError),
        (ValueError("bad"), True, at.KernelError),  # a user's function raising is its own failure
        (RuntimeError("bad"), False, at.KernelError),
        (MemoryError("bad"), True, at.ResourceExhaustedError),
    ],
)
def test_kernel_errors_are_mapped(raised: Exception, user_kernel: bool, expected: type[Exception]) -> None:
    error = kernel_error("matmul", (np.ones((2, 3)), 4), raised, user_kernel)
    assert type(error) is expected
    assert str(error).startswith("matmul(float64[2, 3], 4)")


async def test_a_result_adopted_after_close_is_released_not_registered() -> None:
    s = at.AsyncEagerSession()
    await s.zeros(1)
    await s.close()
    released: list[Any] = []
    s._engine.backend = _Recording(released)
    s._engine._adopt(KernelResult([info(np.ones(2))], False))
    assert len(released) == 1
    assert s.stats().live_tensors == 0


class _Recording(at.LocalBackend):
    def __init__(self, released: list[Any]) -> None:
        super().__init__()
        self._released = released

    def release(self, handle: Any) -> None:
        self._released.append(handle)


async def test_ops_after_a_run_of_inline_ops_still_let_other_tasks_run(s: at.AsyncEagerSession) -> None:
    ran = asyncio.Event()

    async def other() -> None:
        ran.set()

    task = asyncio.create_task(other())
    x = await s.constant([1.0])
    for _ in range(40):  # small ops may run inline; every few of them yield once
        x = await s.add(x, 1.0)
    assert ran.is_set()
    await task
    np.testing.assert_array_equal(await x.numpy(), [41.0])
