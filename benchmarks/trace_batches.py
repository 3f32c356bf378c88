"""Where a batched web service's time goes under load: its batches stamped while ``wrk`` drives it.

Serves the web example (``web_service.app``, micro-batched) through
``benchmarks/_traced_app.py``, which stamps each request in and out of the app, each
batch's task (flushed, callers resumed) and each batch's kernel (wall and CPU time on
the thread that ran it, callers, parts), loads it with ``wrk -t1 -cN`` as
``bench_web`` does, and reports over the measured seconds:

* the event loop thread's share of them spent running (its CPU time from ``/proc``,
  Linux): the rest it waited for I/O or for the GIL;
* the share of them in which every request in the app was waiting inside a batch
  (nothing left for the loop to run: the batches and the loop take turns);
* callers per batch; the kernel's µs per caller, in one part and in two;
* the kernel's CPU time over its wall time on its thread (the part of its run it was
  not waiting for the GIL or a core): low when it runs while the loop runs Python.

A profile, not a benchmark: there is no baseline; ``bench_web`` measures the service
against NumPy. ``--switch-interval`` sets the GIL's hand-over interval in the server.

Run::

    python -m benchmarks.trace_batches                 # 16 rows/request, ~15 s
    python -m benchmarks.trace_batches --rows 16 --connections 64 --switch-interval 0.0005
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the checkout's root, not examples/ (see bench_web)
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_web import INSTALL_HINT, thread_cpu, write_bodies, wrk  # noqa: E402 -- needs the checkout on the path
from examples.web_service.server import serve  # noqa: E402

Event = tuple[float, str, Any]


@dataclass
class Summary:
    """What the stamps of one measured window say (see the module docstring)."""

    requests: int
    batches: int
    callers_median: float
    callers_mean: float
    all_in_batches: float  # share of the window
    us_per_caller: dict[int, float]  # parts -> median kernel µs per caller (batches of 2+ callers)
    cpu_over_wall: float  # median
    cpu_over_wall_p10: float


def summarize(events: list[Event], start: float, end: float) -> Summary:
    """The stamps of ``events`` (``_traced_app.EVENTS``) between ``start`` and ``end``.

    Times are ``time.perf_counter()`` seconds, the server's and this process's: on Linux
    (and macOS) one clock for every process (``CLOCK_MONOTONIC``), which the window of
    wrk's run, taken here, relies on.
    """
    in_app = in_batches = 0
    lockstep = 0.0
    last = start
    callers: list[int] = []
    per_caller: dict[int, list[float]] = {}
    ratios: list[float] = []
    requests = 0
    for t, kind, value in sorted(events, key=lambda e: e[0]):
        if t > end:  # (the state at the end is the one its last stretch is judged by)
            break
        if t >= start:
            if in_app and in_batches >= in_app:
                lockstep += t - max(last, start)
            last = t
        if kind == "req":
            in_app += 1
        elif kind == "resp":
            in_app -= 1
            requests += t >= start
        elif kind == "flush":
            in_batches += value
            if t >= start:
                callers.append(value)
        elif kind == "resumed":
            in_batches -= value
        elif kind == "kernel" and t >= start:
            wall, cpu, n, parts = value[:4]
            if wall > 0:
                ratios.append(cpu / wall)
            if n > 1:
                per_caller.setdefault(parts, []).append(wall * 1e6 / n)
    if in_app and in_batches >= in_app:
        lockstep += end - max(last, start)
    ratios.sort()
    return Summary(
        requests=requests,
        batches=len(callers),
        callers_median=statistics.median(callers) if callers else 0.0,
        callers_mean=statistics.fmean(callers) if callers else 0.0,
        all_in_batches=lockstep / (end - start) if end > start else 0.0,
        us_per_caller={k: statistics.median(v) for k, v in sorted(per_caller.items())},
        cpu_over_wall=statistics.median(ratios) if ratios else 0.0,
        cpu_over_wall_p10=ratios[len(ratios) // 10] if ratios else 0.0,
    )


def loop_running_s(pid: int) -> float | None:
    """CPU seconds of the process's main thread, the event loop's (``bench_web.thread_cpu``), or None off Linux."""
    try:
        return thread_cpu(pid)[0]
    except OSError:  # (no /proc)
        return None


def table(s: Summary, rps: float, loop_share: float | None) -> Table:
    """The summary as a table."""
    t = Table(title="The web example's batches under wrk")
    t.add_column("measured")
    t.add_column("value", justify="right")
    t.add_row("requests/s (wrk)", f"{rps:.0f}")
    t.add_row("event loop thread running", "n/a" if loop_share is None else f"{loop_share:.0%}")
    t.add_row("every request in the app waiting inside a batch", f"{s.all_in_batches:.0%}")
    per_batch = f"{s.batches}; {s.callers_median:.0f} ({s.callers_mean:.1f})"
    t.add_row("batches; callers per batch: median (mean)", per_batch)
    for parts, us in s.us_per_caller.items():
        t.add_row(f"kernel µs per caller, batches in {parts} part{'s' if parts > 1 else ''} (median)", f"{us:.1f}")
    t.add_row("kernel CPU / wall on its thread: median (p10)", f"{s.cpu_over_wall:.2f} ({s.cpu_over_wall_p10:.2f})")
    return t


def main(argv: list[str] | None = None) -> int:
    """Serve, load, report."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trace_batches", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="rows per request (default 16)")
    parser.add_argument("--duration", type=int, default=6, help="measured seconds (default 6; 2 s of warm-up first)")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    parser.add_argument("--switch-interval", type=float, default=None, help="sys.setswitchinterval in the server")
    args = parser.parse_args(argv)
    args.threads = 1
    console = Console()
    if shutil.which("wrk") is None:
        console.print(f"wrk is not installed: {INSTALL_HINT}")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "events.pkl"
        env = {"AIOTENSOR_TRACE_FILE": str(trace), "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        if args.switch_interval is not None:
            env["AIOTENSOR_TRACE_SWITCH_INTERVAL"] = str(args.switch_interval)
        script = write_bodies(Path(tmp), args.rows)
        with serve("_traced_app:app", app_dir=ROOT / "benchmarks", env={**os.environ, **env}) as server:
            wrk(server.url, script, args, 2)
            pid = server.process.pid
            ran0, start = loop_running_s(pid), time.perf_counter()
            summary = wrk(server.url, script, args, args.duration)
            ran1, end = loop_running_s(pid), time.perf_counter()
        events: list[Event] = pickle.loads(trace.read_bytes())
    loop_share = None if ran0 is None or ran1 is None else (ran1 - ran0) / (end - start)
    s = summarize(events, start, end)
    console.print(table(s, summary["requests"] / (summary["duration_us"] / 1e6), loop_share))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
