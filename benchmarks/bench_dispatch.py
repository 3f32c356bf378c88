"""Target 1: per-op latency of an element-wise add by size, aiotensor against the alternatives.

Every variant adds two float32 arrays of the same size and is awaited one op at a
time (a request handler's pattern). Raw numpy runs on the loop thread: the limit, but
it blocks the loop. TensorFlow / PyTorch / JAX rows appear only when installed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import importlib.util
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
import numpy as np

import aiotensor as at

from ._harness import Report, Stat, calibrated, calibrated_sync, interleaved, loop_factories, ratio, run_on

FULL_SIZES = (16, 1024, 16_384, 65_536, 262_144, 1_048_576)
QUICK_SIZES = (16, 65_536)
SMALL, MID = 16, 65_536  # the "16 float32" and "256x256"

NUMPY = "numpy on the loop thread"
AUTO = "aiotensor (auto inline/pool)"
POOL = "aiotensor (always pool)"
TO_THREAD = "asyncio.to_thread"
EXECUTOR = "loop.run_in_executor"
ANYIO = "anyio.to_thread.run_sync"


def _shape(size: int) -> tuple[int, ...]:
    side = round(size**0.5)
    return (side, side) if size >= 65_536 and side * side == size else (size,)


def _frameworks(a: np.ndarray[Any, Any]) -> dict[str, Callable[[], object]]:
    """Synchronous adds in other eager frameworks, when they are installed."""
    found: dict[str, Callable[[], object]] = {}
    if importlib.util.find_spec("torch") is not None:
        torch = importlib.import_module("torch")  # optional, untyped here

        ta = torch.from_numpy(a.copy())
        found["PyTorch torch.add (sync)"] = lambda: torch.add(ta, ta)
    if importlib.util.find_spec("jax") is not None:
        jnp = importlib.import_module("jax.numpy")

        ja = jnp.asarray(a)
        found["JAX jnp.add().block_until_ready() (sync)"] = lambda: jnp.add(ja, ja).block_until_ready()
    if importlib.util.find_spec("tensorflow") is not None:
        tf = importlib.import_module("tensorflow")

        fa = tf.constant(a)
        found["TensorFlow eager tf.add (sync)"] = lambda: tf.add(fa, fa)
    return found


async def _one_size(size: int, rounds: int, budget: float) -> dict[str, Stat]:
    a = np.random.default_rng(0).random(_shape(size), dtype=np.float32)
    b = a + 1
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1)
    variants: dict[str, Callable[[], Awaitable[float]]] = {}
    try:
        variants[NUMPY] = calibrated_sync(lambda: np.add(a, b), budget)
        async with (
            at.AsyncEagerSession() as s,
            at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0)) as sp,
        ):
            ta, tb = await s.constant(a), await s.constant(b)
            pa, pb = await sp.constant(a), await sp.constant(b)
            variants[AUTO] = await calibrated(lambda: s.add(ta, tb), budget)
            variants[POOL] = await calibrated(lambda: sp.add(pa, pb), budget)
            variants[TO_THREAD] = await calibrated(lambda: asyncio.to_thread(np.add, a, b), budget)
            variants[EXECUTOR] = await calibrated(lambda: loop.run_in_executor(pool, np.add, a, b), budget)
            variants[ANYIO] = await calibrated(lambda: anyio.to_thread.run_sync(np.add, a, b), budget)
            for label, fn in _frameworks(a).items():
                variants[label] = calibrated_sync(fn, budget)
            if size == SMALL:
                variants["await asyncio.sleep(0) (one loop trip)"] = await calibrated(lambda: asyncio.sleep(0), budget)
            return await interleaved(variants, rounds)
    finally:
        pool.shutdown()


async def _all_sizes(sizes: tuple[int, ...], rounds: int, budget: float) -> dict[int, dict[str, Stat]]:
    return {size: await _one_size(size, rounds, budget) for size in sizes}


def run(report: Report) -> None:
    """Measure every variant at every size on every loop; record target 1."""
    sizes = QUICK_SIZES if report.quick else FULL_SIZES
    budget = 0.02 if report.quick else 0.08
    for loop_name in loop_factories():
        results = run_on(loop_name, _all_sizes(sizes, report.rounds, budget))
        for size in sizes:
            r = results[size]
            base = r[NUMPY]
            t = report.table(
                f"float32 add, {size} elements {_shape(size)}, {loop_name} loop",
                "µs/op",
                ratio_label=f"x {NUMPY}",
                digits=2,
            )
            for label, stat in r.items():
                t.add(label, stat, ratio(stat, base))
            series = report.series.setdefault(f"latency_{loop_name}", {})
            for label, stat in r.items():
                if not label.startswith("await asyncio.sleep"):
                    series.setdefault(label, []).append((float(size), stat.median))
        small, mid = results.get(SMALL), results.get(MID)
        if small is not None:
            r_np = ratio(small[AUTO], small[NUMPY])
            r_thread = ratio(small[TO_THREAD], small[AUTO])
            report.target(
                1,
                f"small add (16 float32) <= 10x raw numpy and >= 10x faster than to_thread ({loop_name})",
                f"{small[AUTO].median:.2f} µs/op = {r_np:.1f}x numpy; to_thread is {r_thread:.1f}x slower",
                r_np <= 10 and r_thread >= 10,
            )
        if mid is not None:
            r_mid = ratio(mid[AUTO], mid[NUMPY])
            report.target(
                1,
                f"mid add (256x256 float32) <= 1.5x raw numpy ({loop_name})",
                f"{mid[AUTO].median:.1f} µs/op = {r_mid:.2f}x numpy",
                r_mid <= 1.5,
            )
