"""Model check: hypothesis drives random interleavings against each cleanup strategy.

One ``RuleBasedStateMachine`` per strategy creates tensors, runs valid and invalid
ops, drops handles (on the loop thread, on worker threads, and inside reference
cycles that only ``gc.collect()`` finalizes), cancels ops whose kernel is running,
hits safe points, sleeps, collects garbage and finally closes. A numpy model holds
the value every live handle must have. After every step:

* ``allocated - freed == live_tensors`` and ``live_bytes`` is the sum of held buffers;
* no buffer is released twice, and no buffer a live handle refers to is released;
* the strategy's rule: nothing freed before close (ON_SESSION_CLOSE); nothing dropped
  before a safe point is pending after it (ON_SAFE_POINTS; a handle may also die later,
  when the cycle collector finalizes it, so the check is against the drops counted
  before the op began); pending drains with no op at all (IN_BACKGROUND);
* after close, nothing is held, every buffer ever owned was released exactly once,
  and every handle raises SessionClosedError.

Hypothesis state machines are synchronous: each machine owns an ``asyncio.Runner``
(its own event loop), runs one coroutine per step, and closes it in ``teardown``.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import aiotensor as at

try:
    import uvloop
except ImportError:  # pragma: no cover - a test extra
    uvloop = None  # type: ignore[assignment]

from ._tracking import check_accounting, check_all_released, tracked_session

S = at.ResourceCleanupStrategy
LENGTHS = st.sampled_from([1, 2, 3])
FLOATS = st.floats(-100, 100, allow_nan=False, width=32)
MAX_LIVE = 12

#: Steps and examples run per strategy (quoted in docs/reliability.md).
STATS: dict[str, dict[str, int]] = {}


def _blocking_kernel(started: threading.Event, release: threading.Event, x: Any) -> Any:
    started.set()
    release.wait(5)
    return np.asarray(x) * 2


def _failing_kernel(x: Any) -> Any:
    raise RuntimeError("injected kernel failure")


class SessionMachine(RuleBasedStateMachine):
    """Random interleavings against one session; subclasses fix the strategy."""

    strategy: ClassVar[at.ResourceCleanupStrategy]
    loop: ClassVar[str] = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        # Everything older than this example stays out of the collector's way while it
        # runs (a full collection of pytest + numpy + hypothesis costs ~50 ms).
        gc.freeze()
        self.runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if self.loop == "uvloop" else None)
        self.s, self.registry, self.backend = tracked_session(self.strategy)
        self.runner.run(self.s.__aenter__())
        self.live: list[tuple[at.Tensor, np.ndarray[Any, Any]]] = []
        self.drops_before = 0
        counters = ("examples", "states", "loop_runs", "cancelled", "thread_drops", "gc")
        stats = STATS.setdefault(f"{self.strategy.name}/{self.loop}", dict.fromkeys(counters, 0))
        stats["examples"] += 1
        self.stats = stats

    def run(self, coro: Any) -> Any:
        self.stats["loop_runs"] += 1
        self.drops_before = self.registry.drops
        return self.runner.run(coro)

    def pick(self, i: int) -> int:
        return i % len(self.live)

    def ran_op(self) -> None:
        # Every op is a safe point (before and after it) under ON_SAFE_POINTS: all that
        # was dropped before the op began has been freed, and only later drops
        # (a finalizer run by the cycle collector during the op) may be pending.
        if self.strategy is S.ON_SAFE_POINTS:
            assert self.registry.drops_at_collect >= self.drops_before
            assert self.registry.pending <= self.registry.drops - self.drops_before

    # -- creating ------------------------------------------------------------------------
    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(values=st.lists(FLOATS, min_size=1, max_size=3))
    def constant(self, values: list[float]) -> None:
        t = self.run(self.s.constant(values))
        self.live.append((t, np.array(values)))
        self.ran_op()

    @precondition(lambda self: len(self.live) < MAX_LIVE)
    @rule(n=LENGTHS, fill=FLOATS)
    def full(self, n: int, fill: float) -> None:
        t = self.run(self.s.full(n, fill))
        self.live.append((t, np.full(n, fill)))
        self.ran_op()

    # -- valid and invalid ops -------------------------------------------------------------
    @precondition(lambda self: self.live and len(self.live) < MAX_LIVE)
    @rule(i=st.integers(0, 99), j=st.integers(0, 99), op=st.sampled_from(["add", "subtract", "multiply", "maximum"]))
    def binary(self, i: int, j: int, op: str) -> None:
        (a, va), (b, vb) = self.live[self.pick(i)], self.live[self.pick(j)]
        try:
            expected = getattr(np, op)(va, vb)
        except ValueError:  # shapes (2,) and (3,): the op must refuse, and allocate nothing
            before = self.registry.allocated
            with pytest.raises(at.InvalidArgumentError, match=rf"{op}\(float64\[\d?\], float64\[\d?\]\)"):
                self.run(getattr(self.s, op)(a, b))
            assert self.registry.allocated == before
        else:
            t = self.run(getattr(self.s, op)(a, b))
            self.live.append((t, expected))
        self.ran_op()

    @precondition(lambda self: self.live and len(self.live) < MAX_LIVE)
    @rule(i=st.integers(0, 99))
    def reduce(self, i: int) -> None:
        a, va = self.live[self.pick(i)]
        t = self.run(self.s.sum(a))
        self.live.append((t, np.asarray(va.sum())))
        self.ran_op()

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), kind=st.sampled_from(["reshape", "axis", "kernel", "data", "dtype"]))
    def invalid(self, i: int, kind: str) -> None:
        a, _ = self.live[self.pick(i)]
        before = self.registry.allocated
        if kind == "reshape":
            with pytest.raises(at.InvalidArgumentError, match="reshape"):
                self.run(self.s.reshape(a, (7, 5)))
        elif kind == "axis":
            with pytest.raises(at.InvalidArgumentError, match="axis"):
                self.run(self.s.sum(a, axis=4))
        elif kind == "kernel":
            with pytest.raises(at.KernelError, match=r"_failing_kernel\)\(float64\[\d?\]\).*injected"):
                self.run(self.s.apply(_failing_kernel, a))
        elif kind == "data":
            with pytest.raises(at.InvalidArgumentError, match="not numeric"):
                self.run(self.s.constant(["x"]))
        else:
            # refused before the op starts: no safe point either
            with pytest.raises(at.InvalidArgumentError, match="not a dtype"):
                self.run(self.s.zeros(2, dtype="nope"))
        assert self.registry.allocated == before
        if kind != "dtype":
            self.ran_op()

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def cancel_running_op(self, i: int) -> None:
        # The kernel is running (it signalled) when the caller is cancelled: its result
        # must be adopted by the session as a dropped buffer, then freed per strategy.
        a, _ = self.live[self.pick(i)]
        started, release = threading.Event(), threading.Event()
        before = self.registry.allocated

        async def scenario() -> None:
            task = asyncio.ensure_future(self.s.apply(_blocking_kernel, started, release, a))
            async with asyncio.timeout(5):
                while not started.is_set():
                    await asyncio.sleep(0.0005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            async with asyncio.timeout(5):  # the adopted result arrives from the pool
                while self.registry.allocated == before:
                    await asyncio.sleep(0.0005)

        self.run(scenario())
        self.stats["cancelled"] += 1

    # -- dropping ------------------------------------------------------------------------
    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def drop_on_loop_thread(self, i: int) -> None:
        del self.live[self.pick(i)]

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), n=st.integers(1, 3))
    def drop_on_worker_thread(self, i: int, n: int) -> None:
        k = self.pick(i)
        box = [t for t, _ in self.live[k : k + n]]
        del self.live[k : k + n]
        worker = threading.Thread(target=box.clear)  # the last references die on that thread
        worker.start()
        worker.join()
        self.stats["thread_drops"] += 1

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def drop_into_a_cycle(self, i: int) -> None:
        t, _ = self.live.pop(self.pick(i))
        cycle: list[Any] = [t]
        cycle.append(cycle)  # only the cycle collector finalizes the handle now
        del t, cycle

    @rule(generation=st.sampled_from([0, 1, 2]))
    def collect_garbage(self, generation: int) -> None:
        # finalizers run inside the collector, on this (the loop's) thread
        gc.collect(generation)
        self.stats["gc"] += 1

    # -- time passing --------------------------------------------------------------------
    @rule()
    def safe_point(self) -> None:
        if self.live:
            t, expected = self.live[-1]
            np.testing.assert_allclose(self.run(t.numpy()), expected, rtol=1e-6)
        else:
            assert self.run(self.s.run([])) == []
        self.ran_op()

    @rule(seconds=st.sampled_from([0, 0.0005, 0.002]))
    def sleep(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds))

    @rule()
    def values_match_the_model(self) -> None:
        if not self.live:
            return
        values = self.run(self.s.run([t for t, _ in self.live]))
        for value, (_, expected) in zip(values, self.live, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-6)
        self.ran_op()

    @rule()
    def pending_drains_without_ops(self) -> None:
        if self.strategy is not S.IN_BACKGROUND:
            return

        async def drained() -> None:
            async with asyncio.timeout(5):
                while self.registry.pending:
                    await asyncio.sleep(0.0005)

        self.run(drained())

    # -- after every step ----------------------------------------------------------------------
    @invariant()
    def accounting_holds(self) -> None:
        self.stats["states"] += 1  # invariants run on every state reached
        check_accounting(self.registry, self.backend)
        held = self.registry.buffers()
        for t, _ in self.live:
            assert t._rid in held, f"{t.name} is referenced but was freed"

    @invariant()
    def nothing_freed_before_close(self) -> None:
        if self.strategy is S.ON_SESSION_CLOSE:
            assert self.registry.freed == 0

    def teardown(self) -> None:
        try:
            self.runner.run(self.s.close())
            check_all_released(self.registry, self.backend)
            for t, _ in self.live:
                with pytest.raises(at.SessionClosedError):
                    self.runner.run(t.numpy())
                with pytest.raises(at.SessionClosedError):
                    np.asarray(t)
                with pytest.raises(at.SessionClosedError):
                    self.runner.run(self.s.add(t, 1.0))
        finally:
            self.live.clear()
            self.runner.close()
            gc.unfreeze()


# Sized so that the module runs in well under 40 s on a loaded 2-core machine.
SETTINGS = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class InBackgroundMachine(SessionMachine):
    strategy = S.IN_BACKGROUND


class OnSafePointsMachine(SessionMachine):
    strategy = S.ON_SAFE_POINTS


class OnSessionCloseMachine(SessionMachine):
    strategy = S.ON_SESSION_CLOSE


# uvloop's callbacks from other threads and its task handling are separate code: fewer
# examples there, the same rules.
UVLOOP_SETTINGS = settings(SETTINGS, max_examples=20)
_needs_uvloop = pytest.mark.skipif(uvloop is None, reason="uvloop is not installed")


def _case(machine: type[SessionMachine], loop: str) -> Any:
    # A leaf class per loop: hypothesis refuses settings applied to a class twice.
    leaf = type(f"{machine.__name__}On{loop.capitalize()}", (machine,), {"loop": loop})
    case = (SETTINGS if loop == "asyncio" else UVLOOP_SETTINGS)(leaf).TestCase  # type: ignore[attr-defined]
    marked = pytest.mark.slow(case)
    return _needs_uvloop(marked) if loop == "uvloop" else marked


TestInBackground = _case(InBackgroundMachine, "asyncio")
TestOnSafePoints = _case(OnSafePointsMachine, "asyncio")
TestOnSessionClose = _case(OnSessionCloseMachine, "asyncio")
TestInBackgroundUvloop = _case(InBackgroundMachine, "uvloop")
TestOnSafePointsUvloop = _case(OnSafePointsMachine, "uvloop")
TestOnSessionCloseUvloop = _case(OnSessionCloseMachine, "uvloop")


def test_model_check_explored_states() -> None:
    # Runs after the machines in file order; records what they explored.
    if not STATS:
        pytest.skip("the machines did not run in this process (e.g. -k selected this test only)")
    for name, numbers in STATS.items():
        print(f"model check {name}: {numbers}")
        assert numbers["states"] > numbers["examples"]
