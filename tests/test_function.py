"""Fused functions: one dispatch for a whole function of ops, checked against numpy and the accounting."""

from __future__ import annotations

import gc
import threading
import warnings
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from ._results import one


def chain(ops: at.FusedOps, x: Any, w: Any) -> Any:
    y = x @ w
    for _ in range(5):
        y = ops.add(y, 1.0) * 2.0
    return ops.relu(y - 30.0)


def chain_np(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any]) -> Any:
    y = x @ w
    for _ in range(5):
        y = (y + 1.0) * 2.0
    return np.maximum(y - 30.0, 0)


async def test_fused_function_matches_numpy(session: at.AsyncEagerSession) -> None:
    xv = np.random.default_rng(0).standard_normal((4, 3))
    wv = np.random.default_rng(1).standard_normal((3, 5))
    x, w = await session.constant(xv), await session.constant(wv)
    y = await session.function(chain)(x, w)
    assert isinstance(y, at.Tensor)
    assert y.session is session
    np.testing.assert_allclose(await y.numpy(), chain_np(xv, wv))
    del x, w, y


async def test_module_level_decorator_finds_the_session_and_returns_tuples(s: at.AsyncEagerSession) -> None:
    @at.function
    def stats(ops: at.FusedOps, x: Any) -> tuple[Any, Any]:
        return ops.mean(x), ops.std(x, correction=1)

    data = np.arange(10.0)
    mean, std = await stats(await s.constant(data))
    assert mean.session is s
    np.testing.assert_allclose(await mean.numpy(), data.mean())
    np.testing.assert_allclose(await std.numpy(), data.std(ddof=1))
    assert stats.__name__ == "stats"


async def test_intermediates_are_counted_and_freed(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        x = await s.zeros(1000)  # 8000 bytes
        before = s.stats()

        def f(ops: at.FusedOps, x: Any) -> Any:
            a = ops.add(x, 1.0)
            b = ops.add(a, 1.0)
            c = ops.add(b, 1.0)  # a is still referenced: 3 intermediates live at once
            return ops.add(c, a)

        y = await s.function(f)(x)
        assert isinstance(y, at.Tensor)
        after = s.stats()
        assert after.allocated - before.allocated == 4  # a, b, c and the result
        assert after.freed - before.freed == 3  # a, b, c: freed inside the run
        assert after.live_tensors == before.live_tensors + 1
        assert after.live_bytes == before.live_bytes + 8000
        assert after.peak_bytes >= before.live_bytes + 4 * 8000  # x + a, b, c, result
        np.testing.assert_array_equal(await y.numpy(), np.full(1000, 4.0))
    assert s.stats().live_bytes == 0


async def test_operators_inside(s: at.AsyncEagerSession) -> None:
    def f(ops: at.FusedOps, x: Any) -> Any:
        y = (2.0 - x) * 3.0 / 2.0 + 1.0
        y = abs(-y) ** 2 // 3 % 5 + 2**x + 7 // (x + 1) + 7 % (x + 1)
        return y[1:], np.asarray(y).flags.writeable

    xv = np.array([0.0, 1.0, 2.0])
    yv = (2.0 - xv) * 3.0 / 2.0 + 1.0
    yv = abs(-yv) ** 2 // 3 % 5 + 2**xv + 7 // (xv + 1) + 7 % (xv + 1)
    y, writeable = await s.function(f)(await s.constant(xv))
    np.testing.assert_allclose(await y.numpy(), yv[1:])
    assert not await writeable.numpy()  # np.asarray of a value inside is a read-only view


async def test_returning_an_argument_gives_a_copy(s: at.AsyncEagerSession) -> None:
    x = await s.constant([1.0, 2.0])
    y = await s.function(lambda ops, x: x)(x)
    assert isinstance(y, at.Tensor)
    assert s._engine.buffer(y, "t") is not s._engine.buffer(x, "t")
    np.testing.assert_array_equal(await y.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "pool"])
async def test_returning_a_numpy_argument_leaves_the_callers_array_alone(s: at.AsyncEagerSession, inline: bool) -> None:
    # The session must not take the caller's array over (and make it read-only): the
    # tensor gets a copy, and later writes to the array do not reach it.
    f = s.function(lambda ops, x: x)
    a = np.array([1.0, 2.0])
    if inline:
        await f(a)  # the first call of a shape runs on the pool; later ones inline
    y = await f(a)
    assert a.flags.writeable
    a[0] = 5.0
    np.testing.assert_array_equal(await y.numpy(), [1.0, 2.0])  # type: ignore[union-attr]
    assert not np.shares_memory(s._engine.buffer(y, "t"), a)  # type: ignore[arg-type]


async def test_it_runs_on_one_pool_worker(s: at.AsyncEagerSession) -> None:
    threads: list[str] = []

    def record(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        threads.append(threading.current_thread().name)
        return x + 1

    def f(ops: at.FusedOps, x: Any) -> Any:
        return ops.apply(record, ops.apply(record, x))

    y = await s.function(f)(await s.constant([0.0]))
    np.testing.assert_array_equal(await y.numpy(), [2.0])  # type: ignore[union-attr]
    assert len(threads) == 2
    assert len(set(threads)) == 1
    assert threads[0].startswith("aiotensor")


async def test_captured_tensors_and_numpy_arguments(s: at.AsyncEagerSession) -> None:
    w = await s.constant(np.eye(2) * 3)

    def f(ops: at.FusedOps, x: Any) -> Any:
        assert isinstance(x, at.FusedValue)
        assert x.shape == (2,)
        return ops.matmul(x, w)

    y = await s.function(f)(np.array([1.0, 2.0]))
    np.testing.assert_array_equal(await y.numpy(), [3.0, 6.0])  # type: ignore[union-attr]


async def test_errors_inside(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.ones((2, 3)))
    stats = s.stats()
    with pytest.raises(at.InvalidArgumentError, match="matmul"):
        await s.function(lambda ops, x: ops.matmul(ops.add(x, 1.0), x))(x)

    def boom(ops: at.FusedOps, x: Any) -> Any:
        raise KeyError("mine")

    with pytest.raises(at.KernelError) as info:
        await s.function(boom)(x)
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(at.KernelError, match="no op 'not_an_op'") as info:
        await s.function(lambda ops, x: ops.not_an_op(x))(x)
    assert isinstance(info.value.__cause__, AttributeError)
    with pytest.raises(at.InvalidArgumentError, match="callable"):
        at.function(42)  # type: ignore[arg-type]
    after = s.stats()
    assert after.live_tensors == stats.live_tensors
    assert after.allocated - after.freed == stats.allocated - stats.freed


async def test_an_unknown_op_names_itself_and_other_attribute_errors_pass_as_they_are(
    s: at.AsyncEagerSession,
) -> None:
    # FusedOps has no __getattr__ (it would slow every attribute read of ops): the
    # "no op" message is made where the function is called, from the AttributeError.
    x = await s.constant(np.ones(3))

    def unknown(ops: at.FusedOps, x: Any) -> Any:
        return ops.not_an_op(x)

    with pytest.raises(at.KernelError, match="no op 'not_an_op'") as info:
        await s.function(unknown)(x)
    cause = info.value.__cause__
    assert isinstance(cause, AttributeError)
    assert cause.name == "not_an_op"
    assert cause.__suppress_context__  # the generic message does not follow it
    frames = [tb.tb_frame.f_code.co_name for tb in _walk(cause.__traceback__)]
    assert "unknown" in frames  # the traceback still reaches the line that asked

    def other(ops: at.FusedOps, x: Any) -> Any:
        return x.not_a_method()

    with pytest.raises(at.KernelError, match="'FusedValue' object has no attribute 'not_a_method'") as info:
        await s.function(other)(x)
    assert isinstance(info.value.__cause__, AttributeError)
    assert not hasattr(at.FusedOps, "__getattr__")


def _walk(tb: Any) -> Any:
    while tb is not None:
        yield tb
        tb = tb.tb_next


async def test_memory_limit_applies_to_intermediates() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=100_000)) as s:
        x = await s.zeros(5000)  # 40 kB of the 100 kB

        def f(ops: at.FusedOps, x: Any) -> Any:
            a = ops.add(x, 1.0)
            return ops.add(a, x)  # a and the result: 80 kB > the 60 kB left

        with pytest.raises(at.ResourceExhaustedError, match="fused function"):
            await s.function(f)(x)
        assert s.stats().live_bytes == 40_000
        y = await s.function(lambda ops, x: ops.add(x, 2.0))(x)
        np.testing.assert_array_equal(await y.numpy(), np.full(5000, 2.0))  # type: ignore[union-attr]


class RemoteLike(at.Backend):
    """A backend that is not local (as Dask's): fused functions refuse it."""

    def __init__(self) -> None:
        self.local = at.LocalBackend()

    def devices(self) -> list[str]:
        return self.local.devices()

    def submit(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *, device: str, blas: bool = False
    ) -> at.PendingKernel:
        return self.local.submit(fn, args, kwargs, device=device, blas=blas)

    async def fetch(self, handles: Any) -> list[np.ndarray[Any, Any]]:
        return await self.local.fetch(handles)

    def peek(self, handle: Any) -> np.ndarray[Any, Any] | None:
        return None

    def release(self, handle: Any) -> None:
        pass


async def test_fused_functions_run_as_one_kernel_on_a_backend_out_of_process() -> None:
    # (Dask: tests/test_distributed.py.) The call is one kernel of the backend, the
    # function given its input buffers; a tensor it captures cannot go with it.
    async with at.AsyncEagerSession(backend=RemoteLike()) as s:
        x = await s.constant([1.0, -2.0])
        y = one(await s.function(lambda ops, x: ops.relu(x * 2.0) + 1.0)(x))
        np.testing.assert_array_equal(await y.numpy(), [3.0, 1.0])
        with pytest.raises(at.InvalidArgumentError, match=r"tensor 'constant:\d+' is not an argument of the call"):
            await s.function(lambda ops, a: a + x)(y)
        z = await s.add(x, 1.0)  # ordinary ops still work (on the pool: never inline there)
        np.testing.assert_array_equal(await z.numpy(), [2.0, -1.0])


async def test_cheap_fused_calls_run_inline_after_the_first_and_slow_ones_go_back_to_the_pool() -> None:
    import threading as _threading
    import time as _time

    threads: list[str] = []

    def cheap(ops: at.FusedOps, x: Any) -> Any:
        threads.append(_threading.current_thread().name)
        return ops.add(x, 1.0) * 2.0

    def busy(ops: at.FusedOps, x: Any) -> Any:  # work of its own that the cost model cannot see
        threads.append(_threading.current_thread().name)
        _time.sleep(0.001)
        return ops.add(x, 1.0)

    loop_thread = _threading.current_thread().name
    async with at.AsyncEagerSession() as s:
        x = await s.constant(np.ones(16))
        f = s.function(cheap)
        for _ in range(3):
            np.testing.assert_array_equal(await one(await f(x)).numpy(), np.full(16, 4.0))
        assert threads[0] != loop_thread  # first call for these shapes: on the pool
        assert threads[1:] == [loop_thread, loop_thread]  # then inline: the model says cheap
        threads.clear()
        g = s.function(busy)
        for _ in range(5):
            await g(x)
        assert threads[1:3] == [loop_thread, loop_thread]  # inline until it proved slow twice
        assert all(t != loop_thread for t in threads[3:])  # then back on the pool for good
        del x


async def test_a_function_sent_to_the_pool_tries_inline_again_and_stays_if_fast() -> None:
    import threading as _threading
    import time as _time

    from aiotensor._programs._placement import RETRY_INLINE_EVERY

    threads: list[str] = []
    slow = {"now": False}

    def f(ops: at.FusedOps, x: Any) -> Any:
        threads.append(_threading.current_thread().name)
        if slow["now"]:
            _time.sleep(0.001)  # slow for a while (as under contention), then fast again
        return ops.add(x, 1.0)

    loop_thread = _threading.current_thread().name
    async with at.AsyncEagerSession() as s:
        x = await s.constant(np.ones(16))
        g = s.function(f)
        await g(x)  # measured on the pool
        slow["now"] = True
        await g(x)
        await g(x)  # two slow inline runs: sent to the pool
        assert threads[1:3] == [loop_thread, loop_thread]
        for _ in range(RETRY_INLINE_EVERY - 1):
            await g(x)
        assert all(t != loop_thread for t in threads[3:])  # on the pool until the retry
        await g(x)  # the retry: inline, still slow, so back to the pool
        assert threads[-1] == loop_thread
        slow["now"] = False
        threads.clear()
        for _ in range(RETRY_INLINE_EVERY):
            await g(x)
        assert threads[-1] == loop_thread  # the next retry: fast, so inline from now on
        assert all(t != loop_thread for t in threads[:-1])
        threads.clear()
        for _ in range(3):
            y = await g(x)
        assert threads == [loop_thread] * 3
        np.testing.assert_array_equal(await y.numpy(), np.full(16, 2.0))  # type: ignore[union-attr]
        del x, y


async def test_later_calls_behave_as_the_first(strategy: at.ResourceCleanupStrategy) -> None:
    # The first call for given shapes is measured (every op estimated); later ones take
    # the ops' hot path: same values, same accounting, same errors, call after call.
    def f(ops: at.FusedOps, x: Any, w: Any) -> Any:
        a = ops.relu(x @ w)  # a is still referenced below: intermediates live at once
        b = -(2.0 - a) * 3.0 + a / 2.0
        c = ops.exp(ops.multiply(b, 0.1)) + abs(b) ** 2 // 3 % 5
        return ops.add(c, a)

    def f_np(x: np.ndarray[Any, Any], w: np.ndarray[Any, Any]) -> Any:
        a = np.maximum(x @ w, 0)
        b = -(2.0 - a) * 3.0 + a / 2.0
        return np.exp(b * 0.1) + abs(b) ** 2 // 3 % 5 + a

    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((4, 3)), rng.standard_normal((3, 5))
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        x, w, bad = await s.constant(xv), await s.constant(wv), await s.constant(np.ones((2, 2)))
        fused = s.function(f)
        for _ in range(4):
            before = s.stats()
            y = await fused(x, w)
            after = s.stats()
            np.testing.assert_allclose(await y.numpy(), f_np(xv, wv))  # type: ignore[union-attr]
            # Only the result is registered (the call may free the previous one, pending).
            collected = before.pending - after.pending
            assert after.live_tensors == before.live_tensors + 1 - collected
            assert after.allocated - before.allocated == after.freed - before.freed + 1 - collected
            assert after.allocated - before.allocated > 5  # the intermediates are counted
            assert after.peak_bytes >= before.live_bytes + 4 * 5 * 8 * 3  # some held at once
            with pytest.raises(at.InvalidArgumentError, match=r"matmul\(float64\[4, 3\], float64\[2, 2\]\)"):
                await fused(x, bad)
            assert s.stats().live_tensors == after.live_tensors
            del y


async def test_later_calls_keep_the_memory_limit() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=100_000)) as s:
        x = await s.zeros(2000)  # 16 kB of the 100 kB

        def f(ops: at.FusedOps, x: Any, n: int) -> Any:
            values = [x + float(i) for i in range(n)]  # all held at once: n x 16 kB
            return values[-1] * 2.0

        fused = s.function(f)
        # A number has no shape: both calls have the key of the first, measured, call
        # and the later ones take the hot path. 2 x 16 kB fits; 6 x 16 kB next to x does not.
        for _ in range(3):
            y = await fused(x, 2)
            np.testing.assert_array_equal(await y.numpy(), np.full(2000, 2.0))  # type: ignore[union-attr]
            del y
            with pytest.raises(at.ResourceExhaustedError, match="add inside a fused function"):
                await fused(x, 6)
            assert s.stats().live_bytes == 16_000


async def test_a_view_keeps_the_value_it_views_counted_against_the_memory_limit() -> None:
    def viewed(ops: at.FusedOps, x: Any) -> Any:
        v = (x * 2.0)[:]  # the product is reachable only through the view from here on
        return v + 1.0

    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=20_000)) as s:
        x = await s.constant(np.ones(1000))  # 8000 bytes; 12000 left
        with pytest.raises(at.ResourceExhaustedError, match="16000 bytes of intermediates"):
            await s.function(viewed)(x)
        assert s.stats().live_bytes == 8000
    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=40_000)) as s:
        x = await s.constant(np.ones(1000))
        y = await s.function(viewed)(x)
        np.testing.assert_array_equal(await y.numpy(), np.full(1000, 3.0))  # type: ignore[union-attr]
        assert s.stats().peak_bytes == 3 * 8000  # x, the viewed product and the sum at once


async def test_fused_values_compare_element_wise_as_tensors_do(s: at.AsyncEagerSession) -> None:
    def masked(ops: at.FusedOps, x: Any) -> Any:
        keep = ops.logical_and(x > 0.0, x != 2.0)
        return ops.where(keep, x, 0.0), x == 2.0, +x, x.mT, x.size

    v = np.array([[-1.0, 2.0], [3.0, 0.5]])
    f = s.function(masked)
    kept, eq, pos, mt, size = await f(await s.constant(v))
    np.testing.assert_array_equal(await kept.numpy(), np.where((v > 0) & (v != 2), v, 0.0))
    np.testing.assert_array_equal(await eq.numpy(), v == 2.0)
    np.testing.assert_array_equal(await pos.numpy(), v)
    np.testing.assert_array_equal(await mt.numpy(), v.T)
    assert int(size) == 4  # returned as a tensor: its value converts without an await


async def test_a_fused_function_never_takes_over_an_array_its_author_holds(s: at.AsyncEagerSession) -> None:
    # Issue 27 (7): as apply and batched, a closure's array is copied, not owned.
    held = np.ones(3)
    f = s.function(lambda ops, a: held)
    g = s.function(lambda ops, a: (held, a + 1.0))
    x = await s.constant(np.zeros(3))
    t = one(await f(x))
    u, _ = await g(x)
    assert held.flags.writeable  # the user's array is still theirs
    held[0] = 7.0
    np.testing.assert_array_equal(await t.numpy(), np.ones(3))
    np.testing.assert_array_equal(await u.numpy(), np.ones(3))
    fresh = s.function(lambda ops, a: np.full(3, 2.0))
    np.testing.assert_array_equal(await one(await fresh(x)).numpy(), np.full(3, 2.0))


async def test_every_op_alias_is_an_op_of_fused_functions(s: at.AsyncEagerSession) -> None:
    # Issue 27 (12): ops.asarray, as s.asarray and at.asarray.
    f = s.function(lambda ops, a: ops.asarray([1.0, 2.0]) + a[:2])
    g = s.function(lambda ops, a: ops.asarray(a, dtype="float32"))
    x = await s.constant(np.arange(3.0))
    np.testing.assert_array_equal(await one(await f(x)).numpy(), [1.0, 3.0])
    got = await one(await g(x)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.arange(3.0, dtype=np.float32))


async def test_an_expression_argument_is_evaluated_in_the_call_session(s: at.AsyncEagerSession) -> None:
    # Issue 27 (also): was "kernel returned Expr" and a spurious never-evaluated warning.
    x = await s.constant(np.arange(3.0))
    f = s.function(lambda ops, a, b: a + b)
    g = at.function(lambda ops, a, b: a * b[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(await one(await f(x * 2.0, x)).numpy(), np.arange(3.0) * 3.0)
        np.testing.assert_array_equal(
            await one(await g(x + 1.0, [x * 2.0])).numpy(), (np.arange(3.0) + 1) * np.arange(3.0) * 2
        )
        gc.collect()
