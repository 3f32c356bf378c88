"""Targets 2, 3 and 7: big BLAS kernels (throughput, loop responsiveness, no oversubscription).

Throughput is reported as the time per matmul against raw numpy doing the same
matmuls one after another on the loop thread (the BLAS limit: numpy already uses
every core). ``asyncio.to_thread`` with 8 concurrent tasks is what oversubscription
looks like: two pool threads each running a BLAS product that wants every core.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import numpy as np

import aiotensor as at
from aiotensor._backends._blas import gate_slots

from ._harness import Report, Stat, ratio, run_on

CONCURRENT = 8


def _matrix(n: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(0).random((n, n), dtype=np.float32)


async def _throughput(n: int, rounds: int) -> dict[str, Stat]:
    a = _matrix(n)
    out: dict[str, list[float]] = {}

    def record(label: str, seconds: float, count: int) -> None:
        out.setdefault(label, []).append(seconds / count * 1e3)

    async with at.AsyncEagerSession() as s:
        ta = await s.constant(a)
        await s.matmul(ta, ta)  # warm-up: BLAS threads started, pages touched
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(CONCURRENT):
                np.matmul(a, a)
            record("numpy, sequential on the loop thread", time.perf_counter() - start, CONCURRENT)

            start = time.perf_counter()
            for _ in range(CONCURRENT):
                await s.matmul(ta, ta)
            record("aiotensor, 1 task", time.perf_counter() - start, CONCURRENT)

            start = time.perf_counter()
            await asyncio.gather(*(s.matmul(ta, ta) for _ in range(CONCURRENT)))
            record(f"aiotensor, {CONCURRENT} concurrent tasks", time.perf_counter() - start, CONCURRENT)

            start = time.perf_counter()
            await asyncio.gather(*(asyncio.to_thread(np.matmul, a, a) for _ in range(CONCURRENT)))
            record(f"asyncio.to_thread, {CONCURRENT} concurrent tasks", time.perf_counter() - start, CONCURRENT)
        del ta
    return {label: Stat(tuple(v)) for label, v in out.items()}


async def _ticker_p99(n: int, how: str, count: int = 4) -> float:
    """p99 lag (ms) of a 1 ms ticker while ``count`` n x n matmuls run ``how``."""
    a = _matrix(n)
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - start - 0.001) * 1e3)

    async with at.AsyncEagerSession() as s:
        ta = await s.constant(a)
        tick = asyncio.get_running_loop().create_task(ticker())
        await asyncio.sleep(0.01)
        if how == "aiotensor":
            await asyncio.gather(*(s.matmul(ta, ta) for _ in range(count)))
        elif how == "to_thread":
            await asyncio.gather(*(asyncio.to_thread(np.matmul, a, a) for _ in range(count)))
        elif how == "on the loop":
            for _ in range(count):
                np.matmul(a, a)
        else:  # idle: the ticker's own jitter
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.005)
        done.set()
        await tick
        del ta
    return statistics.quantiles(lags, n=100)[98] if len(lags) >= 2 else max(lags, default=0.0)


async def _responsiveness(n: int, rounds: int) -> dict[str, Stat]:
    hows = ("idle", "aiotensor", "to_thread", "on the loop")
    return {how: Stat(tuple([await _ticker_p99(n, how) for _ in range(rounds)])) for how in hows}


def run(report: Report) -> None:
    """Targets 2 (throughput), 3 (ticker lag) and 7 (BLAS gate) on the default loop."""
    sizes = (512, 1024) if report.quick else (1024, 2048)
    rounds = max(2, report.rounds - 2)
    info = f"BLAS threads {at.blas_threads()}, products admitted at once {gate_slots()}"
    for n in sizes:
        r = run_on("asyncio", _throughput(n, rounds))
        base = r["numpy, sequential on the loop thread"]
        t = report.table(
            f"float32 matmul {n}x{n}, {CONCURRENT} products per round", "ms/product", ratio_label="throughput x numpy"
        )
        for label, stat in r.items():
            t.add(label, stat, ratio(base, stat))
        for label in ("aiotensor, 1 task", f"aiotensor, {CONCURRENT} concurrent tasks"):
            tp = ratio(base, r[label])
            report.target(2, f"matmul {n}: {label} throughput >= 0.97x numpy", f"{tp:.2f}x", tp >= 0.97)
        over = ratio(base, r[f"asyncio.to_thread, {CONCURRENT} concurrent tasks"])
        ours = ratio(base, r[f"aiotensor, {CONCURRENT} concurrent tasks"])
        report.target(
            7,
            f"matmul {n}, {CONCURRENT} concurrent: no oversubscription ({info})",
            f"aiotensor {ours:.2f}x numpy; ungated to_thread {over:.2f}x",
            ours >= over * 0.97,
        )
    n = sizes[-1]
    r = run_on("asyncio", _responsiveness(n, rounds))
    t = report.table(f"1 ms ticker p99 lag while four {n}x{n} matmuls run", "ms", digits=2)
    for label, stat in r.items():
        t.add(label, stat)
    lag = r["aiotensor"].median
    report.target(3, f"ticker p99 lag <= 2 ms during four {n}x{n} matmuls", f"{lag:.2f} ms", lag <= 2.0)
