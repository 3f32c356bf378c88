"""Which worker of aiotensor's pool takes a job: the one that went idle last; ``idle_workers()``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from aiotensor._backends._pool import WorkerPool


@pytest.fixture
def pool() -> Any:
    p = WorkerPool(2, name="handoff")
    yield p
    p.shutdown()


class Gate:
    """A kernel that holds its worker until released; returns the worker's thread."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> threading.Thread:
        self.started.set()
        assert self.release.wait(5)
        return threading.current_thread()

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, 5)


async def _both_started(pool: WorkerPool) -> tuple[threading.Thread, threading.Thread]:
    # Two jobs held at once: both workers run; released in order, the second goes idle last.
    first, second = Gate(), Gate()
    a, b = pool.run(first), pool.run(second)
    await first.wait_started()
    await second.wait_started()
    first.release.set()
    thread_a = await a
    second.release.set()
    thread_b = await b
    assert thread_a is not thread_b
    return thread_a, thread_b


async def test_the_next_job_goes_to_the_worker_that_finished_the_last_one(pool: WorkerPool) -> None:
    await _both_started(pool)
    first = await pool.run(threading.current_thread)
    # One job at a time, awaited: every one on the worker that ran the one before
    # (a pool whose idle workers wait in one FIFO queue alternates between the two).
    ran_on = [await pool.run(threading.current_thread) for _ in range(50)]
    assert set(ran_on) == {first}


async def _hold_in_turn(pool: WorkerPool) -> tuple[Gate, Gate, Any, Any]:
    # Two held jobs, the second submitted once the first has started (each wakes one worker).
    first, second = Gate(), Gate()
    held_first = pool.run(first)
    await first.wait_started()
    held_second = pool.run(second)
    await second.wait_started()
    return first, second, held_first, held_second


async def test_of_two_idle_workers_the_one_that_went_idle_last_takes_the_job(pool: WorkerPool) -> None:
    thread_a, thread_b = await _both_started(pool)
    assert await pool.run(threading.current_thread) is thread_b
    # The other order: b (on top of the stack) takes the first held job, a the second;
    # b's ends first, a goes idle last.
    first, second, held_b, held_a = await _hold_in_turn(pool)
    first.release.set()
    assert await held_b is thread_b
    second.release.set()
    assert await held_a is thread_a
    assert await pool.run(threading.current_thread) is thread_a


async def test_a_job_submitted_while_every_worker_is_busy_runs_on_the_first_one_free(pool: WorkerPool) -> None:
    thread_a, thread_b = await _both_started(pool)
    first, second, held_b, held_a = await _hold_in_turn(pool)
    queued = pool.run(threading.current_thread)  # no idle worker: waits on the backlog
    second.release.set()  # a's job ends first: a takes the queued one
    assert await held_a is thread_a
    assert await queued is thread_a
    first.release.set()
    assert await held_b is thread_b


def test_executor_calls_and_spawned_calls_go_to_the_worker_that_went_idle_last() -> None:
    with WorkerPool(2) as pool:
        first = pool.submit(threading.current_thread).result(5)
        assert all(pool.submit(threading.current_thread).result(5) is first for _ in range(30))
        seen: list[threading.Thread] = []
        done = threading.Event()

        def spawned() -> None:
            seen.append(threading.current_thread())
            done.set()

        for _ in range(30):
            done.clear()
            pool.spawn(spawned)
            assert done.wait(5)
        # A spawned call signals before its worker is idle again: the next may find it
        # still busy and go to the other worker, but never to a third.
        assert len(set(seen)) <= 2
        assert pool.submit(threading.current_thread).result(5) in seen


def test_many_threads_submitting_at_once_lose_no_job() -> None:
    # The hand-off takes no lock: a worker going idle while a submitter finds none idle
    # must still see the job (a lost hand-off would leave a future unresolved).
    with WorkerPool(2) as pool:

        def submitter(k: int) -> list[int]:
            futures: list[concurrent.futures.Future[int]] = []
            for i in range(400):
                futures.append(pool.submit(pow, k * 1000 + i, 1))
                if i % 7 == 0:
                    futures[-1].result(10)  # let the workers go idle now and then
            return [f.result(10) for f in futures]

        with concurrent.futures.ThreadPoolExecutor(4) as submitters:
            results = list(submitters.map(submitter, range(4)))
    assert results == [[k * 1000 + i for i in range(400)] for k in range(4)]


async def test_awaited_bursts_from_the_loop_all_complete(pool: WorkerPool) -> None:
    for size in (1, 2, 3, 17, 64):
        assert await asyncio.gather(*[pool.run(pow, i, 2) for i in range(size)]) == [i * i for i in range(size)]
        assert await pool.run(int, "7") == 7


async def test_idle_workers_counts_idle_workers_and_those_not_started_yet(pool: WorkerPool) -> None:
    assert pool.idle_workers() == 2  # none started, two may start
    assert await pool.run(int, "1") == 1
    assert len(pool.threads) == 1
    assert pool.idle_workers() == 2  # one idle, one may start
    gate = Gate()
    held = pool.run(gate)
    await gate.wait_started()
    assert pool.idle_workers() == 1
    other = Gate()
    held_other = pool.run(other)
    await other.wait_started()
    assert len(pool.threads) == 2
    assert pool.idle_workers() == 0
    seen_inside: list[int] = []
    gate.release.set()
    await held
    assert pool.idle_workers() == 1
    await pool.run(lambda: seen_inside.append(pool.idle_workers()))
    assert seen_inside == [0]  # the asking worker is busy: not counted
    other.release.set()
    await held_other
    assert pool.idle_workers() == 2
    pool.shutdown()
    assert pool.idle_workers() == 0


async def test_shutdown_stops_idle_workers_waiting_in_their_mailboxes() -> None:
    pool = WorkerPool(3)
    gates = [Gate() for _ in range(3)]
    held = [pool.run(g) for g in gates]
    for g in gates:
        await g.wait_started()
        g.release.set()
    await asyncio.gather(*held)
    assert pool.idle_workers() == 3
    threads = pool.threads
    await asyncio.to_thread(pool.shutdown)
    assert not any(t.is_alive() for t in threads)


def test_shutdown_with_cancel_futures_stops_workers_idle_in_their_mailboxes() -> None:
    pool = WorkerPool(2)
    first, second = Gate(), Gate()
    held = [pool.submit(first), pool.submit(second)]
    assert first.started.wait(5)
    assert second.started.wait(5)
    queued = pool.submit(threading.current_thread)  # on the backlog: both workers are busy
    first.release.set()
    second.release.set()
    assert {f.result(5) for f in held} == set(pool.threads)
    queued.result(5)
    pool.shutdown(wait=False, cancel_futures=True)  # both idle: woken to find their stop marks
    for thread in pool.threads:
        thread.join(5)
        assert not thread.is_alive()
