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
def test_a_steered_thread_may_run_anywhere_but_there_until_it_unsteers() -> None:
    allowed = os.sched_getaffinity(0)
    away = min(allowed)
    seen: list[set[int]] = []
    ready, steered, done = threading.Event(), threading.Event(), threading.Event()
    tid: list[int] = []

    def worker() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        steered.wait(10)
        seen.append(os.sched_getaffinity(0))
        _affinity.unsteer()
        seen.append(os.sched_getaffinity(0))
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    assert ready.wait(10)
    assert _affinity.steer(tid[0], away) is True
    steered.set()
    assert done.wait(10)
    t.join()
    assert seen == [allowed - {away}, allowed]
    assert os.sched_getaffinity(0) == allowed  # the steering thread's own CPUs never change


@linux_two_cpus
def test_nothing_is_steered_with_one_cpu_allowed_a_cpu_not_allowed_or_no_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _affinity.steer(2**31 - 1, min(os.sched_getaffinity(0))) is False  # (no such thread)
    me = threading.get_native_id()
    assert _affinity.steer(me, 10_000) is False  # (no such CPU in the process's set)
    monkeypatch.setattr(_affinity, "_allowed", lambda: {0})
    assert _affinity.steer(me, 0) is False
    assert os.sched_getaffinity(0) == os.sched_getaffinity(os.getpid())
