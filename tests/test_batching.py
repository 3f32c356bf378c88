"""Micro-batching (``at.batched``): every bullet of issue 12's contract, checked against numpy.

Every async test runs on asyncio and uvloop (conftest); tests where ownership matters
also run under the three cleanup strategies.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _loopload

from ._results import one
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


def _held_mlp(started: threading.Event, release: threading.Event) -> Any:
    """The MLP as a batched fn that says it started, then waits to be released (a kernel in flight)."""

    def slow(ops: at.FusedOps, x: Any, *params: Any) -> Any:
        started.set()
        release.wait(10)
        return mlp(ops, x, *params)

    return slow


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
    assert bare.max_concurrent_batches is None
    assert at.batched(max_concurrent_batches=2)(mlp).max_concurrent_batches == 2

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
        ({"max_concurrent_batches": 0}, "max_concurrent_batches"),
        ({"max_concurrent_batches": 1.5}, "max_concurrent_batches"),
        ({"max_concurrent_batches": False}, "max_concurrent_batches"),
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


async def test_max_batch_size_bounds_the_rows_of_each_kernel_call() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=1)) as s:  # in order: see ONE WORKER below
        await _max_batch_size_bounds_the_rows_of_each_kernel_call(s)


# ONE WORKER: why the two tests that record the order of batches run on a pool of one worker: with
# two workers, two batches may run at once and either may record first (a worker takes
# the next queued batch, then publishes the one it finished, while the other worker
# starts the batch after it); with one, the batches run in the order they were packed
# and submitted, which is what the tests check.
async def _max_batch_size_bounds_the_rows_of_each_kernel_call(s: at.AsyncEagerSession) -> None:
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


POOL_ONLY = at.SessionConfig(inline_threshold_us=0, max_workers=2)  # every kernel on a pool of two


@pytest.mark.parametrize("limit", [1, None])
async def test_max_concurrent_batches_runs_batches_in_turn(limit: int | None) -> None:
    # Kernels of one function never overlap with max_concurrent_batches=1 (they run on
    # two pool threads: counted under a lock); without a limit they do (the check that
    # the count can see overlap). Every caller gets its own rows, and a caller cancelled
    # while its batch waits for its turn leaves the others unaffected.
    lock = threading.Lock()
    running = [0, 0]  # now, most at once

    def slow(ops: at.FusedOps, x: Any) -> Any:
        with lock:
            running[0] += 1
            running[1] = max(running)
        try:
            threading.Event().wait(0.01)  # long enough for overlapping kernels to meet
            return x * 2.0
        finally:
            with lock:
                running[0] -= 1

    f = at.batched(max_batch_size=4, max_concurrent_batches=limit)(slow)
    async with at.AsyncEagerSession(config=POOL_ONLY) as s:
        await f(await s.constant(rows(4)))  # learns that fn on 4 rows calls no BLAS: no BLAS gate for them
        xs = [await s.constant(rows(2, seed=i)) for i in range(12)]
        tasks = [asyncio.create_task(f(x)) for x in xs]
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # the group has closed: 6 batches
        tasks[-1].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[-1], asyncio.CancelledError)
        for x, y in zip(xs[:-1], done[:-1], strict=True):
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2.0)
        assert running[0] == 0
        assert running[1] == (1 if limit == 1 else 2)
        assert f.stats().batches == 7
        del done, tasks, y, xs, x
        assert await held(s) == 0  # the results are dropped, nothing of the cancelled caller stays


async def test_without_a_limit_batches_may_run_at_once() -> None:
    both = threading.Barrier(2, timeout=10)  # passes only if two kernels run at once (on the pool, not inline)
    meeting = False

    @at.batched(max_batch_size=2)
    def meet(ops: at.FusedOps, x: Any) -> Any:
        if meeting:
            both.wait()
        return x * 2.0

    async with at.AsyncEagerSession(config=POOL_ONLY) as s:
        # A first call learns that fn calls no BLAS (until then its kernels hold a slot of the BLAS gate).
        await meet(await s.constant(rows(2)))
        meeting = True
        xs = [await s.constant(rows(2, seed=i)) for i in range(2)]
        for x, y in zip(xs, await asyncio.gather(*[meet(x) for x in xs]), strict=True):
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x) * 2.0)


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


async def test_on_asyncio_a_caller_alone_with_nothing_else_ready_skips_the_loop_iteration(
    s: at.AsyncEagerSession,
) -> None:
    # Nothing could join it (whatever the next iteration brings is queued behind it), so
    # on asyncio's own loop its batch of one runs at once: a cheap kernel, inline, never
    # suspends. uvloop shows no queue to read: its caller waits the iteration.
    w = await weights(s)
    f = at.batched(mlp)
    for seed in range(3):  # the first batch of a shape runs on the pool (measured), then inline
        close(await f(rows(2, seed=seed), *w), rows(2, seed=seed))
    for _ in range(3):  # the cleanup task frees the results dropped above: then nothing is ready
        await asyncio.sleep(0)
    # ... but bookkeeping that calls nobody: the end of the busy-loop sensor's turn (queued
    # while the loop is saturated)
    turn: list[object] = [None]
    asyncio.get_running_loop().call_soon(_loopload.sensor()._end_turn, turn)
    x = rows(2, seed=9)
    call = f(x, *w)
    try:
        suspended = call.send(None)
    except StopIteration as done:
        close(done.value, x)
        assert type(asyncio.get_running_loop()) is asyncio.SelectorEventLoop
        assert f.stats().batches == 4
    else:
        assert suspended is None  # the bare yield of the one loop iteration
        assert type(asyncio.get_running_loop()) is not asyncio.SelectorEventLoop
        call.close()
        f._close(f._open)  # type: ignore[arg-type]  # (the group of the call driven by hand, left behind)
    await asyncio.sleep(0)  # (the sensor's callback runs)


async def test_a_caller_alone_whose_loop_has_a_callback_ready_waits_the_iteration(s: at.AsyncEagerSession) -> None:
    w = await weights(s)
    f = at.batched(mlp)
    for seed in range(3):
        close(await f(rows(2, seed=seed), *w), rows(2, seed=seed))
    ran: list[int] = []
    asyncio.get_running_loop().call_soon(ran.append, 1)  # ready: it runs before the batch
    x = rows(2, seed=9)
    y = await f(x, *w)
    assert ran == [1]
    close(y, x)


async def test_calls_without_rows_made_while_a_group_is_open_fail_alone(s: at.AsyncEagerSession) -> None:
    # The same params and dtype as the open group's leader, but no rows: the joining
    # call's shortcut leaves them to the general checks.
    w = await weights(s)
    f = at.batched(mlp)
    x = rows(3)
    lead = asyncio.create_task(f(x, *w))
    await asyncio.sleep(0)  # it leads an open group
    for bad in (np.zeros((0, IN), np.float32), np.zeros((), np.float32)):
        with pytest.raises(at.InvalidArgumentError, match="at least one row"):
            await f(bad, *w)
    close(await lead, x)
    assert (f.stats().calls, f.stats().batches) == (1, 1)


async def test_a_batch_is_submitted_in_the_loop_iteration_after_its_first_call() -> None:
    # As a hand-written batcher's call_soon flush: the first call to join starts the
    # group's task, which submits the kernel as the leader resumes (not one iteration later).
    started, release = threading.Event(), threading.Event()
    slow = _held_mlp(started, release)
    async with at.AsyncEagerSession(config=POOL_ONLY) as s:
        w = await weights(s)
        f = at.batched(slow)
        xs = [rows(2, seed=i) for i in range(3)]
        tasks = [asyncio.create_task(f(x, *w)) for x in xs]
        try:
            await asyncio.sleep(0)  # the three calls have joined one group
            assert s.stats().in_flight == 0
            await asyncio.sleep(0)  # the next iteration: its kernel is on the pool
            assert s.stats().in_flight == 1
            assert f.stats().batches == 1
        finally:
            release.set()
        for x, y in zip(xs, await asyncio.gather(*tasks), strict=True):
            close(y, x)
        assert f.stats().calls_per_batch == 3.0


async def test_a_full_group_closes_at_once_and_the_next_call_leads_another() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=1)) as s:  # in order: see ONE WORKER below
        await _a_full_group_closes_at_once(s)


async def _a_full_group_closes_at_once(s: at.AsyncEagerSession) -> None:
    w = await weights(s)
    seen: list[int] = []

    @at.batched(max_batch_size=4)
    def recording(ops: at.FusedOps, x: Any, *params: Any) -> Any:
        seen.append(x.shape[0])
        return mlp(ops, x, *params)

    xs = [rows(2, seed=i) for i in range(5)]
    ys = await asyncio.gather(*[recording(x, *w) for x in xs])
    for x, y in zip(xs, ys, strict=True):
        close(y, x)
    assert seen == [4, 4, 2]
    stats = recording.stats()
    assert (stats.batches, stats.calls, stats.rows, stats.max_rows) == (3, 5, 10, 4)


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


async def test_child_sessions_rows_are_registered_in_their_sessions_only_never_in_the_batch_session(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    # One batch of callers of the app session and of two child sessions (one with two
    # calls): each result is a tensor of its caller's session, and the app session
    # registers only its own caller's rows (its registered bytes grow by them alone).
    def two(ops: at.FusedOps, x: Any, *w: Any) -> Any:
        return mlp(ops, x, *w), x * 2.0

    async with at.AsyncEagerSession(cleanup=strategy) as app:
        w = await weights(app)
        f = at.batched(two)
        a = at.AsyncEagerSession(parent=app, cleanup=strategy)
        b = at.AsyncEagerSession(parent=app, cleanup=strategy)
        for c in (a, b):
            await c.__aenter__()
        xs = [rows(i + 1, seed=i) for i in range(4)]
        inputs = [await a.constant(xs[0]), xs[1], await b.constant(xs[2]), await b.constant(xs[3])]
        before = app.stats()
        out = await asyncio.gather(*[f(x, *w) for x in inputs])
        assert f.stats().batches == 1
        for (y, twice), owner, x in zip(out, (a, app, b, b), xs, strict=True):
            assert y.session is owner
            assert twice.session is owner
            close(y, x)
            np.testing.assert_allclose(await twice.numpy(), x * 2.0)
        after = app.stats()
        mine = sum(t.nbytes for t in out[1])
        assert after.allocated_bytes - before.allocated_bytes == mine  # the app caller's rows, nobody else's
        assert a.stats().live_tensors == 2 + 1  # its input and its two results
        assert b.stats().live_tensors == 2 * (2 + 1)
        del out, y, twice, inputs
        for c in (a, b):
            await c.aclose()
            assert c.stats().live_tensors == 0
        assert await held(app) == 4


async def test_a_child_session_closed_while_its_batch_runs_raises_session_closed_and_the_others_get_their_rows(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    started, release = threading.Event(), threading.Event()
    slow = _held_mlp(started, release)
    async with at.AsyncEagerSession(cleanup=strategy) as app:
        w = await weights(app)
        f = at.batched(slow)
        gone = at.AsyncEagerSession(parent=app, cleanup=strategy)
        stays = at.AsyncEagerSession(parent=app, cleanup=strategy)
        for c in (gone, stays):
            await c.__aenter__()
        xs = [rows(2, seed=1), rows(3, seed=2)]
        tasks = [asyncio.create_task(f(await c.constant(x), *w)) for c, x in zip((gone, stays), xs, strict=True)]
        await asyncio.to_thread(started.wait, 10)
        await gone.aclose()  # while the batch's kernel runs
        release.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[0], at.SessionClosedError)
        assert "waited for its batch" in str(done[0])
        assert done[1].session is stays  # type: ignore[union-attr]
        close(done[1], xs[1])
        assert gone.stats().live_tensors == 0
        del done, tasks
        await stays.aclose()
        assert await held(app) == 4  # the closed session's rows were not kept in the app session


async def test_calls_joining_with_rows_as_tensors_get_their_results_in_the_tensors_sessions() -> None:
    # The calls after the first join its group on the shortcut; rows given as a tensor
    # make the result the tensor's session's (not the context's default session), and a
    # tensor of a session closed before the call is refused as it is outside a group.
    async with (
        at.AsyncEagerSession() as app,
        at.AsyncEagerSession(parent=app) as request,
        at.AsyncEagerSession(parent=app) as other,
    ):
        w = await weights(app)
        f = at.batched(mlp)
        xs = [rows(2), rows(3, seed=1), rows(1, seed=2)]
        closed = at.AsyncEagerSession(parent=app)
        gone = await closed.constant(rows(2, seed=3))
        await closed.aclose()

        async def call(x: Any) -> Any:
            with request.as_default():
                return await f(x, *w)

        args = [xs[0], await other.constant(xs[1]), gone, await app.constant(xs[2])]
        out = await asyncio.gather(*[call(x) for x in args], return_exceptions=True)
        assert f.stats().batches == 1
        assert isinstance(out[2], at.SessionClosedError)
        for y, owner, x in zip((out[0], out[1], out[3]), (request, other, app), xs, strict=True):
            assert isinstance(y, at.Tensor)
            assert y.session is owner
            close(y, x)
        del out, y, args


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


@pytest.mark.parametrize("source", ["as_default", "interactive"])
async def test_calls_joining_one_group_each_get_their_own_default_session(source: str) -> None:
    # The calls after the first join its group on the shortcut that reads the default
    # session without the general checks: each must still read its own (a context's
    # as_default, else the open interactive session), not the group leader's.
    from aiotensor import _defaults

    async with at.AsyncEagerSession() as app, at.AsyncEagerSession(parent=app) as request:
        w = await weights(app)
        f = at.batched(mlp)
        x = rows(2)

        async def call(own: bool) -> Any:
            if own and source == "as_default":
                with request.as_default():
                    return await f(x, *w)
            return await f(x, *w)

        if source == "interactive":
            # Stands for an open InteractiveSession: the process-wide default of every
            # context that set none (the leader below runs in one that sets app).
            _defaults._interactive.append(request)

            async def leader() -> Any:
                with app.as_default():
                    return await f(x, *w)

            first = leader()
        else:
            first = call(False)
        try:
            ys = await asyncio.gather(first, call(True), call(False), call(True))
        finally:
            _defaults._interactive.clear()
        expected = [app, request, app, request] if source == "as_default" else [app, request, request, request]
        assert [y.session for y in ys] == expected
        assert f.stats().batches == 1
        for y in ys:
            close(y, x)
        del ys


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


# -- bad calls fail alone ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (rows(2, width=IN + 1), "rows of shape"),
        (rows(2).astype(np.float64), "dtype float64"),
        (np.zeros((0, IN), np.float32), "at least one row"),
        (np.float32(1.0), "at least one row"),
        (np.array([["a"] * IN]), "dtype <U1"),
        ([[1.0] * IN, [1.0]], "x:"),
    ],
)
async def test_a_call_with_bad_rows_fails_alone_before_its_batch_forms(
    s: at.AsyncEagerSession, bad: Any, message: str
) -> None:
    w = await weights(s)
    f = at.batched(row_shape=(IN,), dtype=np.float32)(mlp)
    xs = [rows(3, seed=1), rows(5, seed=2)]
    results = await asyncio.gather(f(xs[0], *w), f(bad, *w), f(xs[1], *w), return_exceptions=True)
    assert isinstance(results[1], at.InvalidArgumentError)
    assert results[1].args[0].startswith("batched(mlp)")
    assert message in str(results[1])
    close(results[0], xs[0])
    close(results[2], xs[1])
    assert f.stats().calls == 2  # the bad call never joined a batch
    assert f.stats().batches == 1


async def test_without_a_declared_row_shape_a_wrong_width_fails_in_a_batch_of_its_own(
    s: at.AsyncEagerSession,
) -> None:
    w = await weights(s)
    f = at.batched(mlp)
    good = rows(4)
    results = await asyncio.gather(f(good, *w), f(rows(2, width=IN + 1), *w), f(good, *w), return_exceptions=True)
    assert isinstance(results[1], at.InvalidArgumentError)
    assert "matmul" in str(results[1])
    close(results[0], good)
    close(results[2], good)
    stats = f.stats()
    assert (stats.batches, stats.failed) == (2, 1)


async def test_an_expression_as_x_or_param_is_evaluated_first(s: at.AsyncEagerSession) -> None:
    # Issue 27 (also; was refused with "await it first"): evaluated by the one rule of
    # which session evaluates, freed after the call, and never warned about.
    w = await weights(s)
    t = await s.constant(rows(2))
    f = at.batched(mlp)
    want = await one(await f(await (t * 2.0), *w)).numpy()
    await settle(s)
    live = s.stats().live_tensors
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = one(await f(t * 2.0, *w))
        np.testing.assert_array_equal(await got.numpy(), want)
        got2 = one(await f(t * 2.0, w[0] * 1.0, *w[1:]))
        np.testing.assert_array_equal(await got2.numpy(), want)
        g = at.batched(lambda ops, x, ws: mlp(ops, x, *ws))
        got3 = one(await g(t * 2.0, [w[0] * 1.0, *w[1:]]))  # one level into a list, as ops look
        np.testing.assert_array_equal(await got3.numpy(), want)
        gc.collect()
    assert got.session is s
    del got, got2, got3
    gc.collect()
    await settle(s)
    assert s.stats().live_tensors == live


async def test_fn_must_return_one_row_per_input_row(s: at.AsyncEagerSession) -> None:
    k = await s.constant(1.0)
    f = at.batched(lambda ops, x, k: ops.sum(x) * k)
    results = await asyncio.gather(f(rows(2), k), f(rows(3), k), return_exceptions=True)
    for r in results:
        assert isinstance(r, at.InvalidArgumentError)
        assert "one row per input row (5 rows" in str(r)


# -- kernel errors ---------------------------------------------------------------------------------
def picky(ops: at.FusedOps, x: Any, w: Any) -> Any:
    if x.shape[0] > 4:
        raise ZeroDivisionError(f"{x.shape[0]} rows")
    return x @ w


async def test_a_kernel_error_fails_every_caller_of_its_batch_with_the_error_of_a_single_call(
    s: at.AsyncEagerSession,
) -> None:
    w = await s.constant(W1)
    f = at.batched(picky)
    with pytest.raises(at.KernelError) as single:
        await f(rows(6), w)  # a batch of one call, of six rows
    results = await asyncio.gather(f(rows(3), w), f(rows(3, seed=1), w), return_exceptions=True)
    for r in results:
        assert type(r) is type(single.value)
        assert str(r) == str(single.value)  # six rows stacked: the same message
        assert type(r.__cause__) is ZeroDivisionError
    assert results[0] is not results[1]  # each caller raises its own object
    ok = await f(rows(2), w)  # the function still works
    np.testing.assert_allclose(np.asarray(ok), rows(2) @ W1, rtol=1e-5)
    assert f.stats().failed == 2
    del ok


async def test_an_unknown_op_inside_says_so(s: at.AsyncEagerSession) -> None:
    w = await s.constant(W1)

    def unknown(ops: at.FusedOps, x: Any, w: Any) -> Any:
        return ops.not_an_op(x, w)

    with pytest.raises(at.KernelError, match="no op 'not_an_op'") as info:
        await at.batched(unknown)(rows(2), w)
    assert isinstance(info.value.__cause__, AttributeError)


async def test_a_kernel_error_leaves_other_batches_alone(s: at.AsyncEagerSession) -> None:
    w, w_other = await s.constant(W1), await s.constant(W1)
    f = at.batched(picky)
    results = await asyncio.gather(f(rows(3), w), f(rows(3), w), f(rows(3), w_other), return_exceptions=True)
    assert isinstance(results[0], at.KernelError)
    assert isinstance(results[1], at.KernelError)
    np.testing.assert_allclose(np.asarray(results[2]), rows(3) @ W1, rtol=1e-5)


async def test_batched_functions_need_a_local_backend() -> None:
    from .test_function import RemoteLike

    async with at.AsyncEagerSession(backend=RemoteLike()) as s:
        k = await s.constant(2.0)
        with pytest.raises(at.InvalidArgumentError, match="local backends only"):
            await at.batched(lambda ops, x, k: x * k)(await s.constant(rows(2)), k)


# -- cancellation ----------------------------------------------------------------------------------
@pytest.mark.parametrize("which", [0, 1], ids=["the first caller", "a later caller"])
async def test_a_caller_cancelled_before_its_batch_starts_is_removed_from_it(
    strategy: at.ResourceCleanupStrategy, which: int
) -> None:
    seen: list[int] = []

    def recording(ops: at.FusedOps, x: Any, *params: Any) -> Any:
        seen.append(x.shape[0])
        return mlp(ops, x, *params)

    async with at.AsyncEagerSession(cleanup=strategy) as s:
        w = await weights(s)
        f = at.batched(recording)
        xs = [rows(2, seed=1), rows(7, seed=2), rows(3, seed=3)]
        tasks = [asyncio.create_task(f(x, *w)) for x in xs]
        await asyncio.sleep(0)  # all three joined the group; the batch starts next iteration
        tasks[which].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[which], asyncio.CancelledError)
        for i in {0, 1, 2} - {which}:
            close(done[i], xs[i])
        assert seen == [12 - len(xs[which])]  # the cancelled call's rows never reached the kernel
        assert f.stats().cancelled == 1
        del done, tasks
        assert await held(s) == 4


async def test_a_caller_cancelled_while_it_waits_alone_leaves_no_group_behind(s: at.AsyncEagerSession) -> None:
    w = await weights(s)
    f = at.batched(mlp)
    task = asyncio.create_task(f(rows(2), *w))
    await asyncio.sleep(0)  # it leads its group and waits one loop iteration for others
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert f.stats().batches == 0
    x = rows(3, seed=3)
    y = await f(x, *w)  # a group of its own: nothing joins the cancelled call's
    close(y, x)
    stats = f.stats()
    assert (stats.batches, stats.calls, stats.rows) == (1, 1, 3)
    assert await held(s) == 5  # the weights and this result


async def test_a_caller_cancelled_while_its_batch_runs_leaves_nothing_and_the_others_get_their_rows(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    started, release = threading.Event(), threading.Event()
    slow = _held_mlp(started, release)

    async with at.AsyncEagerSession(cleanup=strategy) as s:
        w = await weights(s)
        f = at.batched(slow)  # a first run for these shapes: on the pool
        xs = [rows(2, seed=1), rows(7, seed=2), rows(3, seed=3)]
        tasks = [asyncio.create_task(f(x, *w)) for x in xs]
        await asyncio.to_thread(started.wait, 10)
        tasks[1].cancel()
        await asyncio.sleep(0)
        release.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[1], asyncio.CancelledError)
        close(done[0], xs[0])
        close(done[2], xs[2])
        assert f.stats().cancelled == 1
        del done, tasks
        assert await held(s) == 4  # the cancelled call's rows were dropped, not kept anywhere
    assert s.stats().live_tensors == 0


async def test_a_lone_caller_cancelled_while_its_kernel_runs_leaves_nothing(
    strategy: at.ResourceCleanupStrategy,
) -> None:
    started, release = threading.Event(), threading.Event()
    slow = _held_mlp(started, release)

    async with at.AsyncEagerSession(cleanup=strategy) as s:
        w = await weights(s)
        f = at.batched(slow)
        task = asyncio.create_task(f(rows(3), *w))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert f.stats().cancelled == 1
        for _ in range(100):  # the kernel's result comes back to the loop after the cancellation
            await asyncio.sleep(0.001)
            if s.stats().allocated > 4:
                break
        assert await held(s) == 4  # its result is owned as a dropped tensor: freed as the strategy frees those
    assert s.stats().live_tensors == 0


async def test_a_session_closed_while_its_call_waits_raises_session_closed(s: at.AsyncEagerSession) -> None:
    w = await weights(s)
    f = at.batched(mlp)
    child = at.AsyncEagerSession(parent=s)
    x = await child.constant(rows(2))
    task = asyncio.create_task(f(x, *w))
    await asyncio.sleep(0)
    await child.aclose()
    with pytest.raises(at.SessionClosedError, match="waited for its batch"):
        await task
    assert child.stats().live_tensors == 0


# -- memory ----------------------------------------------------------------------------------------
async def test_each_result_counts_against_its_own_session_limit() -> None:
    async with at.AsyncEagerSession() as app:
        w = await weights(app)
        f = at.batched(mlp)
        tight_config = at.SessionConfig(memory_limit=IN * 4 * 4 + 4 * OUT * 4)  # its input and 4 result rows
        async with (
            at.AsyncEagerSession(parent=app, config=tight_config) as tight,
            at.AsyncEagerSession(parent=app) as roomy,
        ):
            xt = await tight.constant(rows(4))
            xs = [await tight.constant(rows(1)), xt, await roomy.constant(rows(50))]
            del xt
            results = await asyncio.gather(*[f(x, *w) for x in xs], return_exceptions=True)
            assert f.stats().batches == 1
            assert isinstance(results[0], at.Tensor)  # fits: 1 row of 4 floats
            assert isinstance(results[1], at.ResourceExhaustedError)  # 4 rows beside 5 input rows: over
            close(results[2], rows(50))
            assert results[2].session is roomy  # type: ignore[union-attr]
            assert tight.stats().live_bytes <= tight_config.memory_limit  # type: ignore[operator]
            del results


async def test_the_stacked_rows_and_intermediates_count_against_the_params_session() -> None:
    weight_bytes = sum(a.nbytes for a in (W1, B1, W2, B2))
    # Room for the weights and one small call's intermediates, not for 64 rows' worth.
    config = at.SessionConfig(memory_limit=weight_bytes + 8 * HIDDEN * 4 * 4)
    async with at.AsyncEagerSession(config=config) as app, at.AsyncEagerSession(parent=app) as request:
        w = await weights(app)
        f = at.batched(mlp)
        before = app.stats()
        x = await request.constant(rows(2))
        small = await f(x, *w)
        close(small, rows(2))
        after = app.stats()
        assert after.allocated > before.allocated  # the batch's intermediates, recorded ...
        assert after.live_bytes == before.live_bytes  # ... and freed
        assert after.peak_bytes > before.live_bytes
        xs = [await request.constant(rows(16, seed=i)) for i in range(4)]
        results = await asyncio.gather(*[f(x, *w) for x in xs], return_exceptions=True)
        for r in results:
            assert isinstance(r, at.ResourceExhaustedError)
            assert "inside a batched function" in str(r)
        assert app.stats().live_bytes == before.live_bytes
        del small, results


# -- where it runs ---------------------------------------------------------------------------------
async def test_the_first_batch_of_a_shape_runs_on_the_pool_then_cheap_ones_inline(s: at.AsyncEagerSession) -> None:
    threads: list[int] = []

    def cheap(ops: at.FusedOps, x: Any, k: Any) -> Any:
        threads.append(threading.get_ident())
        return x * k + 1.0

    f = at.batched(cheap)
    k = await s.constant(np.float32(2.0))
    x = rows(2)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(await f(x, k)), x * 2 + 1, rtol=1e-6)
    loop_thread = threading.get_ident()
    assert threads[0] != loop_thread
    assert threads[1:] == [loop_thread, loop_thread]


async def test_repeated_lone_calls_small_and_large_stay_right_and_leave_only_their_results(
    s: at.AsyncEagerSession,
) -> None:
    # Lone calls of a shape whose runs made no output worth recycling take plain fused
    # ops after the first run; large ones keep recycling. Both give numpy's values.
    f = at.batched(mlp)
    w = await weights(s)
    start = await held(s)
    for n in (4, 600, 4, 600, 4, 600, 4):  # 600 rows: a 600 x HIDDEN hidden layer over MIN_BYTES
        x = rows(n, seed=n)
        y = await f(x, *w)
        close(await y.numpy(), x)  # type: ignore[union-attr]
        assert await held(s) == start + 1  # only this result
        del y
    assert f.stats().batches == 7


async def test_the_batch_runs_in_the_context_of_its_first_caller(s: at.AsyncEagerSession) -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    values: list[str] = []

    def reads(ops: at.FusedOps, x: Any, k: Any) -> Any:
        values.append(var.get())
        return x * k

    k = await s.constant(np.float32(1.0))
    f = at.batched(reads)

    async def call_with(value: str) -> Any:
        var.set(value)
        return await f(rows(1), k)

    await asyncio.gather(call_with("first"), call_with("second"))
    assert values == ["first"]  # one kernel call, under the first caller's context variables


# -- under load ------------------------------------------------------------------------------------
async def test_hundreds_of_callers_each_get_exactly_their_rows(strategy: at.ResourceCleanupStrategy) -> None:
    """Mixed row counts, some calls cancelled (before and while their batch runs), some invalid."""
    rng = np.random.default_rng(7)
    n = 300
    async with at.AsyncEagerSession() as app:
        w = await weights(app)
        f = at.batched(max_batch_size=64, row_shape=(IN,))(mlp)
        request = at.AsyncEagerSession(parent=app, cleanup=strategy)
        await request.__aenter__()
        xs: list[Any] = []
        for i in range(n):
            x: np.ndarray | at.Tensor = rows(int(rng.integers(1, 40)), seed=i)
            kind = rng.random()
            if kind < 0.05:
                x = rows(2, width=IN + 1)  # invalid: refused before its batch forms
            elif kind < 0.4:
                x = await request.constant(x)  # a tensor: the result is the request session's
            xs.append(x)

        async def call(i: int, x: Any) -> Any:
            if i % 3 == 0:
                await asyncio.sleep(0)  # arrive an iteration later: several rounds of batches
            return await f(x, *w)

        tasks = [asyncio.create_task(call(i, x)) for i, x in enumerate(xs)]
        cancelled = set(rng.choice(n, size=30, replace=False).tolist())
        for i in sorted(cancelled)[:15]:
            tasks[i].cancel()  # before it even joined a batch
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for i in sorted(cancelled)[15:]:
            tasks[i].cancel()  # joined, maybe running
        done = await asyncio.gather(*tasks, return_exceptions=True)
        ok = 0
        for i, (x, y) in enumerate(zip(xs, done, strict=True)):
            if isinstance(y, asyncio.CancelledError):
                assert i in cancelled
                continue
            value = np.asarray(x) if not isinstance(x, at.Tensor) else await x.numpy()
            if value.shape[1] != IN:
                assert isinstance(y, at.InvalidArgumentError)
                continue
            assert isinstance(y, at.Tensor), y
            assert y.session is (request if isinstance(x, at.Tensor) else app)
            close(y, value)  # exactly its own rows, in its own order
            ok += 1
        assert ok >= n - 30 - 0.1 * n
        stats = f.stats()
        assert stats.batches < stats.calls  # coalesced
        assert stats.max_rows <= 64
        assert 0 < stats.cancelled <= 15  # those that had joined a batch when cancelled
        assert stats.failed == 0
        del done, tasks, xs, y, x
        assert await held(app) == 4  # the weights: results owned by app were dropped, nothing else stayed
        await request.aclose()
        assert request.stats().live_tensors == 0


def test_a_call_on_another_loop_never_joins_a_group_whose_loop_moved_threads() -> None:
    # (asyncio's loop: its iteration order is what holds the leader; a loop that does not
    # say which thread runs it, uvloop, is asked for the running loop)
    # A group is open (its leader waits its loop iteration) when its loop stops, then the
    # loop runs in another thread, held there before the leader resumes. A call in the
    # thread the group was led from, on a loop of its own, with the same params: the
    # params' session is bound to the other loop, so it is refused as any call from
    # another loop is, and never joins that loop's group.
    f = at.batched(lambda ops, x, w: x @ w)
    loop = asyncio.new_event_loop()
    s = at.AsyncEagerSession()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(10)

    async def start() -> tuple[at.Tensor, asyncio.Task[Any]]:
        w = await s.constant(W1)

        def first() -> None:  # runs before the leader: the loop stops after this iteration
            loop.call_soon(hold)
            loop.stop()

        loop.call_soon(first)
        leader = asyncio.ensure_future(f(np.ones((1, IN), np.float32), w))
        return w, leader

    # Its last iteration: the leader leads its group, a call is held for the next one.
    w, leader = loop.run_until_complete(start())
    worker = threading.Thread(target=loop.run_forever)
    worker.start()
    try:
        assert held.wait(10)  # the loop runs in the worker now, the leader not resumed yet

        async def join() -> Any:
            return await f(np.ones((2, IN), np.float32), w)

        with pytest.raises(at.WrongEventLoopError, match="bound to the event loop"):
            asyncio.run(join())
    finally:
        release.set()
    out = asyncio.run_coroutine_threadsafe(_value(leader), loop).result(10)
    np.testing.assert_allclose(out, np.ones((1, IN), np.float32) @ W1, rtol=1e-5)
    asyncio.run_coroutine_threadsafe(s.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    worker.join(10)
    loop.close()


async def _value(task: asyncio.Task[Any]) -> Any:
    return await (await task).numpy()
