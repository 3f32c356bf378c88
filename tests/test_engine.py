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


# -- the lean path of element-wise ops (Engine.op): the same results, errors and accounting as the general one


def _general(**config: Any) -> at.AsyncEagerSession:
    # A memory limit sends every op down the general path.
    return at.AsyncEagerSession(config=at.SessionConfig(memory_limit=1 << 40, **config))


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("add", (np.arange(6.0).reshape(2, 3), np.ones((2, 3)))),
        ("multiply", (np.arange(4, dtype=np.int32), 3)),
        ("divide", (np.arange(4, dtype=np.float32), 2.0)),
        ("add", (np.arange(3.0), np.ones((2, 3)))),  # shapes differ: broadcasting
        ("add", (np.float64(2.0), np.float64(3.0))),  # 0-d: numpy gives a scalar
        ("exp", (np.linspace(0, 1, 5, dtype=np.float32),)),
        ("where", (np.array([True, False]), np.ones(2), np.zeros(2))),
        ("maximum", (np.arange(3), 1.5)),
    ],
)
async def test_lean_and_general_paths_agree(
    strategy: at.ResourceCleanupStrategy, op: str, args: tuple[Any, ...]
) -> None:
    results = []
    for make in (lambda: at.AsyncEagerSession(cleanup=strategy), _general):
        async with make() as s:
            assert s._engine._lean is (make is not _general)
            tensors = [await s.constant(a) if isinstance(a, np.ndarray | np.generic) else a for a in args]
            before = s.stats()
            t = await getattr(s, op)(*tensors, name="r")
            after = s.stats()
            assert t.name == "r"
            assert (after.live_tensors, after.allocated) == (before.live_tensors + 1, before.allocated + 1)
            assert after.live_bytes == before.live_bytes + t.nbytes
            results.append(await t.numpy())
            del t
    expected = getattr(np, op)(*args) if op != "where" else np.where(*args)
    for got in results:
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.asarray(expected).dtype


async def test_lean_path_errors_are_the_ops_own(s: at.AsyncEagerSession) -> None:
    i = await s.constant(np.arange(3))
    with pytest.raises(at.InvalidArgumentError, match="pow"):
        await s.pow(i, -1)  # numpy refuses integers to negative powers
    with pytest.raises(at.InvalidArgumentError, match="add"):
        await s.add(i, await s.constant(np.ones(4)))  # shapes that do not broadcast
    async with at.AsyncEagerSession() as other:
        foreign = await other.constant(np.arange(3))
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await s.add(i, foreign)
    assert s.stats().allocated == 2  # i and the ones(4): the failed ops allocated nothing


async def test_lean_path_respects_device_blocks_and_names(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(2))
    with pytest.raises(at.InvalidArgumentError, match="name must be a str"):
        await s.add(a, a, name=3)  # type: ignore[arg-type]
    with pytest.raises(at.InvalidDeviceError), s.device("/gpu:7"):
        await s.add(a, a)
    t = await s.add(a, a)
    assert t.device == "/cpu:0"
