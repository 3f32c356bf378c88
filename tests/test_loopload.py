"""Busy-loop placement: a saturated loop sends kernels in the band to the pool, an idle one keeps them inline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _loopload
from aiotensor._loopload import BUSY_ABOVE, BUSY_INLINE_US, IDLE_BELOW, WINDOW_S, Sensor

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
    assert sensor.busy
    assert sensor.utilization > BUSY_ABOVE
    clocks.busy = False
    clocks.tick()
    assert sensor.sample()  # hysteresis: one idle window does not flip it
    for _ in range(20):
        clocks.tick()
        sensor.sample()
    assert not sensor.busy
    # mypy keeps `sensor.busy` narrowed to True from the assert above, across sample() calls
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


async def add_ten_times(clocks: Clocks) -> None:
    """Ten adds in the band, a window apart, each checked against NumPy."""
    a = np.random.default_rng(0).standard_normal(BAND)
    async with at.AsyncEagerSession() as s:
        x = await s.constant(a)
        for _ in range(10):
            clocks.tick()
            y = await s.add(x, x)
            np.testing.assert_array_equal(await y.numpy(), a + a)


async def test_a_busy_loop_sends_kernels_in_the_band_to_the_pool(clocks: Clocks) -> None:
    clocks.busy = True
    await add_ten_times(clocks)
    load = at.loop_load()
    assert load.busy
    assert load.offloaded >= 9  # all but the first window's, before the average rose
    assert load.busy_inline_us == BUSY_INLINE_US


async def test_an_idle_loop_keeps_kernels_in_the_band_inline(clocks: Clocks) -> None:
    await add_ten_times(clocks)
    load = at.loop_load()
    assert not load.busy
    assert load.offloaded == 0
    assert load.kept_inline == 10


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
    await double_ten_times(clocks)
    load = at.loop_load()
    assert load.offloaded >= 8  # (the first call runs on the pool to be measured)
    assert load.offloaded + load.kept_inline == 9  # each later call counted once


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
    async with at.AsyncEagerSession() as s:
        x = await s.constant(a)
        for _ in range(3):
            clocks.tick(2 * WINDOW_S)
            y = await ((x + x) * x - x)  # three ops: one program, in slices on an idle loop
            np.testing.assert_allclose(await y.numpy(), (a + a) * a - a)
    load = at.loop_load()
    assert load.offloaded >= 2
    assert load.kept_inline <= 1
