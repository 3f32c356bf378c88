"""Page faults and RSS of the demo's n x m loop: plain numpy against a session with and without its buffer cache.

``python -m benchmarks.bench_alloc [--n 4] [--m 12] [--sizes 1024 4096]``

The loop is the demo's (``y = y + 1`` n times per iteration, m iterations, keeping
only the last result), through ``await s.add`` in a session (IN_BACKGROUND) and as
plain numpy on the loop thread. Minor page faults are the process's ``ru_minflt``
per op, the median over the iterations after the first; RSS is read from
``/proc/self/status`` after the first and the last iteration, so a flat loop shows
the same number twice. Variants are interleaved; nothing is written to the checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import aiotensor as at


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def _measure(step: Callable[[], Awaitable[Any]], n: int, m: int) -> tuple[float, float, float]:
    """(median faults per op over iterations 2..m, RSS after iteration 1, RSS after iteration m)."""
    per_op: list[float] = []
    rss_first = rss_last = 0.0
    for it in range(m):
        before = _faults()
        for _ in range(n):
            await step()
        if it:
            per_op.append((_faults() - before) / n)
        rss = _rss_mb()
        if it == 0:
            rss_first = rss
        rss_last = rss
    return statistics.median(per_op), rss_first, rss_last


async def _variants(side: int, n: int, m: int) -> dict[str, tuple[float, float, float]]:
    x = np.zeros((side, side), np.float32)
    out: dict[str, tuple[float, float, float]] = {}

    state: dict[str, Any] = {"y": x + 0}

    async def numpy_step() -> None:
        state["y"] = state["y"] + np.float32(1.0)

    out["numpy"] = await _measure(numpy_step, n, m)
    del state["y"]
    for label, cache_bytes in (("session, cache on", 3 * x.nbytes), ("session, cache off", 0)):
        config = at.SessionConfig(buffer_cache_bytes=cache_bytes)
        async with at.AsyncEagerSession(config=config) as s:
            holder: dict[str, Any] = {"y": await s.constant(x)}

            async def session_step(s: at.AsyncEagerSession = s, holder: dict[str, Any] = holder) -> None:
                holder["y"] = await s.add(holder["y"], 1.0)

            out[label] = await _measure(session_step, n, m)
            del holder["y"]
    return out


def main() -> None:
    """Print faults per op and RSS for each size and variant."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=4, help="ops per iteration")
    parser.add_argument("--m", type=int, default=12, help="iterations")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    args = parser.parse_args()
    print(f"cores {os.cpu_count()}, load {os.getloadavg()[0]:.2f}; n={args.n} m={args.m}; float32 adds")
    print(f"{'size':>10} {'variant':22} {'faults/op':>10} {'RSS it.1 MB':>12} {'RSS it.m MB':>12}")
    for side in args.sizes:
        rows = asyncio.run(_variants(side, args.n, args.m))
        for label, (faults, first, last) in rows.items():
            print(f"{side}x{side:<5} {label:22} {faults:10.1f} {first:12.0f} {last:12.0f}")


if __name__ == "__main__":
    main()
