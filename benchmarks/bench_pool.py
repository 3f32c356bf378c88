"""Issue 11's execution targets: the hop to the pool, loop lag under big kernels, large adds.

``python -m benchmarks.bench_pool`` prints three groups of tables, on asyncio and uvloop,
each variant interleaved with its baseline round by round:

- **hop**: a tiny add forced to the pool (``inline_threshold_us=0``), one at a time and
  32 in flight: aiotensor on its own pool, on the ``concurrent.futures`` path it
  replaced (``executor=``), the pool's bare hop, against ``asyncio.to_thread`` of the
  same numpy call; wall time per op and the loop thread's CPU per op (``thread_time``).
- **lag**: four 2048x2048 float32 matmuls through a session while a 1 ms ticker
  records how late it wakes (p99), with worker priority ``low``, ``idle`` and
  ``normal`` (off), and the matmuls' throughput against four sequential numpy
  products. Each round opens a session with a pool of its own and closes it, so that
  BLAS threads lowered for one variant are restored before the next.
- **large add**: a float32 add through a session (split across the workers above
  ``_chunked.CHUNK_MIN_BYTES``), the same with one worker (never split), and numpy on
  the loop thread.

Nothing is written to the checkout. ``run(report)`` is the same as a scenario of
``python -m benchmarks``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import aiotensor as at
from aiotensor._backends._pool import WorkerPool

from ._harness import Report, Stat, loop_factories, ratio, run_on

CORES = os.cpu_count() or 1
IN_FLIGHT = 32
TO_THREAD = "asyncio.to_thread(np.add)"
OWN = "aiotensor op, own pool"
OWN_NORMAL = "aiotensor op, own pool, worker_priority='normal'"
OLD = "aiotensor op, concurrent.futures (executor=)"
BARE = "WorkerPool.run(np.add) (the bare hop)"
PRIORITIES: tuple[at.SessionConfig, ...] = tuple(
    at.SessionConfig(max_workers=CORES, worker_priority=p) for p in ("low", "idle", "normal")
)

# A round's measure: () -> (wall µs per op, loop-thread CPU µs per op).
Measure = Callable[[], Awaitable[tuple[float, float]]]


async def _timed(batch: Callable[[], Awaitable[object]], per_batch: int, n: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(n):
        await batch()
    ops = n * per_batch
    return (time.perf_counter() - wall) / ops * 1e6, (time.thread_time() - cpu) / ops * 1e6


async def _interleave(variants: dict[str, Measure], rounds: int) -> dict[str, tuple[Stat, Stat]]:
    walls: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for label, measure in variants.items():
            wall, cpu = await measure()
            walls[label].append(wall)
            cpus[label].append(cpu)
    return {k: (Stat(tuple(walls[k])), Stat(tuple(cpus[k]))) for k in variants}


async def _hop(rounds: int, n: int) -> dict[str, dict[str, tuple[Stat, Stat]]]:
    a = np.ones(16, np.float32)
    forced = at.SessionConfig(inline_threshold_us=0, max_workers=CORES)
    forced_normal = at.SessionConfig(inline_threshold_us=0, max_workers=CORES, worker_priority="normal")
    old_pool = concurrent.futures.ThreadPoolExecutor(CORES, thread_name_prefix="old")
    bare = WorkerPool(CORES)
    out: dict[str, dict[str, tuple[Stat, Stat]]] = {}
    try:
        async with (
            at.AsyncEagerSession(config=forced) as own,
            at.AsyncEagerSession(config=forced_normal) as own_normal,
            at.AsyncEagerSession(executor=old_pool) as old,
        ):
            x_own, x_normal, x_old = await own.constant(a), await own_normal.constant(a), await old.constant(a)
            calls: dict[str, Callable[[], Awaitable[object]]] = {
                TO_THREAD: lambda: asyncio.to_thread(np.add, a, 1.0),
                OWN: lambda: own.add(x_own, 1.0),
                OWN_NORMAL: lambda: own_normal.add(x_normal, 1.0),
                OLD: lambda: old.add(x_old, 1.0),
                BARE: lambda: bare.run(np.add, a, 1.0),
            }
            for mode, per_batch in (("one at a time", 1), (f"{IN_FLIGHT} in flight", IN_FLIGHT)):
                variants: dict[str, Measure] = {}
                for label, call in calls.items():
                    if per_batch == 1:
                        batch: Callable[[], Awaitable[object]] = call
                    else:

                        async def batch(call: Callable[[], Awaitable[object]] = call) -> object:
                            return await asyncio.gather(*[call() for _ in range(IN_FLIGHT)])

                    await batch()  # warm: threads started, caches filled

                    async def measure(batch: Callable[[], Awaitable[object]] = batch, k: int = per_batch) -> Any:
                        return await _timed(batch, k, max(5, n // k))

                    variants[label] = measure
                out[mode] = await _interleave(variants, rounds)
    finally:
        old_pool.shutdown()
        bare.shutdown()
    return out


async def _ticker(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - t - 0.001) * 1e3)


async def _matmuls_with_ticker(config: at.SessionConfig | None, a: np.ndarray[Any, Any]) -> tuple[float, float]:
    """(p99 lag ms, seconds for the four products); ``config=None``: the ticker alone for as long."""
    lags: list[float] = []
    stop = asyncio.Event()
    ticker = asyncio.ensure_future(_ticker(lags, stop))
    await asyncio.sleep(0.02)
    lags.clear()
    start = time.perf_counter()
    if config is None:
        await asyncio.sleep(0.3)
    else:
        async with at.AsyncEagerSession(config=config) as s:
            x = await s.constant(a)
            await asyncio.gather(*[s.matmul(x, x) for _ in range(4)])
    elapsed = time.perf_counter() - start
    stop.set()
    await ticker
    lags.sort()
    return lags[min(len(lags) - 1, int(len(lags) * 0.99))], elapsed


async def _lag(rounds: int, n: int) -> dict[str, tuple[Stat, Stat]]:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    p99: dict[str, list[float]] = {}
    secs: dict[str, list[float]] = {}
    labels = {"ticker alone": None} | {f"worker_priority={c.worker_priority!r}": c for c in PRIORITIES}
    a @ a  # BLAS threads started
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(4):
            a @ a  # numpy, sequential, on the loop thread (the ticker is not running)
        secs.setdefault("numpy, 4 sequential products", []).append(time.perf_counter() - start)
        for label, config in labels.items():
            lag, elapsed = await _matmuls_with_ticker(config, a)
            p99.setdefault(label, []).append(lag)
            secs.setdefault(label, []).append(elapsed)
    return {k: (Stat(tuple(p99.get(k, [0.0]))), Stat(tuple(v))) for k, v in secs.items()}


async def _large_add(rounds: int, n: int, sides: tuple[int, ...]) -> dict[int, dict[str, Stat]]:
    return {side: await _one_add(rounds, n, side) for side in sides}


async def _one_add(rounds: int, n: int, side: int) -> dict[str, Stat]:
    a = np.random.default_rng(0).random((side, side), dtype=np.float32)
    times: dict[str, list[float]] = {}
    async with (
        at.AsyncEagerSession(config=at.SessionConfig(max_workers=CORES)) as split,
        at.AsyncEagerSession(config=at.SessionConfig(max_workers=1)) as single,
    ):
        xs, x1 = await split.constant(a), await single.constant(a)
        variants: dict[str, Callable[[], Awaitable[object]]] = {
            "numpy on the loop thread": lambda: _sync(np.add, a, a),
            f"aiotensor add, {CORES} workers (split when large)": lambda: split.add(xs, xs),
            "aiotensor add, 1 worker (never split)": lambda: single.add(x1, x1),
        }
        for call in variants.values():
            await call()
        for _ in range(rounds):
            for label, call in variants.items():
                start = time.perf_counter()
                for _ in range(n):
                    await call()
                times.setdefault(label, []).append((time.perf_counter() - start) / n * 1e6)
    return {k: Stat(tuple(v)) for k, v in times.items()}


async def _sync(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def run(report: Report, *, hop_n: int | None = None, side: int | None = None) -> None:
    """Measure the three groups on every loop and record the issue's targets."""
    quick = report.quick
    hop_n = hop_n or (200 if quick else 2000)
    side = side or (512 if quick else 2048)
    for loop_name in loop_factories():
        hop = run_on(loop_name, _hop(report.rounds, hop_n))
        for mode, results in hop.items():
            base_wall, base_cpu = results[TO_THREAD]
            t = report.table(f"hop: float32[16] + 1.0 forced to the pool, {mode}, {loop_name}", "µs/op",
                             ratio_label=f"x {TO_THREAD}", digits=2)  # fmt: skip
            c = report.table(f"loop-thread CPU per op, {mode}, {loop_name}", "µs/op",
                             ratio_label=f"x {TO_THREAD}", digits=2)  # fmt: skip
            for label, (wall, cpu) in results.items():
                t.add(label, wall, ratio(wall, base_wall))
                c.add(label, cpu, ratio(cpu, base_cpu))
            limit = 0.6 if mode == "one at a time" else 0.3
            r = ratio(results[OWN][0], base_wall)
            report.target(11, f"pooled tiny op, {mode}: <= {limit}x asyncio.to_thread ({loop_name})",
                          f"{r:.2f}x (priority normal {ratio(results[OWN_NORMAL][0], base_wall):.2f}x,"
                          f" old path {ratio(results[OLD][0], base_wall):.2f}x)", r <= limit)  # fmt: skip
    lag = run_on("asyncio", _lag(report.rounds, side))
    seq = lag["numpy, 4 sequential products"][1]
    t = report.table(f"ticker p99 lag during four {side}x{side} float32 matmuls (asyncio)", "ms", digits=2)
    s = report.table(f"four {side}x{side} float32 matmuls", "s", ratio_label="throughput x numpy", digits=3)
    for label, (p99, secs) in lag.items():
        if label != "numpy, 4 sequential products":
            t.add(label, p99)
        s.add(label, secs, ratio(seq, secs))
    low_p99, low_secs = lag["worker_priority='low'"]
    off_p99 = lag["worker_priority='normal'"][0]
    report.target(11, f"ticker p99 <= 1.0 ms during four {side}^2 matmuls, throughput >= 0.97x numpy",
                  f"p99 {low_p99.median:.2f} ms (off: {off_p99.median:.2f} ms),"
                  f" throughput {ratio(seq, low_secs):.2f}x",
                  low_p99.median <= 1.0 and ratio(seq, low_secs) >= 0.97)  # fmt: skip
    sides = (512, 1024) if quick else (1024, 2048)
    adds = run_on("asyncio", _large_add(report.rounds, 5 if quick else 20, sides))
    for n, stats in adds.items():
        base = stats["numpy on the loop thread"]
        t = report.table(f"float32 add {n}x{n} (asyncio, {CORES} cores)", "µs/op", ratio_label="x numpy")
        for label, stat in stats.items():
            t.add(label, stat, ratio(stat, base))


def main() -> None:
    """Print the tables and targets; nothing is written."""
    from ._report import machine, print_console

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, quick 2)")
    args = parser.parse_args()
    report = Report(quick=args.quick, rounds=args.rounds or (2 if args.quick else 7))
    run(report)
    print_console(report)
    print(machine())


if __name__ == "__main__":
    main()
