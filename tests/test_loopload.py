"""Busy-loop placement: a saturated, contended loop sends kernels in the band to the pool when they run long enough
without the GIL; an idle loop, a saturated one with a single serial caller, or a kernel that mostly holds the GIL
keeps them inline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _loopload
from aiotensor._loopload import BUSY_ABOVE, BUSY_FREE_US, BUSY_INLINE_US, IDLE_BELOW, WINDOW_S, Sensor
from tests._in_flight import request_in_flight

# An add of two float64 (230, 230) arrays: the cost model puts it between BUSY_INLINE_US
# and the default inline threshold (50 µs), the band whose placement depends on the loop.
BAND = (230, 230)


class Clocks:
    """A wall clock the test advances, and a CPU clock that advances with it while 'busy'."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.cpu = 1.0
        self.busy = False

    def tick(self, seconds: float = WINDOW_S) -> None:
        self.wall += seconds
        if self.busy:
            self.cpu += seconds


@pytest.fixture
def clocks() -> Iterator[Clocks]:
    """This thread's sensor on test clocks (and a fresh sensor again after the test)."""
    c = Clocks()
    _loopload._local.sensor = Sensor(cpu=lambda: c.cpu, wall=lambda: c.wall)
    yield c
    _loopload._local.sensor = Sensor()


def test_the_band_lies_between_the_busy_limit_and_the_default_threshold() -> None:
    from aiotensor._cost import estimate_us
    from aiotensor._opdef import OPS

    a = np.ones(BAND)
    assert BUSY_INLINE_US < estimate_us(OPS["add"], (a, a), None, None) <= at.SessionConfig().inline_threshold_us


def test_a_thread_that_never_waits_turns_busy_and_one_that_waits_turns_idle_again(clocks: Clocks) -> None:
    sensor = _loopload.sensor()
    clocks.busy = True
    for _ in range(20):
        clocks.tick()
        sensor.sample()
    assert sensor.saturated
    assert sensor.utilization > BUSY_ABOVE
    clocks.busy = False
    clocks.tick()
    sensor.sample()
    assert sensor.saturated  # hysteresis: one idle window does not flip it
    for _ in range(20):
        clocks.tick()
        sensor.sample()
    assert not sensor.saturated
    # mypy keeps `sensor.saturated` narrowed to True from the assert above, across sample() calls
    assert sensor.utilization < IDLE_BELOW  # type: ignore[unreachable]


def test_samples_are_taken_once_per_window(clocks: Clocks) -> None:
    sensor = _loopload.sensor()
    clocks.tick()
    sensor.sample()
    clocks.tick(WINDOW_S / 10)
    sensor.sample()
    assert sensor.samples == 1


def test_small_kernels_never_ask(clocks: Clocks) -> None:
    clocks.busy = True
    for _ in range(5):
        clocks.tick()
        assert not _loopload.offload(BUSY_INLINE_US)
    assert at.loop_load().samples == 0


async def add_ten_times(clocks: Clocks, yield_between: bool = False, lockstep: asyncio.Barrier | None = None) -> None:
    """Ten adds in the band, a window apart, each checked against NumPy.

    With ``lockstep``, each add waits for the other callers' add of the same round: the
    callers then meet in every window whatever the pool's timing (without it, a caller
    whose kernels came back first could finish its ten alone, and count as one caller).
    """
    a = np.random.default_rng(0).standard_normal(BAND)
    async with at.AsyncEagerSession() as s:
        x = await s.constant(a)
        for _ in range(10):
            clocks.tick()
            y = await s.add(x, x)
            np.testing.assert_array_equal(await y.numpy(), a + a)
            if lockstep is not None:
                await lockstep.wait()
            elif yield_between:
                await asyncio.sleep(0)


async def two_callers(clocks: Clocks, work: Callable[[asyncio.Barrier], Awaitable[None]]) -> None:
    """``work`` in two tasks at once, in lockstep: each asks while the other is still running."""
    lockstep = asyncio.Barrier(2)
    await asyncio.gather(work(lockstep), work(lockstep))


async def test_a_saturated_loop_with_one_serial_caller_keeps_kernels_in_the_band_inline(clocks: Clocks) -> None:
    clocks.busy = True
    await add_ten_times(clocks)
    load = at.loop_load()
    assert load.saturated
    assert not load.busy
    assert load.callers == 1
    assert load.offloaded == 0
    assert load.kept_inline == 10
    assert load.kept_alone >= 9  # all but the first window's, before the average rose


async def test_a_saturated_loop_keeps_a_serial_callers_kernels_inline_across_child_tasks(clocks: Clocks) -> None:
    # A caller awaiting a task of its own, one after another: still one caller at a time.
    clocks.busy = True
    for _ in range(3):
        await add_ten_times(clocks)  # the parent asks too, between its children
        await asyncio.create_task(add_ten_times(clocks, yield_between=True))
    load = at.loop_load()
    assert load.saturated
    assert (load.offloaded, load.callers) == (0, 1)


async def test_a_saturated_contended_loop_sends_kernels_in_the_band_to_the_pool(clocks: Clocks) -> None:
    clocks.busy = True
    await two_callers(clocks, lambda lockstep: add_ten_times(clocks, lockstep=lockstep))
    load = at.loop_load()
    assert load.busy
    assert load.saturated
    assert load.callers == 2
    assert load.offloaded >= 15  # all but the first few: before the two had met in a window
    assert load.busy_inline_us == BUSY_INLINE_US


async def test_a_request_in_flight_makes_a_saturated_loop_contended(clocks: Clocks) -> None:
    clocks.busy = True
    await request_in_flight(lambda: add_ten_times(clocks))
    load = at.loop_load()
    assert load.callers == 2
    assert load.offloaded >= 9


async def test_an_idle_loop_keeps_kernels_in_the_band_inline(clocks: Clocks) -> None:
    await add_ten_times(clocks)
    load = at.loop_load()
    assert not load.busy
    assert load.offloaded == 0
    assert load.kept_inline == 10
    assert load.kept_alone == 0
    assert (load.kept_held, load.free_us) == (0, None)  # the GIL is weighed on a busy loop only


async def test_an_idle_contended_loop_keeps_kernels_in_the_band_inline(clocks: Clocks) -> None:
    await two_callers(clocks, lambda lockstep: add_ten_times(clocks, lockstep=lockstep))
    load = at.loop_load()
    assert not load.saturated
    assert load.callers == 2
    assert (load.busy, load.offloaded, load.kept_inline) == (False, 0, 20)


async def double_ten_times(clocks: Clocks) -> None:
    """Ten calls of a fused function in the band, a window apart, each checked against NumPy."""
    double = at.function(lambda ops, v: v + v)
    a = np.random.default_rng(0).standard_normal(BAND)
    async with at.AsyncEagerSession() as s:
        x = await s.constant(a)
        for _ in range(10):
            clocks.tick()
            y = await double(x)
            assert isinstance(y, at.Tensor)
            np.testing.assert_array_equal(await y.numpy(), a + a)


async def test_a_busy_loop_sends_fused_calls_in_the_band_to_the_pool(clocks: Clocks) -> None:
    clocks.busy = True
    await request_in_flight(lambda: double_ten_times(clocks))
    load = at.loop_load()
    assert load.offloaded >= 8  # (the first call runs on the pool to be measured)
    assert load.offloaded + load.kept_inline == 9  # each later call counted once
    # One large ufunc: its loop runs without the GIL, long enough to pay for the hop.
    assert load.kept_held == 0
    assert load.free_us is not None
    assert load.free_us > load.busy_free_us == BUSY_FREE_US


def test_a_single_op_releasing_the_gil_decides_as_its_estimate_did() -> None:
    # BUSY_FREE_US is BUSY_INLINE_US less one op's dispatch, which holds the GIL.
    from aiotensor._cost import OVERHEAD_NS, estimate_us, gil_free_us
    from aiotensor._opdef import OPS

    assert pytest.approx(BUSY_INLINE_US - OVERHEAD_NS / 1000.0) == BUSY_FREE_US
    a = np.ones(BAND)
    est = estimate_us(OPS["add"], (a, a), None, None)
    assert gil_free_us(OPS["add"], (a, a), None, est) > BUSY_FREE_US


WIDE = at.SessionConfig(inline_threshold_us=1000.0)


async def call_ten_times(clocks: Clocks, fn: at.FusedFunction, inputs: list[np.ndarray], want: np.ndarray) -> None:
    """Ten calls of ``fn`` on ``inputs`` (as tensors), a window apart, each checked against ``want``.

    The session's threshold is high (the band reaches it) so that no two slow runs on a loaded
    machine (over four thresholds: ``_placement.Placement``) send the function to the pool.
    """
    async with at.AsyncEagerSession(config=WIDE) as s:
        args = [await s.constant(a) for a in inputs]
        for _ in range(10):
            clocks.tick()
            y = await fn(*args)
            assert isinstance(y, at.Tensor)
            np.testing.assert_allclose(await y.numpy(), want, rtol=1e-5, atol=1e-6)


def small_ops(ops: at.FusedOps, v: Any) -> Any:
    """Thirty small element-wise ops: the function's Python and numpy's dispatch, all holding the GIL."""
    for _ in range(15):
        v = v * 0.5 + 1.0
    return v


async def test_a_busy_loop_keeps_a_fused_function_of_small_ops_inline(clocks: Clocks) -> None:
    # In the band, but no loop of its ops runs over more than 500 elements: on the pool, the
    # worker would hold the GIL throughout and the loop thread would wait for it.
    a = np.random.default_rng(0).standard_normal((16, 16))
    want = a.copy()
    for _ in range(15):
        want = want * 0.5 + 1.0
    clocks.busy = True
    await request_in_flight(lambda: call_ten_times(clocks, at.function(small_ops), [a], want))
    load = at.loop_load()
    assert load.busy
    assert load.offloaded == 0
    assert load.kept_inline == 9  # in the band: each call after the first (on the pool, measured) asked
    assert load.kept_held >= 8  # kept because of the GIL, not because the loop was idle
    assert load.free_us == 0.0


def mlp(ops: at.FusedOps, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """A small MLP: three ops over 8,192 elements release the GIL, the rest run holding it."""
    return ops.softmax(ops.relu(x @ w1 + b1) @ w2 + b2, axis=-1)


async def test_a_busy_loop_keeps_a_fused_function_that_hands_the_gil_back_and_forth_inline(clocks: Clocks) -> None:
    # (16, 64) @ (64, 512), + b1 and relu release the GIL; the rest holds it. Their GIL-free
    # time, less a hand-over for each release after the first, does not pay for the hop.
    from aiotensor._loopload import GIL_TRANSFER_US

    rng = np.random.default_rng(0)
    shapes = [(16, 64), (64, 512), (512,), (512, 10), (10,)]
    x, w1, b1, w2, b2 = [rng.standard_normal(sh).astype(np.float32) for sh in shapes]
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    clocks.busy = True
    at.set_blas_threads(1)  # as a server runs BLAS: threads spinning on a loaded machine slow a run 100x
    try:
        await request_in_flight(lambda: call_ten_times(clocks, at.function(mlp), [x, w1, b1, w2, b2], want))
    finally:
        at.set_blas_threads(None)
    load = at.loop_load()
    assert load.busy
    assert (load.offloaded, load.kept_inline) == (0, 9)
    assert load.kept_held >= 8
    assert load.free_us is not None
    assert 0.0 < load.free_us <= BUSY_FREE_US
    assert load.free_us < load.busy_free_us - GIL_TRANSFER_US  # (three releases: two hand-overs counted)


async def test_a_busy_loop_keeps_a_single_op_that_holds_the_gil_inline(clocks: Clocks) -> None:
    # erf of 450 float64: in the band (a special function of numpy steps), each step's loop
    # over 450 elements, all holding the GIL.
    import math

    from aiotensor._cost import estimate_us
    from aiotensor._opdef import OPS

    a = np.random.default_rng(0).standard_normal(450)
    assert BUSY_INLINE_US < estimate_us(OPS["erf"], (a,), None, None) <= at.SessionConfig().inline_threshold_us
    # (the erf op would run inline in a session of the default threshold too)
    clocks.busy = True

    async def erf_ten_times() -> None:
        async with at.AsyncEagerSession(config=WIDE) as s:
            x = await s.constant(a)
            for _ in range(10):
                clocks.tick()
                y = await s.erf(x)
                np.testing.assert_allclose(await y.numpy(), [math.erf(v) for v in a], rtol=1e-12, atol=1e-15)

    await request_in_flight(erf_ten_times)
    load = at.loop_load()
    assert load.busy
    assert (load.offloaded, load.kept_inline) == (0, 10)
    assert load.kept_held >= 9
    assert load.free_us == 0.0


async def test_a_busy_loop_keeps_a_program_of_small_steps_inline(clocks: Clocks) -> None:
    a = np.random.default_rng(0).standard_normal((16, 16))
    want = a.copy()
    for _ in range(15):
        want = want * 0.5 + a
    clocks.busy = True

    async def programs() -> None:
        async with at.AsyncEagerSession(config=WIDE) as s:
            x = await s.constant(a)
            for _ in range(3):
                clocks.tick(2 * WINDOW_S)
                e: Any = x
                for _ in range(15):
                    e = e * 0.5 + x  # thirty steps over 256 elements: one program
                y = await e
                np.testing.assert_allclose(await y.numpy(), want)

    await request_in_flight(programs)
    load = at.loop_load()
    assert load.busy
    assert load.offloaded == 0
    assert load.kept_held >= 2
    assert load.free_us == 0.0


async def test_a_saturated_loop_runs_a_serial_callers_fused_calls_in_the_band_inline(clocks: Clocks) -> None:
    clocks.busy = True
    await double_ten_times(clocks)
    load = at.loop_load()
    assert (load.offloaded, load.kept_inline) == (0, 9)
    assert load.kept_alone >= 8


async def test_an_idle_loop_runs_fused_calls_in_the_band_inline(clocks: Clocks) -> None:
    await double_ten_times(clocks)
    load = at.loop_load()
    assert (load.offloaded, load.kept_inline) == (0, 9)


async def test_the_real_clocks_see_a_spinning_loop_busier_than_a_waiting_one() -> None:
    _loopload._local.sensor = Sensor()
    try:

        async def utilization(spin: bool) -> float:
            sensor = Sensor()
            for _ in range(8):
                end = time.perf_counter() + WINDOW_S
                if spin:
                    while time.perf_counter() < end:
                        pass
                    await asyncio.sleep(0)
                else:
                    await asyncio.sleep(WINDOW_S)
                sensor.sample()
            return sensor.utilization

        waiting = await utilization(spin=False)
        spinning = await utilization(spin=True)
        assert spinning > waiting
    finally:
        _loopload._local.sensor = Sensor()


async def test_the_web_example_reports_the_loop_load_in_its_stats(clocks: Clocks) -> None:
    import dataclasses

    from examples.web_service.app import create_app

    clocks.busy = True
    clocks.tick(2 * WINDOW_S)
    _loopload.offload(BUSY_INLINE_US + 1)
    app = create_app(forward="ops")
    async with app.router.lifespan_context(app):
        loop = app.state.service.stats()["loop"]
    assert loop == dataclasses.asdict(at.loop_load())
    assert loop["samples"] == 1
    assert loop["offloaded"] + loop["kept_inline"] == 1


async def test_a_busy_loop_sends_a_program_it_would_run_in_slices_to_the_pool(clocks: Clocks) -> None:
    from aiotensor._cost import SLICED_MAX, estimate_us
    from aiotensor._opdef import OPS

    a = np.random.default_rng(0).standard_normal(BAND)
    add = estimate_us(OPS["add"], (a, a), None, None)
    assert at.SessionConfig().inline_threshold_us < 3 * add <= SLICED_MAX * at.SessionConfig().inline_threshold_us
    clocks.busy = True

    async def three_programs() -> None:
        async with at.AsyncEagerSession() as s:
            x = await s.constant(a)
            for _ in range(3):
                clocks.tick(2 * WINDOW_S)
                y = await ((x + x) * x - x)  # three ops: one program, in slices on an idle loop
                np.testing.assert_allclose(await y.numpy(), (a + a) * a - a)

    await request_in_flight(three_programs)
    load = at.loop_load()
    assert load.offloaded >= 2
    assert load.kept_inline <= 1


async def test_tasks_ready_in_the_same_turn_contend(clocks: Clocks) -> None:
    # Each of three tasks asks once without suspending: only their turn says they met.
    clocks.busy = True
    await add_ten_times(clocks)  # saturates the loop, alone: all inline
    assert at.loop_load().offloaded == 0
    a = np.random.default_rng(0).standard_normal(BAND)
    async with at.AsyncEagerSession() as s:
        x = await s.constant(a)

        async def once() -> None:
            clocks.tick()
            y = await s.add(x, x)
            np.testing.assert_array_equal(await y.numpy(), a + a)

        await asyncio.gather(once(), once(), once())
    load = at.loop_load()
    assert load.callers == 3
    assert load.offloaded == 2  # the second and the third: the first asked alone


async def serve_batched(clocks: Clocks, callers: int) -> at.BatchedFunction:
    """A saturated loop serving ``callers`` concurrent calls of a batched function (one batch), checked with NumPy."""
    clocks.busy = True
    sensor = _loopload.sensor()
    for _ in range(20):  # the loop thread never waited: saturated, with no caller counted yet
        clocks.tick(2 * WINDOW_S)
        sensor.sample()
    assert sensor.saturated
    assert at.loop_load().callers == 0
    scale = at.batched(lambda ops, x, w: x * w)
    rng = np.random.default_rng(0)
    rows = [rng.standard_normal((2, 8)) for _ in range(callers)]
    async with at.AsyncEagerSession() as s:
        w = await s.constant(rng.standard_normal(8))
        outs = await asyncio.gather(*(scale(r, w) for r in rows))
        for r, out in zip(rows, outs, strict=True):
            assert isinstance(out, at.Tensor)
            np.testing.assert_array_equal(await out.numpy(), r * await w.numpy())
    assert scale.stats().batches == 1
    return scale


async def test_a_saturated_loop_serving_a_batch_of_several_callers_is_contended(clocks: Clocks) -> None:
    # Each batch runs in a task of its own: only the batch tells how many callers it served.
    scale = await serve_batched(clocks, 3)
    assert scale.stats().calls == 3
    load = at.loop_load()
    assert load.callers == 3
    assert load.saturated
    assert load.busy


async def test_a_saturated_loop_serving_one_batched_caller_is_not_contended(clocks: Clocks) -> None:
    await serve_batched(clocks, 1)
    load = at.loop_load()
    assert load.callers <= 1
    assert load.saturated
    assert not load.busy


def test_each_loop_a_thread_runs_is_the_one_its_callers_are_counted_on(clocks: Clocks) -> None:
    # The sensor keeps the asyncio loop it found (asking for the running loop is dearer):
    # a loop run later on the same thread, a loop running on another thread, and no
    # loop at all are each seen as they are.
    import threading

    sensor = _loopload.sensor()
    seen: list[tuple[object, object]] = []

    async def caller() -> None:
        sensor.observe()
        seen.append((asyncio.current_task(), sensor._last))

    asyncio.run(caller())
    other = asyncio.new_event_loop()
    other.run_until_complete(caller())  # a loop run later on this thread: kept
    worker = threading.Thread(target=other.run_forever)
    worker.start()
    try:
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), other).result()
        asyncio.run(caller())  # this thread's loop, while the kept one runs on another
    finally:
        other.call_soon_threadsafe(other.stop)
        worker.join()
        other.close()
    assert len(seen) == 3
    assert all(task is last for task, last in seen)
    last = sensor._last
    sensor.observe()  # no loop running here: nothing counted
    assert sensor._last is last


async def test_callers_naming_the_running_loop_are_counted_as_when_the_sensor_finds_it(clocks: Clocks) -> None:
    # ``stays_inline(free_us, loop)``: the engine has just seen its loop run on this thread,
    # so the sensor does not ask for it again (on uvloop a system call); the callers are
    # counted all the same, and the decisions with them.
    loop = asyncio.get_running_loop()
    clocks.busy = True

    async def ask(named: bool) -> None:
        for _ in range(10):
            assert _loopload.stays_inline(0.0, loop if named else None)  # (0 GIL-free µs: kept)
            clocks.tick()
            await asyncio.sleep(0)

    await asyncio.gather(ask(True), ask(True))
    named = at.loop_load()
    assert named.saturated
    assert named.callers == 2
    assert named.kept_held >= 15  # busy from the first windows on: each kept for holding the GIL
    await asyncio.gather(ask(False), ask(False))
    found = at.loop_load()
    assert found.callers == 2
    assert found.kept_held - named.kept_held == 20  # (busy already: every one)
    assert found.kept_inline == 40
