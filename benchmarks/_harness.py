"""Measurement records, statistics over rounds, and the event loops every scenario runs on."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

try:
    import uvloop
except ImportError:  # uvloop is optional: its rows are skipped
    uvloop = None  # type: ignore[assignment]


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loops to measure on: the default asyncio loop and uvloop when installed."""
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    if uvloop is not None:
        loops["uvloop"] = uvloop.new_event_loop
    return loops


def run_on(loop_name: str, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a fresh loop of the named kind."""
    with asyncio.Runner(loop_factory=loop_factories()[loop_name]) as runner:
        return runner.run(main)


@dataclass(frozen=True, slots=True)
class Stat:
    """One quantity measured over several rounds."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        """The median over rounds."""
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        """The smallest round."""
        return min(self.values)

    @property
    def high(self) -> float:
        """The largest round."""
        return max(self.values)

    def fmt(self, digits: int = 1) -> str:
        """``median (min-max)``."""
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


@dataclass(slots=True)
class Row:
    """A table row: a label, a measured statistic and, optionally, a ratio to the table's baseline."""

    label: str
    stat: Stat
    ratio: float | None = None
    note: str = ""


@dataclass(slots=True)
class Table:
    """Rows measured in the same run under the same conditions."""

    title: str
    unit: str
    rows: list[Row] = field(default_factory=list)
    ratio_label: str = ""
    digits: int = 1
    note: str = ""

    def add(self, label: str, stat: Stat, ratio: float | None = None, note: str = "") -> Row:
        """Append a row and return it."""
        row = Row(label, stat, ratio, note)
        self.rows.append(row)
        return row

    def get(self, label: str) -> Stat:
        """The statistic of the row named ``label``."""
        for row in self.rows:
            if row.label == label:
                return row.stat
        raise KeyError(label)


@dataclass(slots=True)
class Target:
    """A goal for one measured ratio: what was measured against which baseline, the result, and whether it was reached.

    ``number`` groups goals of one scenario in code; it is not shown.
    """

    number: int
    text: str
    measured: str
    met: bool | None  # None: measured, but not judged in this run (quick mode: too few rounds)


@dataclass(slots=True)
class Report:
    """Everything one run of the suite measured."""

    quick: bool
    rounds: int
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    series: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    sections: list[tuple[str, str]] = field(default_factory=list)

    def table(self, title: str, unit: str, **kwargs: Any) -> Table:
        """A new table appended to the report."""
        t = Table(title, unit, **kwargs)
        self.tables.append(t)
        return t

    def target(self, number: int, text: str, measured: str, met: bool | None) -> None:
        """Record a target's verdict."""
        self.targets.append(Target(number, text, measured, met))


def settle_allocator() -> None:
    """Put glibc's malloc in the state of a process that has run a while, before measuring.

    glibc raises its mmap threshold (and its trim threshold, twice that) to the size of
    the largest mmapped block freed so far. Until a block larger than the arrays being
    measured has been freed, each 256 KiB temporary may be a fresh ``mmap`` or sit
    above a heap top that is trimmed at every free, and then every page of it faults:
    numpy's own 10-op chain on 256x256 float32 measured 66 µs or 265 µs in the same
    benchmark depending on what earlier code happened to free. Freeing one 16 MiB
    block settles it for every size used here (mmap threshold 16 MiB, trim threshold
    32 MiB), for the baselines and for aiotensor alike. (A block over 32 MiB, glibc's
    largest dynamic threshold on 64-bit, would leave the thresholds where they are.)
    """
    block = np.ones(4 << 20, dtype=np.float32)  # 16 MiB: allocated with mmap, every page touched
    del block


def rounds_of(rounds: int, measure: Callable[[], float]) -> Stat:
    """Call ``measure`` once per round and collect its values."""
    return Stat(tuple(measure() for _ in range(rounds)))


async def arounds_of(rounds: int, measure: Callable[[], Awaitable[float]]) -> Stat:
    """Await ``measure()`` once per round and collect its values."""
    return Stat(tuple([await measure() for _ in range(rounds)]))


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Mean µs per call of a synchronous ``fn`` over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


async def aper_call_us(fn: Callable[[], Awaitable[object]], n: int) -> float:
    """Mean µs per call of ``await fn()`` over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n * 1e6


def iterations_for(us_per_call: float, budget_s: float, lo: int = 5, hi: int = 50_000) -> int:
    """How many calls fit one round's time budget."""
    return max(lo, min(hi, int(budget_s * 1e6 / max(us_per_call, 0.05))))


def ratio(a: Stat, b: Stat) -> float:
    """``median(a) / median(b)``."""
    return a.median / b.median if b.median else float("inf")


async def calibrated(fn: Callable[[], Awaitable[object]], budget: float) -> Callable[[], Awaitable[float]]:
    """One round of ``await fn()``, sized to ``budget`` seconds: a coroutine function giving µs/call."""
    await fn()
    n = iterations_for(await aper_call_us(fn, 3), budget)
    return lambda: aper_call_us(fn, n)


def calibrated_sync(fn: Callable[[], object], budget: float) -> Callable[[], Awaitable[float]]:
    """The same for a synchronous ``fn`` (it still runs on the loop thread, between awaits)."""
    n = iterations_for(per_call_us(fn, 3), budget)

    async def one_round() -> float:
        return per_call_us(fn, n)

    return one_round


async def interleaved(variants: dict[str, Callable[[], Awaitable[float]]], rounds: int) -> dict[str, Stat]:
    """Round-robin over the variants, ``rounds`` times: noise on a shared machine hits them all alike."""
    values: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(rounds):
        for label, one_round in variants.items():
            values[label].append(await one_round())
    return {label: Stat(tuple(v)) for label, v in values.items()}
