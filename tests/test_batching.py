"""Micro-batching (``at.batched``): every bullet of issue 12's contract, checked against numpy.

Every async test runs on asyncio and uvloop (conftest); tests where ownership matters
also run under the three cleanup strategies.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import numpy as np
import pytest

import aiotensor as at

from .conftest import settle

IN, HIDDEN, OUT = 8, 32, 4
RNG = np.random.default_rng(12)
W1 = RNG.standard_normal((IN, HIDDEN)).astype(np.float32)
B1 = RNG.standard_normal(HIDDEN).astype(np.float32)
W2 = RNG.standard_normal((HIDDEN, OUT)).astype(np.float32)
B2 = RNG.standard_normal(OUT).astype(np.float32)


def mlp(ops: at.FusedOps, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    return ops.softmax(ops.relu(x @ w1 + b1) @ w2 + b2, axis=-1)


def mlp_np(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    logits = np.maximum(x @ W1 + B1, 0) @ W2 + B2
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


def rows(n: int, seed: int = 0, width: int = IN) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


async def weights(s: at.AsyncEagerSession) -> list[at.Tensor]:
    return [await s.constant(a) for a in (W1, B1, W2, B2)]


async def held(s: at.AsyncEagerSession) -> int:
    """Buffers of ``s`` that a handle still holds (dropped ones may wait for the strategy)."""
    await asyncio.sleep(0)  # the loop drops its reference to the last callback's arguments (gather's result)
    gc.collect()
    if s.cleanup is at.ResourceCleanupStrategy.IN_BACKGROUND:
        await settle(s)
    stats = s.stats()
    return stats.live_tensors - stats.pending


def close(y: Any, x: np.ndarray[Any, Any]) -> None:
    np.testing.assert_allclose(np.asarray(y), mlp_np(x), rtol=1e-5, atol=1e-6)


# -- the decorator ------------------------------------------------------------------------------
def test_bare_and_with_options() -> None:
    bare = at.batched(mlp)
    assert isinstance(bare, at.BatchedFunction)
    assert bare.__name__ == "mlp"
    assert bare.max_batch_size == 512

    @at.batched(max_batch_size=64, row_shape=(IN,), dtype="float32")
    def small(ops: at.FusedOps, x: Any) -> Any:
        return x * 2.0

    assert isinstance(small, at.BatchedFunction)
    assert small.max_batch_size == 64
    assert small.__name__ == "small"
    assert small.stats() == at.BatchStats()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": True}, "max_batch_size"),
        ({"max_batch_size": 2.0}, "max_batch_size"),
        ({"row_shape": ("a",)}, "row_shape"),
        ({"dtype": "no such dtype"}, "dtype"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(at.InvalidArgumentError, match=message):
        at.batched(**options)(mlp)


def test_fn_must_be_callable() -> None:
    with pytest.raises(at.InvalidArgumentError, match="callable"):
        at.batched(42)  # type: ignore[call-overload]


# -- coalescing ---------------------------------------------------------------------------------
async def test_concurrent_calls_share_one_kernel_call_and_each_gets_its_rows(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        w = await weights(s)
        f = at.batched(mlp)
        xs = [rows(n, seed=n) for n in (1, 3, 16, 7, 2)]
        ys = await asyncio.gather(*[f(x, *w) for x in xs])
        for x, y in zip(xs, ys, strict=True):
            assert isinstance(y, at.Tensor)
            assert y.session is s
            assert y.shape == (len(x), OUT)
            close(y, x)
        stats = f.stats()
        assert (stats.batches, stats.calls, stats.rows, stats.max_rows) == (1, 5, 29, 29)
        assert stats.calls_per_batch == 5.0
        assert stats.rows_per_batch == 29.0
        del ys, y
        assert await held(s) == 4  # the weights: every batch buffer was moved out or freed


async def test_calls_are_coalesced_only_with_the_same_param_objects_and_rows_of_one_kind(
    s: at.AsyncEagerSession,
) -> None:
    w = await weights(s)
    w_again = await weights(s)  # equal values, other objects
    seen: list[tuple[int, ...]] = []

    def recording(ops: at.FusedOps, x: Any, *params: Any) -> Any:
        seen.append(x.shape)
        return mlp(ops, x, *params) if x.shape[1] == IN else x * 1.0

    f = at.batched(recording)
    x = rows(2)
    results = await asyncio.gather(
        f(x, *w), f(x, *w), f(x, *w_again), f(x.astype(np.float64), *w), f(rows(2, width=3), *w)
    )
    assert sorted(seen) == sorted([(4, IN), (2, IN), (2, IN), (2, 3)])
    assert f.stats().batches == 4
    for y in results[:4]:
        close(y, x)
    np.testing.assert_array_equal(np.asarray(results[4]), rows(2, width=3))


async def test_max_batch_size_bounds_the_rows_of_each_kernel_call(s: at.AsyncEagerSession) -> None:
    w = await weights(s)
    seen: list[int] = []

    @at.batched(max_batch_size=10)
    def recording(ops: at.FusedOps, x: Any, *params: Any) -> Any:
        seen.append(x.shape[0])
        return mlp(ops, x, *params)

    xs = [rows(n, seed=i) for i, n in enumerate((4, 4, 4, 10, 1, 13, 2))]
    ys = await asyncio.gather(*[recording(x, *w) for x in xs])
    for x, y in zip(xs, ys, strict=True):
        close(y, x)
    # Packed in arrival order: 4+4 | 4 | 10 | 1 | 13 (alone: more rows than the limit, not split) | 2
    assert seen == [8, 4, 10, 1, 13, 2]
    stats = recording.stats()
    assert (stats.batches, stats.calls, stats.rows, stats.max_rows) == (6, 7, 38, 13)


async def test_a_caller_alone_waits_one_loop_iteration_not_a_timer(s: at.AsyncEagerSession) -> None:
    w = await weights(s)
    f = at.batched(mlp)
    x = rows(3)
    task = asyncio.create_task(f(x, *w))
    await asyncio.sleep(0)  # the call has run up to joining its group
    assert f.stats().batches == 0
    await asyncio.sleep(0)  # one more loop iteration: the batch has started
    assert f.stats().batches == 1
    close(await task, x)


async def test_callers_from_child_sessions_share_a_batch_and_own_their_results(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    async with at.AsyncEagerSession() as app:
        w = await weights(app)
        f = at.batched(mlp)
        children = [at.AsyncEagerSession(parent=app, cleanup=strategy) for _ in range(3)]
        for c in children:
            await c.__aenter__()
        xs = [rows(i + 1, seed=i) for i in range(3)]
        inputs = [await c.constant(x) for c, x in zip(children, xs, strict=True)]
        before = app.stats().live_tensors
        ys = await asyncio.gather(*[f(t, *w) for t in inputs])
        assert f.stats().batches == 1
        for c, x, y in zip(children, xs, ys, strict=True):
            assert isinstance(y, at.Tensor)
            assert y.session is c
            close(await y.numpy(), x)
        assert app.stats().live_tensors == before  # nothing of the batch stayed in the app session
        del ys, inputs
        for c in children:
            await c.aclose()
            assert c.stats().live_tensors == 0


# -- which session owns the result ------------------------------------------------------------
async def test_an_ndarray_x_gives_a_result_in_the_default_session_else_the_params_session() -> None:
    async with at.AsyncEagerSession() as app, at.AsyncEagerSession(parent=app) as request:
        w = await weights(app)
        f = at.batched(mlp)
        x = rows(2)
        y = await f(x, *w)
        assert isinstance(y, at.Tensor)
        assert y.session is app
        with request.as_default():
            z = await f(x, *w)
        assert isinstance(z, at.Tensor)
        assert z.session is request
        close(y, x)
        close(z, x)
        del y, z


async def test_no_session_at_all_and_params_the_result_session_cannot_read() -> None:
    def double(ops: at.FusedOps, x: Any, k: Any) -> Any:
        return x * k

    f = at.batched(double)
    with pytest.raises(at.NoSessionError):
        await f(rows(2), 2.0)
    async with at.AsyncEagerSession() as a, at.AsyncEagerSession() as b:
        k = await a.constant(np.float32(2.0))
        x = await b.constant(rows(2))
        with pytest.raises(at.InvalidArgumentError, match="cannot read"):
            await f(x, k)
        y = await f(await a.constant(rows(2)), k)  # from the params' own session: fine
        np.testing.assert_array_equal(np.asarray(y), rows(2) * 2)
        kb = await b.constant(np.float32(3.0))
        with pytest.raises(at.InvalidArgumentError, match="unrelated sessions"):
            await at.batched(lambda ops, x, p, q: x)(x, k, kb)
        del y
    assert f.stats().batches == 1


async def test_params_without_tensors_coalesce_per_result_session() -> None:
    def scale(ops: at.FusedOps, x: Any, k: Any) -> Any:
        return x * k

    f = at.batched(scale)
    k = np.float32(3.0)
    async with at.AsyncEagerSession() as a, at.AsyncEagerSession() as b:
        xa, xb = await a.constant(rows(2)), await b.constant(rows(3))
        ya, ya2, yb = await asyncio.gather(f(xa, k), f(xa, k), f(xb, k))
        assert (ya.session, ya2.session, yb.session) == (a, a, b)  # type: ignore[union-attr]
        assert f.stats().batches == 2
        np.testing.assert_allclose(np.asarray(yb), rows(3) * 3)
        del ya, ya2, yb


async def test_tuple_outputs_give_each_caller_a_tuple_of_its_rows(s: at.AsyncEagerSession) -> None:
    @at.batched
    def two(ops: at.FusedOps, x: Any, w: Any) -> Any:
        return x @ w, ops.sum(x, axis=1, keepdims=True)

    w = await s.constant(W1)
    xs = [rows(n, seed=n) for n in (2, 5)]
    outs = await asyncio.gather(*[two(x, w) for x in xs])
    for x, out in zip(xs, outs, strict=True):
        assert isinstance(out, tuple)
        a, b = out
        assert a.session is s
        np.testing.assert_allclose(np.asarray(a), x @ W1, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(b), x.sum(axis=1, keepdims=True), rtol=1e-5)
    assert two.stats().batches == 1


async def test_a_lone_caller_whose_x_is_returned_as_is_keeps_its_array(s: at.AsyncEagerSession) -> None:
    f = at.batched(lambda ops, x, k: x)
    x = rows(3)
    k = await s.constant(1.0)
    y = await f(x, k)
    assert x.flags.writeable  # not taken over by the session
    x[0, 0] = 100.0
    assert np.asarray(y)[0, 0] != 100.0
    del y
