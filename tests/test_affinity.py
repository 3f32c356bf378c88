"""Steering a thread off a core: the calls behind a spawned part's worker running beside its spawner (Linux)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from aiotensor._backends import _affinity

linux_two_cpus = pytest.mark.skipif(
    not sys.platform.startswith("linux") or len(getattr(os, "sched_getaffinity", lambda _: ())(0)) < 2,
    reason="per-thread CPU affinity needs Linux and two allowed CPUs",
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sched_getcpu is Linux's")
def test_the_current_cpu_is_one_the_thread_may_run_on() -> None:
    cpu = _affinity.current_cpu()
    assert cpu is not None
    assert cpu in os.sched_getaffinity(0)


@linux_two_cpus
def test_a_steered_thread_may_run_anywhere_but_there_until_it_is_given_its_cpus_back() -> None:
    allowed = os.sched_getaffinity(0)
    away = min(allowed)
    seen: list[set[int]] = []
    ready, steered, done = threading.Event(), threading.Event(), threading.Event()
    tid: list[int] = []
    had: list[set[int]] = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        steered.wait(10)
        seen.append(os.sched_getaffinity(0))
        _affinity.restore(had[0])
        seen.append(os.sched_getaffinity(0))
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    assert ready.wait(10)
    cpus = _affinity.steer(tid[0], away)
    assert cpus == allowed
    had.append(cpus)
    steered.set()
    assert done.wait(10)
    t.join()
    assert seen == [allowed - {away}, allowed]
    assert os.sched_getaffinity(0) == allowed  # the steering thread's own CPUs never change


@linux_two_cpus
def test_nothing_is_steered_from_fewer_than_two_cpus_a_cpu_it_lacks_or_no_thread() -> None:
    mine = os.sched_getaffinity(0)
    assert _affinity.steer(2**31 - 1, min(mine)) is None  # (no such thread)
    me = threading.get_native_id()
    assert _affinity.steer(me, 10_000) is None  # (a CPU it may not run on)
    one = {min(mine)}
    os.sched_setaffinity(0, one)
    try:
        assert _affinity.steer(me, min(mine)) is None
        assert os.sched_getaffinity(0) == one
        assert not _affinity.can_steer()
    finally:
        os.sched_setaffinity(0, mine)
    assert os.sched_getaffinity(0) == mine
    assert _affinity.can_steer() is _affinity.STEER
