"""Targets 5 and 6, and the break-even that sets the inline threshold.

- Request-scoped sessions: ``open + one op + close`` of a child session, against the
  same op in a session that is already open.
- Fused functions: ten chained small ops as one dispatch, against one dispatch.
- Break-even: for each size, numpy's own time, the op inline, the op on the pool, and
  how much of the *loop thread's* CPU one pool dispatch costs. An op whose kernel
  takes less than that costs the loop less inline than dispatched.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import aiotensor as at
from aiotensor._cost import estimate_us
from aiotensor._opdef import OPS

from ._harness import (
    Report,
    Stat,
    aper_call_us,
    calibrated,
    calibrated_sync,
    interleaved,
    iterations_for,
    loop_factories,
    per_call_us,
    ratio,
    run_on,
)

CHAIN = 10
POOL = at.SessionConfig(inline_threshold_us=0)
ALWAYS_INLINE = at.SessionConfig(inline_threshold_us=1e9)


async def _stat(fn: Callable[[], Awaitable[object]], rounds: int, budget: float) -> Stat:
    await fn()
    n = iterations_for(await aper_call_us(fn, 3), budget)
    return Stat(tuple([await aper_call_us(fn, n) for _ in range(rounds)]))


async def _request(rounds: int, budget: float) -> dict[str, Stat]:
    variants: dict[str, Callable[[], Awaitable[float]]] = {}
    async with at.AsyncEagerSession() as app:
        w = await app.constant(np.ones(16, np.float32))
        variants["add in an open session"] = await calibrated(lambda: app.add(w, 1.0), budget)
        for strategy in (at.ResourceCleanupStrategy.IN_BACKGROUND, at.ResourceCleanupStrategy.ON_SAFE_POINTS):

            async def request(strategy: at.ResourceCleanupStrategy = strategy) -> None:
                async with at.AsyncEagerSession(parent=app, cleanup=strategy) as r:
                    await r.add(w, 1.0)

            variants[f"open child session + add + close ({strategy.name})"] = await calibrated(request, budget)
        return await interleaved(variants, rounds)


def _chain_np(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    for i in range(CHAIN):
        x = x + 1.0 if i % 2 == 0 else x * 0.5
    return x


def _chain_fused(ops: at.FusedOps, x: Any) -> Any:
    for i in range(CHAIN):
        x = ops.add(x, 1.0) if i % 2 == 0 else ops.multiply(x, 0.5)
    return x


async def _chain(s: at.AsyncEagerSession, x: at.Tensor) -> None:
    y = x
    for i in range(CHAIN):
        y = await (s.add(y, 1.0) if i % 2 == 0 else s.multiply(y, 0.5))


async def _fused(rounds: int, budget: float) -> dict[str, Stat]:
    a = np.ones(16, np.float32)
    variants: dict[str, Callable[[], Awaitable[float]]] = {
        f"numpy, {CHAIN} ops on the loop thread": calibrated_sync(lambda: _chain_np(a), budget)
    }
    async with at.AsyncEagerSession() as s, at.AsyncEagerSession(config=POOL) as sp:
        x, xp = await s.constant(a), await sp.constant(a)
        fused = s.function(_chain_fused)
        variants["one add (auto)"] = await calibrated(lambda: s.add(x, 1.0), budget)
        variants["one add (always pool)"] = await calibrated(lambda: sp.add(xp, 1.0), budget)
        variants[f"{CHAIN} awaited ops (auto)"] = await calibrated(lambda: _chain(s, x), budget)
        variants[f"{CHAIN} awaited ops (always pool)"] = await calibrated(lambda: _chain(sp, xp), budget)
        variants[f"fused function of {CHAIN} ops"] = await calibrated(lambda: fused(x), budget)
        return await interleaved(variants, rounds)


async def _break_even(sizes: tuple[int, ...], rounds: int, budget: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for op, kernel in (("add", np.add), ("exp", np.exp)):
        for size in sizes:
            a = np.random.default_rng(0).random(size, dtype=np.float32)
            args = (a, a) if op == "add" else (a,)
            row: dict[str, Any] = {"op": op, "size": size, "estimate": estimate_us(OPS[op], args, {}, None)}
            n = iterations_for(size / 500, budget)
            row["numpy"] = Stat(tuple(per_call_us(functools.partial(kernel, *args), n) for _ in range(rounds)))
            for label, config in (("inline", ALWAYS_INLINE), ("pool", POOL)):
                async with at.AsyncEagerSession(config=config) as s:
                    ts = [await s.constant(x) for x in args]
                    method = getattr(s, op)
                    row[label] = await _stat(functools.partial(method, *ts), rounds, budget)
                    if label == "pool":  # the loop thread's own CPU per dispatched op
                        n = iterations_for(row["pool"].median, budget)
                        cpu = time.thread_time()
                        for _ in range(n):
                            await method(*ts)
                        row["pool loop cpu"] = (time.thread_time() - cpu) / n * 1e6
                    del ts
            rows.append(row)
    return rows


def run(report: Report) -> None:
    """Request overhead (target 5) and fused chains (target 6) on each loop; the break-even table."""
    budget = 0.02 if report.quick else 0.08
    for loop_name in loop_factories():
        r = run_on(loop_name, _request(report.rounds, budget))
        base = r["add in an open session"]
        t = report.table(f"request-scoped session, {loop_name} loop", "µs", ratio_label="x add alone", digits=1)
        for label, stat in r.items():
            t.add(label, stat, ratio(stat, base))
        over = r["open child session + add + close (IN_BACKGROUND)"].median - base.median
        report.target(
            5, f"open + op + close over the op's own cost <= 30 µs ({loop_name})", f"{over:.1f} µs", over <= 30
        )

        f = run_on(loop_name, _fused(report.rounds, budget))
        one_pool = f["one add (always pool)"]
        t = report.table(f"{CHAIN} chained small ops (16 float32), {loop_name} loop", "µs", digits=1,
                         ratio_label="x one pool dispatch")  # fmt: skip
        for label, stat in f.items():
            t.add(label, stat, ratio(stat, one_pool))
        fused = f[f"fused function of {CHAIN} ops"]
        report.target(
            6,
            f"{CHAIN} chained small ops fused <= 2x one dispatch ({loop_name})",
            f"{ratio(fused, one_pool):.2f}x one pool dispatch; {ratio(fused, f[f'{CHAIN} awaited ops (auto)']):.2f}x"
            f" the {CHAIN} ops awaited inline",
            ratio(fused, one_pool) <= 2,
        )
    sizes = (1024, 65_536) if report.quick else (1024, 16_384, 65_536, 262_144, 1_048_576)
    rows = run_on("asyncio", _break_even(sizes, report.rounds, budget))
    t = report.table(
        "break-even: numpy's time vs the loop thread's CPU per pool dispatch (asyncio loop)",
        "µs",
        digits=1,
        note="An op whose numpy time is below 'pool: loop-thread CPU' costs the loop less inline than dispatched;"
        " the default threshold (50 µs of estimated kernel time) bounds how long one inline op may hold the loop.",
    )
    for row in rows:
        name = f"{row['op']} float32[{row['size']}]"
        t.add(f"{name}: numpy", row["numpy"], note=f"estimate {row['estimate']:.1f} µs")
        t.add(f"{name}: aiotensor inline", row["inline"])
        t.add(f"{name}: aiotensor pool (latency)", row["pool"])
        t.add(f"{name}: pool: loop-thread CPU", Stat((row["pool loop cpu"],)))
