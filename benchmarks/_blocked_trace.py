"""Where an awaited split blocked run spends its time (``python -m benchmarks.bench_blocked --trace``).

For the 10-op chain awaited on asyncio (1024x1024 by default), stamps taken on the
threads that do the work, as medians over the traced runs, each relative to the start
of the ``await``: the kernel's job starting on a worker, the split run handing out its
parts (``in_parts``), each participant starting and ending its parts, the split and the
job ending, the loop's inbox settling the job, the awaiting task resuming. In the same
process: numpy's chain, and the floor a split can reach, the same ten ufuncs run in
place by two threads over halves of the rows in blocks of ``SPLIT_BLOCK_ITEMS`` with no
runtime at all (a persistent helper thread woken by an event, the caller doing the
other half: no pool, no loop, no hop).

The stamps wrap private functions (``Job.run``, ``_Inbox.drain``, ``_Blocks.drain``,
``Layout``'s ``in_parts``) for the duration of the trace and put them back; each wrapper
costs ~0.3 µs.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

import aiotensor as at
from aiotensor._backends import _chunked, _jobs
from aiotensor._programs import _blocked_layout, _blocked_split

from ._harness import settle_allocator

_clock = time.perf_counter
#: The stages printed, in order: (label, stamp name).
STAGES = (
    ("job starts on a worker", "job0"),
    ("split run hands out parts", "split0"),
    ("first participant starts", "first0"),
    ("second participant starts", "second0"),
    ("last participant ends", "last1"),
    ("split run returns", "split1"),
    ("job ends", "job1"),
    ("loop settles the job", "settle"),
    ("awaiting task resumes", "resumed"),
)


@contextmanager
def _stamps(stamps: dict[str, Any]) -> Iterator[None]:
    # The private functions wrapped, each writing its time into ``stamps``; put back after.
    # (Layout's and in_parts' own references are the ones replaced: getattr/setattr on them.)
    job_run, inbox_drain = _jobs.Job.run, _jobs._Inbox.drain
    in_parts, blocks = getattr(_blocked_layout, "in_parts"), getattr(_blocked_split, "_Blocks")  # noqa: B009

    def run(self: _jobs.Job) -> bool:
        stamps["job0"] = _clock()
        try:
            return job_run(self)
        finally:
            stamps["job1"] = _clock()

    def drain(self: _jobs._Inbox) -> None:
        stamps.setdefault("settle", _clock())
        inbox_drain(self)

    def parts(*args: Any, **kwargs: Any) -> None:
        stamps["drains"] = []
        stamps["split0"] = _clock()
        in_parts(*args, **kwargs)
        stamps["split1"] = _clock()

    class Traced(_chunked._Blocks):
        # Each run's blocks log into that run's list: a participant that finds nothing
        # left may return after the run's caller resumed (and the next run began).
        __slots__ = ("log",)

        def __init__(self, blocks: list[Callable[[], object]]) -> None:
            super().__init__(blocks)
            self.log: list[tuple[float, float]] = stamps["drains"]

        def drain(self) -> None:
            start = _clock()
            super().drain()
            self.log.append((start, _clock()))

    _jobs.Job.run = run  # type: ignore[method-assign]
    _jobs._Inbox.drain = drain  # type: ignore[method-assign]
    setattr(_blocked_layout, "in_parts", parts)  # noqa: B010
    setattr(_blocked_split, "_Blocks", Traced)  # noqa: B010
    try:
        yield
    finally:
        _jobs.Job.run = job_run  # type: ignore[method-assign]
        _jobs._Inbox.drain = inbox_drain  # type: ignore[method-assign]
        setattr(_blocked_layout, "in_parts", in_parts)  # noqa: B010
        setattr(_blocked_split, "_Blocks", blocks)  # noqa: B010


def hand_split(value: np.ndarray[Any, Any], calls: int) -> float:
    """µs per call (median of rounds) of ``bench_blocked.chain`` split by hand over two threads, no runtime."""
    flat = value.reshape(-1)
    out = np.empty_like(flat)
    block = min(_blocked_split.SPLIT_BLOCK_ITEMS, max(1, flat.size // 2))
    scratch = [np.empty(block, flat.dtype), np.empty(block, flat.dtype)]
    m, a, sub, div, ab = np.multiply, np.add, np.subtract, np.divide, np.absolute

    def walk(lo: int, hi: int, s: np.ndarray[Any, Any]) -> None:
        for i in range(lo, hi, block):
            j = min(i + block, hi)
            x, o, t = flat[i:j], out[i:j], s[: j - i]
            m(x, 2.0, t)
            a(t, 1.0, t)
            sub(t, 0.5, t)
            m(t, t, t)
            div(t, 3.0, t)
            a(t, x, t)
            ab(t, t)
            m(t, 0.1, t)
            sub(t, x, t)
            a(t, 1.0, o)

    go, done, stop = threading.Event(), threading.Event(), [False]
    mid = (flat.size // 2) // block * block or flat.size // 2

    def helper() -> None:
        while True:
            go.wait()
            go.clear()
            if stop[0]:
                return
            walk(mid, flat.size, scratch[1])
            done.set()

    thread = threading.Thread(target=helper, daemon=True)
    thread.start()

    def split() -> None:
        done.clear()
        go.set()
        walk(0, mid, scratch[0])
        done.wait()

    try:
        rounds = []
        for _ in range(7):
            start = _clock()
            for _ in range(calls):
                split()
            rounds.append((_clock() - start) / calls * 1e6)
    finally:
        stop[0] = True
        go.set()
        thread.join()
    return statistics.median(rounds)


async def trace(
    formula: Callable[[Any], Any], shape: tuple[int, ...], runs: int, config: at.SessionConfig | None = None
) -> tuple[dict[str, float], int, float, float]:
    """(stage -> median µs from the await's start, runs that split, numpy µs, hand split µs).

    ``config``: the session's (the default sends a 1024x1024 chain to the pool). The
    interpreter's runs are traced: a run as one compiled loop (``_blocked_layout.JIT``)
    does not split, so that is off for the trace.
    """
    jit = _blocked_layout.JIT
    _blocked_layout.JIT = False
    try:
        return await _trace(formula, shape, runs, config)
    finally:
        _blocked_layout.JIT = jit


async def _trace(
    formula: Callable[[Any], Any], shape: tuple[int, ...], runs: int, config: at.SessionConfig | None
) -> tuple[dict[str, float], int, float, float]:
    settle_allocator()
    value = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    rows: list[dict[str, float]] = []
    async with at.AsyncEagerSession(config=config) as s:
        t = await s.constant(value)
        for _ in range(10):
            await formula(t)
        stamps: dict[str, Any] = {}
        with _stamps(stamps):
            for _ in range(runs):
                stamps.clear()
                pending = formula(t)
                start = _clock()
                result = await pending
                stamps["resumed"] = _clock()
                del result
                drains = sorted(stamps.pop("drains", []))
                if "split0" not in stamps:
                    continue
                if drains:
                    stamps["first0"] = drains[0][0]
                    stamps["last1"] = max(end for _, end in drains)
                if len(drains) > 1:
                    stamps["second0"] = drains[1][0]
                rows.append({k: (v - start) * 1e6 for k, v in stamps.items() if isinstance(v, float)})
        # (Before the session closes: its buffers freed at once may trim malloc's heap,
        # and numpy's temporaries would then fault their pages in again.)
        calls = max(3, int(2e7 // max(1, value.size * 10)))
        numpy_rounds = []
        for _ in range(7):
            start = _clock()
            for _ in range(calls):
                formula(value)
            numpy_rounds.append((_clock() - start) / calls * 1e6)
        hand_us = hand_split(value, calls)
    found = {
        name: statistics.median(r[name] for r in rows) for _, name in STAGES if rows and all(name in r for r in rows)
    }
    return found, len(rows), statistics.median(numpy_rounds), hand_us


def lines(found: dict[str, float], split_runs: int, runs: int, numpy_us: float, hand_us: float) -> list[str]:
    """The trace as printed."""
    out = [f"awaited split runs traced: {split_runs} of {runs} split; numpy's chain {numpy_us:.0f} µs"]
    for label, name in STAGES:
        if name in found:
            out.append(f"  {label:28s} {found[name]:7.0f} µs  ({found[name] / numpy_us:.2f}x numpy)")
    out.append(f"  hand split, two threads, no runtime: {hand_us:.0f} µs ({hand_us / numpy_us:.2f}x numpy)")
    return out


def main(formula: Callable[[Any], Any], shape: tuple[int, ...], runs: int) -> None:
    """Trace ``runs`` awaited runs of ``formula`` on asyncio and print where the time goes."""
    found, split_runs, numpy_us, hand_us = asyncio.run(trace(formula, shape, runs))
    print("\n".join(lines(found, split_runs, runs, numpy_us, hand_us)))
