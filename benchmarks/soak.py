"""Soak: a million ops on one session, with RSS and live bytes sampled along the way.

Not part of CI (it takes a minute or more). Run it as::

    python benchmarks/soak.py                       # 1,000,000 ops, IN_BACKGROUND, asyncio
    python benchmarks/soak.py --ops 200000 --strategy ON_SAFE_POINTS --loop uvloop

``--workers`` tasks share the session; each repeats a mix of creation, element-wise,
reduction, matmul, ``apply`` (pool) ops, fetches and drops, plus an op cancelled
while its kernel runs every 1,000 ops, so every path that allocates or frees runs a
million times over. RSS comes from ``/proc/self/status`` (``VmRSS``), or
``resource.getrusage`` (a high-water mark) where that file does not exist.

The verdict compares the second half of the run with the first quarter after warm-up:
RSS and live bytes are *flat* when their medians differ by less than ``--tolerance``
(default 5 %, with a 4 MiB floor for allocator noise). A leak of one 24-byte buffer
per op would add 24 MB over the run: far beyond that.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import aiotensor as at

try:
    import uvloop
except ImportError:  # optional
    uvloop = None

SAMPLES = 50
CANCEL_EVERY = 1_000


def rss_bytes() -> int:
    """Resident set size now (Linux), else the peak RSS so far."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of the soak."""

    ops: int
    seconds: float
    rss: int
    live_bytes: int
    live_tensors: int
    pending: int


def _scale(x: Any, k: float) -> Any:
    return np.asarray(x) * k


def _slow(x: Any) -> Any:
    time.sleep(0.001)
    return np.asarray(x) + 1


async def soak(ops: int, workers: int, strategy: at.ResourceCleanupStrategy) -> tuple[list[Sample], at.SessionStats]:
    """Run ``ops`` ops over ``workers`` tasks; sample RSS and the session's stats."""
    samples: list[Sample] = []
    done = 0
    every = max(1, ops // SAMPLES)
    next_sample = every
    start = time.perf_counter()
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        w = await s.random_normal((8, 8), seed=0)
        w_np = await w.numpy()

        def sample() -> None:
            st = s.stats()
            samples.append(
                Sample(done, time.perf_counter() - start, rss_bytes(), st.live_bytes, st.live_tensors, st.pending)
            )

        async def worker(k: int) -> None:
            nonlocal done, next_sample
            i = 0
            while done < ops:
                i += 1
                x = await s.constant(np.full(8, float(k + i) % 7.0))  # 1
                y = await s.add(x, 1.0)  # 2
                z = await s.matmul(y, w)  # 3
                t = await s.sum(z)  # 4
                u = await s.apply(_scale, t, 0.5)  # 5: a pool kernel
                del x, y, z
                value = await u.numpy()
                expected = (np.full(8, float(k + i) % 7.0) + 1.0) @ w_np
                if not np.isclose(value, expected.sum() * 0.5):
                    raise AssertionError(f"wrong value at op {done}: {value} != {expected.sum() * 0.5}")
                del t, u
                done += 5
                if done % CANCEL_EVERY < 5:  # cancel one op while its kernel runs
                    victim = asyncio.ensure_future(s.apply(_slow, w))
                    await asyncio.sleep(0)
                    victim.cancel()
                    try:
                        await victim
                    except asyncio.CancelledError:
                        pass
                    done += 1
                if done >= next_sample:
                    next_sample += every
                    sample()

        gc.collect()
        sample()
        await asyncio.gather(*(worker(k) for k in range(workers)))
        await asyncio.sleep(0.05)  # the last cancelled kernel's result is adopted, then freed
        gc.collect()
        sample()
        final = s.stats()
    return samples, final


def flat(values: list[int], tolerance: float, floor: int) -> tuple[bool, float, float]:
    """Whether the second half's median is within tolerance of the first quarter's (after warm-up)."""
    n = len(values)
    early = values[max(1, n // 10) : max(2, n // 4)]
    late = values[n // 2 :]
    a, b = statistics.median(early), statistics.median(late)
    return abs(b - a) <= max(tolerance * max(a, 1), floor), a, b


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print (and optionally save) its figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--strategy", choices=[x.name for x in at.ResourceCleanupStrategy], default="IN_BACKGROUND")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--json", type=Path, help="write the samples and verdict here")
    args = parser.parse_args(argv)
    strategy = at.ResourceCleanupStrategy[args.strategy]
    factory = uvloop.new_event_loop if args.loop == "uvloop" and uvloop is not None else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        samples, final = runner.run(soak(args.ops, args.workers, strategy))
    last = samples[-1]
    rss_flat, rss_early, rss_late = flat([x.rss for x in samples], args.tolerance, 4 << 20)
    live_flat, live_early, live_late = flat([x.live_bytes for x in samples[:-1]], args.tolerance, 4096)
    print(f"soak: {last.ops:,} ops, {args.workers} tasks, {strategy.name}, {args.loop}: {last.seconds:.1f} s")
    print(f"{'ops':>10} {'s':>7} {'RSS MiB':>9} {'live B':>8} {'live':>6} {'pending':>8}")
    for x in [*samples[:: max(1, len(samples) // 12)], last]:
        row = f"{x.ops:>10,} {x.seconds:>7.1f} {x.rss / 2**20:>9.1f}"
        print(f"{row} {x.live_bytes:>8} {x.live_tensors:>6} {x.pending:>8}")
    print(
        f"RSS: median {rss_early / 2**20:.1f} MiB early, {rss_late / 2**20:.1f} MiB late,"
        f" max {max(x.rss for x in samples) / 2**20:.1f} MiB -> {'flat' if rss_flat else 'GROWING'}"
    )
    print(
        f"live bytes: median {live_early:.0f} early, {live_late:.0f} late, max {max(x.live_bytes for x in samples)}"
        f" -> {'flat' if live_flat else 'GROWING'}; at the end {last.live_bytes} B in {last.live_tensors} tensors"
    )
    print(f"session: allocated {final.allocated:,}, freed {final.freed:,}, peak {final.peak_bytes} B")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "rss_flat": rss_flat,
                    "live_flat": live_flat,
                    "final": asdict(final),
                    "samples": [asdict(x) for x in samples],
                },
                indent=1,
            )
        )
    expected_flat = strategy is not at.ResourceCleanupStrategy.ON_SESSION_CLOSE
    return 0 if (rss_flat and live_flat) or not expected_flat else 1


if __name__ == "__main__":
    sys.exit(main())
