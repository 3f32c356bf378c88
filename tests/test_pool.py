"""aiotensor's own worker pool: results, errors, context, cancellation, adoption, batching, shutdown, fork."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends import _affinity
from aiotensor._backends._pool import Pending, WorkerPool, default_pool, inbox_wakeups

from ._results import one

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


@pytest.fixture
def pool() -> Any:
    p = WorkerPool(2, name="test-pool")
    yield p
    p.shutdown()


class Blocker:
    """A kernel that holds a worker until released."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> str:
        self.started.set()
        assert self.release.wait(5)
        return "released"

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, 5)


async def test_results_come_back_from_a_worker_thread(pool: WorkerPool) -> None:
    loop_thread = threading.get_ident()
    assert await pool.run(np.add, np.ones(3), 2.0) == pytest.approx([3.0, 3.0, 3.0])
    where = await pool.run(threading.get_ident)
    assert where != loop_thread
    assert (await pool.run(threading.current_thread)).name.startswith("test-pool")


async def test_kernels_see_the_callers_context_and_cannot_change_it(pool: WorkerPool) -> None:
    def read_and_write() -> str:
        seen = request_id.get()
        request_id.set("changed on the worker")
        return seen

    token = request_id.set("abcd")
    try:
        assert await pool.run(read_and_write) == "abcd"
        assert request_id.get() == "abcd"
        with np.errstate(divide="raise"), pytest.raises(FloatingPointError):  # errstate is a context variable
            await pool.run(np.divide, np.ones(1), np.zeros(1))
    finally:
        request_id.reset(token)


def _stop() -> Any:
    return next(iter(()))


def _cancelled() -> Any:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.cancel()
    return future.result()  # raises concurrent.futures.CancelledError, an ordinary Exception


async def test_errors_reach_the_awaiter(pool: WorkerPool) -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        await pool.run(int, "x")
    # StopIteration cannot travel through an await: PEP 479's RuntimeError, with it as the cause.
    with pytest.raises(RuntimeError) as info:
        await pool.run(_stop)
    assert type(info.value.__cause__) is StopIteration
    # A kernel's own concurrent CancelledError is its error, not a cancellation of the awaiter.
    with pytest.raises(concurrent.futures.CancelledError):
        await pool.run(_cancelled)
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    assert await pool.run(lambda: 7) == 7  # the workers survived every one of them


async def test_a_job_abandoned_before_it_started_never_runs_and_lets_go_of_its_arguments() -> None:
    pool = WorkerPool(1)
    blocker = Blocker()
    ran: list[object] = []
    adopted: list[object] = []
    try:
        first = pool.run(blocker)
        await blocker.wait_started()
        arg = np.ones(4)
        arg_ref = weakref.ref(arg)
        queued = pool.run(ran.append, arg)
        del arg
        queued.abandon(adopted.append)
        assert arg_ref() is None  # dropped at once, not when the queue reaches it
        blocker.release.set()
        assert await first == "released"
        assert await pool.run(lambda: "after") == "after"  # FIFO: the abandoned job was passed by now
        await asyncio.sleep(0.01)
        assert ran == []
        assert adopted == []
    finally:
        blocker.release.set()
        pool.shutdown()


async def test_a_job_abandoned_while_it_runs_is_adopted_on_the_loop_thread(pool: WorkerPool) -> None:
    blocker = Blocker()
    pending = pool.run(blocker)
    await blocker.wait_started()
    adopted: list[tuple[object, int]] = []
    pending.abandon(lambda result: adopted.append((result, threading.get_ident())))
    blocker.release.set()
    async with asyncio.timeout(5):
        while not adopted:
            await asyncio.sleep(0.001)
    assert adopted == [("released", threading.get_ident())]


async def test_a_failed_job_abandoned_while_it_runs_adopts_nothing(pool: WorkerPool) -> None:
    blocker = Blocker()

    def fail() -> None:
        blocker()
        raise ValueError("boom")

    pending = pool.run(fail)
    await blocker.wait_started()
    adopted: list[object] = []
    pending.abandon(adopted.append)
    blocker.release.set()
    assert await pool.run(lambda: 1) == 1
    await asyncio.sleep(0.01)
    assert adopted == []


async def _caller(pending: Pending, adopted: list[object]) -> Any:
    # What the engine does around a kernel.
    try:
        return await pending
    except asyncio.CancelledError:
        pending.abandon(adopted.append)
        raise


async def test_a_caller_cancelled_after_the_job_finished_still_gets_it_adopted(pool: WorkerPool) -> None:
    # The result reached the loop, but the caller was cancelled before it resumed.
    adopted: list[object] = []
    blocker = Blocker()
    pending = pool.run(blocker)
    task: asyncio.Task[Any] | None = None

    def cancel_caller(_: object) -> None:
        assert task is not None
        task.cancel()  # the result is set: the task gets CancelledError instead of it

    pending._future.add_done_callback(cancel_caller)  # runs before the task's own wake-up
    task = asyncio.ensure_future(_caller(pending, adopted))
    await blocker.wait_started()
    blocker.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        while not adopted:
            await asyncio.sleep(0.001)
    assert adopted == ["released"]


async def test_a_caller_cancelled_while_the_result_is_on_its_way_gets_it_adopted(pool: WorkerPool) -> None:
    # The job finished on the worker, the loop has not settled it yet, and the caller is cancelled.
    adopted: list[object] = []
    go = threading.Event()

    def kernel() -> str:
        assert go.wait(5)
        return "finished"

    pending = pool.run(kernel)
    task = asyncio.ensure_future(_caller(pending, adopted))
    await asyncio.sleep(0)  # the task awaits the job
    go.set()
    deadline = time.monotonic() + 5
    while not pending._job.inbox.done:  # blocks the loop: the completion waits in the inbox
        assert time.monotonic() < deadline
        time.sleep(0.001)  # noqa: ASYNC251 -- blocking the loop is the point
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5):
        while not adopted:
            await asyncio.sleep(0.001)
    assert adopted == ["finished"]


async def test_a_job_lets_go_of_its_arguments_and_result_once_delivered(pool: WorkerPool) -> None:
    arg = np.ones(8)
    arg_ref = weakref.ref(arg)
    result = await pool.run(np.negative, arg)
    result_ref = weakref.ref(result)
    del arg, result
    assert arg_ref() is None
    # Neither the job, nor an idle worker, nor the future (which the loop's wake-up
    # handle still holds during this step) keeps it.
    assert result_ref() is None


async def test_many_in_flight_all_complete_in_order_of_their_values(pool: WorkerPool) -> None:
    results = await asyncio.gather(*[pool.run(pow, i, 2) for i in range(2000)])
    assert results == [i * i for i in range(2000)]


async def test_completions_of_a_batch_wake_the_loop_once(pool: WorkerPool) -> None:
    loop = asyncio.get_running_loop()
    finished, lock, count = threading.Event(), threading.Lock(), [0]

    def kernel(i: int) -> int:
        with lock:
            count[0] += 1
            if count[0] == 32:
                finished.set()
        return i

    await pool.run(int)  # workers started
    before = inbox_wakeups(loop)
    calls: list[object] = []
    patched = isinstance(loop, asyncio.BaseEventLoop)  # uvloop's loop takes no attributes: the counter only
    if patched:
        original = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            calls.append(args[0])
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign, assignment]
    try:
        pendings = [pool.run(kernel, i) for i in range(32)]
        assert finished.wait(5)  # the loop is blocked while all 32 complete
        assert await asyncio.gather(*pendings) == list(range(32))
    finally:
        if patched:
            del loop.call_soon_threadsafe
    assert inbox_wakeups(loop) - before == 1
    if patched:
        assert len(calls) == 1


async def test_spawn_runs_in_the_spawners_context_and_logs_errors(
    pool: WorkerPool, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    done = threading.Event()

    def note() -> None:
        seen.append(request_id.get())
        done.set()

    token = request_id.set("spawned")
    try:
        pool.spawn(note)
    finally:
        request_id.reset(token)
    assert await asyncio.to_thread(done.wait, 5)
    assert seen == ["spawned"]

    def boom() -> None:
        raise ValueError("spawned and failed")

    with caplog.at_level(logging.ERROR, logger="aiotensor"):
        pool.spawn(boom)
        assert await pool.run(lambda: 1) == 1
        async with asyncio.timeout(5):
            while "spawned and failed" not in caplog.text:
                await asyncio.sleep(0.001)
    assert await pool.run(lambda: 2) == 2  # the worker lives on


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2,
    reason="per-thread CPU affinity needs Linux and two allowed CPUs",
)
@pytest.mark.parametrize("steer", [True, False])
def test_a_worker_woken_for_a_spawned_part_runs_off_the_spawners_core_for_that_job(
    steer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_affinity, "STEER", steer)
    allowed = os.sched_getaffinity(0)
    with WorkerPool(1) as pool:
        assert pool.submit(int).result(5) == 0  # the worker exists, and waits idle
        while pool.idle_workers() < 1:
            time.sleep(0.001)
        seen: list[set[int]] = []
        done = threading.Event()

        def part() -> None:
            seen.append(os.sched_getaffinity(0))
            done.set()

        pool.spawn(part)
        assert done.wait(5)
        after = pool.submit(os.sched_getaffinity, 0).result(5)  # the same worker's next job
    # Steered: every CPU of the process but one, the spawner's at the spawn (it may
    # have moved since); the next job has them all again. Not steered: all of them.
    assert len(seen[0]) == (len(allowed) - 1 if steer else len(allowed))
    assert seen[0] <= allowed
    assert after == allowed


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2,
    reason="per-thread CPU affinity needs Linux and two allowed CPUs",
)
def test_a_steered_worker_gets_its_cpus_back_when_it_finds_no_job_and_a_worker_it_starts_has_them() -> None:
    allowed = os.sched_getaffinity(0)
    with WorkerPool(2) as pool:
        assert pool.submit(int).result(5) == 0
        while pool.idle_workers() < 2:  # one worker, idle, and room for a second
            time.sleep(0.001)
        crew = pool._crew
        (mailbox, tid), *_ = crew.tids.items()
        # Steered for a spawned part that another worker took: woken, nothing to run.
        had = _affinity.steer(tid, min(allowed))
        assert had == allowed
        crew.steered[tid] = had
        assert crew.idle.pop() is mailbox
        mailbox.put(object())  # (a wake-up: the pool's own mark is private; any object wakes it)
        while tid in crew.steered or mailbox not in crew.idle:
            time.sleep(0.001)
        assert os.sched_getaffinity(tid) == allowed
        # A spawned part whose worker starts another: the new worker has the CPUs the
        # first had before it was steered, not its narrowed ones.
        seen: list[set[int]] = []
        done = threading.Event()

        def part() -> None:
            seen.append(os.sched_getaffinity(0))
            seen.append(pool.submit(os.sched_getaffinity, 0).result(5))  # (no worker idle: a second starts)
            done.set()

        pool.spawn(part)
        assert done.wait(5)
    assert len(seen[0]) == len(allowed) - 1
    assert seen[1] == allowed


def test_a_wake_up_is_sent_even_when_steering_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    with WorkerPool(1) as pool:
        assert pool.submit(int).result(5) == 0
        while pool.idle_workers() < 1:
            time.sleep(0.001)

        def broken(mailbox: Any) -> None:
            raise RuntimeError("steering failed")

        monkeypatch.setattr(pool, "_steer", broken)
        monkeypatch.setattr(_affinity, "STEER", True)
        ran = threading.Event()
        with pytest.raises(RuntimeError, match="steering failed"):
            pool.spawn(ran.set)
        assert ran.wait(5)  # the worker was woken, and ran the part
        assert pool.submit(abs, -3).result(5) == 3  # and is still the pool's


def test_the_pool_is_a_concurrent_futures_executor() -> None:
    with WorkerPool(2) as pool:
        assert isinstance(pool, concurrent.futures.Executor)
        assert pool.submit(pow, 2, 10).result(5) == 1024
        assert list(pool.map(abs, [-1, -2])) == [1, 2]
        failing = pool.submit(int, "x")
        with pytest.raises(ValueError, match="invalid literal"):
            failing.result(5)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)


def test_shutdown_with_cancel_futures_drops_what_has_not_started() -> None:
    pool = WorkerPool(1)
    blocker = Blocker()
    first = pool.submit(blocker)
    assert blocker.started.wait(5)
    queued = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    blocker.release.set()
    assert first.result(5) == "released"  # the running one finishes
    for t in pool.threads:
        t.join(5)
        assert not t.is_alive()


async def test_shutdown_cancels_queued_awaited_jobs_without_cancelling_their_awaiters() -> None:
    pool = WorkerPool(1)
    blocker = Blocker()
    first = pool.run(blocker)
    await blocker.wait_started()
    queued = asyncio.ensure_future(_caller(pool.run(lambda: "never"), []))
    await asyncio.sleep(0)
    pool.shutdown(wait=False, cancel_futures=True)
    blocker.release.set()
    assert await first == "released"
    with pytest.raises(asyncio.CancelledError):
        await queued  # the job was cancelled; its awaiter's task was not asked to stop
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.run(int)


async def test_a_session_that_owns_its_pool_shuts_it_down_at_close() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=2)) as s:
        x = await s.constant([1.0, 2.0])
        t = one(await s.apply(np.negative, x))
        np.testing.assert_array_equal(await t.numpy(), [-1.0, -2.0])
        pool = s.backend.executor  # type: ignore[attr-defined]
        assert isinstance(pool, WorkerPool)
        threads = list(pool.threads)
        assert threads
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.run(int)
    for thread in threads:
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()


async def test_sessions_on_the_shared_pool_use_the_default_pool_of_their_priority() -> None:
    async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0)) as s:
        assert s.backend.executor is default_pool("low")  # type: ignore[attr-defined]
        await s.add(await s.constant([1.0]), 1.0)
    async with at.AsyncEagerSession(config=at.SessionConfig(worker_priority="normal")) as s:
        assert s.backend.executor is default_pool("normal")  # type: ignore[attr-defined]


_FORK_SCRIPT = textwrap.dedent(
    """
    import asyncio, os, sys
    import numpy as np
    import aiotensor as at
    from aiotensor._backends._pool import WorkerPool

    own = WorkerPool(2)

    async def work():
        async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0)) as s:
            t = await s.add(await s.constant(np.arange(4.0)), 1.0)
            total = float((await t.numpy()).sum())
        return total + await own.run(lambda: 100.0)

    assert asyncio.run(work()) == 110.0  # the shared pool and this one have threads now
    pid = os.fork()
    if pid == 0:  # the child: fresh pools, no thread inherited, still working
        try:
            ok = asyncio.run(asyncio.wait_for(work(), 10)) == 110.0
        except BaseException as exc:
            print(repr(exc), file=sys.stderr)
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    assert asyncio.run(work()) == 110.0  # and the parent's pools still run
    print("ok")
    """
)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_gets_fresh_pools() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


async def test_an_adopt_that_raises_strands_no_other_completion(pool: WorkerPool) -> None:
    loop = asyncio.get_running_loop()
    errors: list[object] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context.get("exception")))
    try:
        gates = [threading.Event(), threading.Event()]

        def kernel(i: int) -> int:
            assert gates[i].wait(5)
            return i

        abandoned = pool.run(kernel, 0)
        awaited = pool.run(kernel, 1)
        await asyncio.sleep(0.01)  # both running (two workers)

        def adopt(_: object) -> None:
            raise RuntimeError("adopt failed")

        abandoned.abandon(adopt)
        inbox = abandoned._job.inbox
        for n, gate in enumerate(gates, 1):  # the loop is blocked: one batch, the failing adopt first
            gate.set()
            deadline = time.monotonic() + 5
            while len(inbox.done) < n:
                assert time.monotonic() < deadline
                time.sleep(0.001)  # noqa: ASYNC251 -- blocking the loop is the point
        async with asyncio.timeout(5):
            assert await awaited == 1
    finally:
        loop.set_exception_handler(None)
    assert [type(e) for e in errors] == [RuntimeError]


async def test_a_pool_nobody_references_stops_its_workers() -> None:
    # As with ThreadPoolExecutor: workers do not keep their pool alive (a session dropped
    # unclosed must not leave threads behind for good).
    import gc

    pool = WorkerPool(2)
    assert await asyncio.gather(pool.run(int, "1"), pool.run(int, "2")) == [1, 2]  # type: ignore[comparison-overlap]
    threads = pool.threads
    assert threads
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is None
    for thread in threads:
        await asyncio.to_thread(thread.join, 5)
        assert not thread.is_alive()
