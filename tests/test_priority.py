"""Worker priority: set per thread, read back from that thread, restorable; pools, sessions and BLAS threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends import _priority
from aiotensor._backends._pool import WorkerPool
from aiotensor._backends._priority import LOW_NICE, Saved, lower, read, restore

from ._results import one

T = TypeVar("T")

linux_only = pytest.mark.skipif(not _priority.supported(), reason="per-thread priorities are Linux-only")


def _cap_sys_nice() -> bool:
    # CAP_SYS_NICE is capability bit 23; root in a container may lack it.
    try:
        with open("/proc/self/status") as f:
            caps = next(line for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(caps.split()[1], 16) >> 23 & 1)


def _may_raise(nice: int) -> bool:
    """Whether this process may give a thread back ``nice`` (and leave SCHED_IDLE for it)."""
    import resource

    return _cap_sys_nice() or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - nice


def _on_a_new_thread(fn: Callable[[], T]) -> T:
    # A fresh thread each time: a lowered thread is not handed back to anyone.
    out: list[T] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


@linux_only
@pytest.mark.parametrize("priority", ["low", "idle", 5])
def test_lower_then_restore_read_back_on_the_thread(priority: Any) -> None:
    def body() -> tuple[Saved, Saved | None, Saved, bool, Saved]:
        before = read()
        saved = lower(priority)
        during = read()
        restored = restore(saved)
        return before, saved, during, restored, read()

    before, saved, during, restored, after = _on_a_new_thread(body)
    assert saved == before
    if priority == "idle":
        assert during == Saved(os.SCHED_IDLE, before.nice)
    else:
        assert during == Saved(before.policy, LOW_NICE if priority == "low" else priority)
    if _may_raise(before.nice):
        assert restored
        assert after == before
    else:  # raising a priority back is a privilege: refused, and said so
        assert not restored
        assert after == during


@linux_only
def test_lowering_never_raises_a_priority_and_normal_changes_nothing() -> None:
    def body() -> tuple[Saved | None, Saved | None, Saved]:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 15)
        return lower("low"), lower("normal"), read()

    low, normal, after = _on_a_new_thread(body)
    assert low is None
    assert normal is None
    assert after.nice == 15


@linux_only
def test_another_thread_can_be_lowered_by_its_id() -> None:
    ready, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def sleeper() -> None:
        tids.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    t = threading.Thread(target=sleeper)
    t.start()
    try:
        assert ready.wait(5)
        saved = lower("low", tids[0])
        assert saved is not None
        assert read(tids[0]).nice == LOW_NICE
        assert restore(saved, tids[0]) == _may_raise(saved.nice)
    finally:
        done.set()
        t.join(5)


@linux_only
@pytest.mark.parametrize(
    ("priority", "policy", "nice"), [("low", None, LOW_NICE), ("idle", "idle", None), (7, None, 7)]
)
def test_pool_workers_run_at_the_pools_priority(priority: Any, policy: str | None, nice: int | None) -> None:
    with WorkerPool(1, priority=priority) as pool:
        got = pool.submit(read).result(5)
    if policy == "idle":
        assert got.policy == os.SCHED_IDLE
    else:
        assert got.nice == nice


@linux_only
def test_a_normal_pool_leaves_its_workers_as_they_were() -> None:
    def body() -> tuple[Saved, Saved]:
        with WorkerPool(1, priority="normal") as pool:  # workers inherit the thread that starts them
            return read(), pool.submit(read).result(5)

    mine, worker = _on_a_new_thread(body)
    assert worker == mine


@linux_only
async def test_sessions_run_kernels_at_their_configured_priority() -> None:
    def policy_and_nice(x: Any) -> Any:
        tid = threading.get_native_id()
        return np.array([os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)])

    async with at.AsyncEagerSession(config=at.SessionConfig(max_workers=1, worker_priority="idle")) as s:
        got = await one(await s.apply(policy_and_nice, np.zeros(1))).numpy()
        assert got[0] == os.SCHED_IDLE
    async with at.AsyncEagerSession() as s:  # the default: "low", on the shared pool
        got = await one(await s.apply(policy_and_nice, np.zeros(1))).numpy()
        assert got[1] >= LOW_NICE


@pytest.mark.parametrize("bad", ["high", "LOW", 20, -1, True, 1.5, None])
def test_the_config_refuses_what_is_not_a_priority(bad: object) -> None:
    with pytest.raises(at.InvalidArgumentError, match="worker_priority"):
        at.SessionConfig(worker_priority=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="priority"):
        WorkerPool(1, priority=bad)  # type: ignore[arg-type]


def test_describe_names_the_system_setting() -> None:
    assert _priority.describe("normal") == "normal (unchanged)"
    expected = "nice 10" if _priority.supported() else "not supported"
    assert expected in _priority.describe("low")
    assert ("SCHED_IDLE" if _priority.supported() else "not supported") in _priority.describe("idle")


_BLAS_SCRIPT = textwrap.dedent(
    """
    import json, os
    import numpy as np
    from aiotensor._backends import _priority
    from aiotensor._backends._pool import WorkerPool

    np.ones((64, 64)) @ np.ones((64, 64))
    helpers = _priority._blas_helpers()
    nice = lambda: [os.getpriority(os.PRIO_PROCESS, t) for t in helpers]
    before = nice()
    with WorkerPool(2, priority="low") as pool:
        pool.submit(int).result(5)
        during = nice()
        with WorkerPool(1, priority="low") as second:  # a second lowered pool: still lowered after it stops
            second.submit(int).result(5)
        after_second = nice()
    print(json.dumps({"helpers": len(helpers), "before": before, "during": during,
                      "after_second": after_second, "after": nice()}))
    """
)


@linux_only
def test_blas_threads_are_lowered_while_a_lowered_pool_runs_and_restored_after() -> None:
    proc = subprocess.run([sys.executable, "-c", _BLAS_SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(proc.stdout)
    if got["helpers"] == 0:
        pytest.skip("numpy's BLAS runs no helper threads here (one BLAS thread)")
    assert got["before"] == [0] * got["helpers"]
    assert got["during"] == [LOW_NICE] * got["helpers"]
    assert got["after_second"] == [LOW_NICE] * got["helpers"]
    if _may_raise(0):
        assert got["after"] == [0] * got["helpers"]


_FORK_BLAS_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os
    import numpy as np
    import aiotensor as at
    from aiotensor._backends import _priority

    a = np.ones((512, 512), np.float32)
    nice = lambda: [os.getpriority(os.PRIO_PROCESS, t) for t in _priority._blas_helpers()]

    async def product():
        async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0)) as s:
            x = await s.constant(a)
            await (await s.matmul(x, x)).numpy()

    asyncio.run(product())
    first = (_priority._blas_helpers(), nice())
    pid = os.fork()  # OpenBLAS stops its helpers around a fork and starts new ones later
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    a @ a  # new helpers, started by this (normal) thread
    fresh = (_priority._blas_helpers(), nice())
    asyncio.run(product())  # a pooled product lowers them again
    print(json.dumps({"first": first, "fresh": fresh, "after": nice()}))
    """
)


@linux_only
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_blas_threads_started_again_after_a_fork_are_lowered_again() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _FORK_BLAS_SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(proc.stdout)
    (first_tids, first_nice), (fresh_tids, fresh_nice) = got["first"], got["fresh"]
    if not first_tids:
        pytest.skip("numpy's BLAS runs no helper threads here (one BLAS thread)")
    assert first_nice == [LOW_NICE] * len(first_tids)
    assert set(fresh_tids).isdisjoint(first_tids)  # the helpers were restarted
    assert fresh_nice == [0] * len(fresh_tids)
    assert got["after"] == [LOW_NICE] * len(fresh_tids)
