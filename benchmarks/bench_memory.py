"""Memory on the demo's n x m loop per strategy, and IN_BACKGROUND's drop-to-free latency.

The loop: ``n`` adds per iteration on float32[size], ``m`` iterations, only the last
result kept (``aiotensor demo``'s loop). The program references at most four tensors
at any moment (the input ``x``, the last kept result, and one op's input and
output): that is the live set, and ``peak_bytes / live set`` is the ratio reported.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time

import aiotensor as at

from ._harness import Report, Stat, run_on

LIVE_SET_TENSORS = 4
S = at.ResourceCleanupStrategy


async def seeds_loop(
    strategy: at.ResourceCleanupStrategy, n: int, m: int, size: int, config: at.SessionConfig | None = None
) -> tuple[int, list[int]]:
    """Peak bytes and live bytes after each iteration."""
    live: list[int] = []
    async with at.AsyncEagerSession(cleanup=strategy, config=config) as s:
        x = await s.random_normal((size,), dtype="float32", seed=0)
        last = x
        for _ in range(m):
            y = x
            for _ in range(n):
                y = await s.add(y, 1.0)
            last = y
            live.append(s.stats().live_bytes)
        peak = s.stats().peak_bytes
        del last, y, x
    return peak, live


async def drop_to_free_us(samples: int) -> list[float]:
    """µs from dropping a handle to its buffer being freed, IN_BACKGROUND, on an idle loop."""
    out: list[float] = []
    async with at.AsyncEagerSession() as s:
        gc.disable()  # a collection in the middle would be measured, not the strategy
        try:
            for _ in range(samples):
                t = await s.zeros(1000, dtype="float32")
                await asyncio.sleep(0.0005)  # idle: nothing else queued
                freed = s.stats().freed
                start = time.perf_counter()
                del t
                while s.stats().freed == freed:  # noqa: ASYNC110 -- polling is what is measured
                    await asyncio.sleep(0)
                out.append((time.perf_counter() - start) * 1e6)
        finally:
            gc.enable()
    return out


def run(report: Report) -> None:
    """Peak / live-set per strategy for each m, the live-bytes series, and the latency."""
    n, size = 10, 10_000
    ms = (100,) if report.quick else (100, 1000)
    live_set = LIVE_SET_TENSORS * size * 4
    t = report.table(
        f"the demo's loop: {n} adds x m iterations on float32[{size}], last result kept (live set {live_set:,} B)",
        "peak / live set",
        digits=2,
    )
    variants: list[tuple[str, at.ResourceCleanupStrategy, at.SessionConfig | None]] = [
        (strategy.name, strategy, None) for strategy in S
    ]
    variants.append(("IN_BACKGROUND, always pool", S.IN_BACKGROUND, at.SessionConfig(inline_threshold_us=0)))
    limits = {S.ON_SAFE_POINTS: 1.5, S.IN_BACKGROUND: 2.0}
    for m in ms:
        for label, strategy, config in variants:
            peaks: list[float] = []
            series: list[int] = []
            for _ in range(2 if report.quick else 3):
                peak, series = run_on("asyncio", seeds_loop(strategy, n, m, size, config))
                peaks.append(peak / live_set)
            stat = Stat(tuple(peaks))
            t.add(f"{label}, m={m}", stat)
            if m == ms[-1]:
                report.series.setdefault("memory", {})[label] = [(i + 1.0, float(b)) for i, b in enumerate(series)]
            bound = limits.get(strategy)
            if bound is not None:
                report.target(
                    4, f"{label}, m={m}: peak / live set <= {bound}", f"{stat.median:.2f}", stat.high <= bound
                )
    samples = run_on("asyncio", drop_to_free_us(50 if report.quick else 300))
    p99 = statistics.quantiles(samples, n=100)[98]
    lat = report.table("IN_BACKGROUND drop-to-free latency on an idle loop", "µs", digits=1)
    lat.add("median of samples", Stat((statistics.median(samples),)))
    lat.add("p99 of samples", Stat((p99,)))
    report.target(4, "IN_BACKGROUND drop-to-free p99 <= 1 ms (idle loop)", f"{p99:.0f} µs", p99 <= 1000)
