"""The web-service example under a real load generator: aiotensor against NumPy in the handler and ``to_thread``.

Each variant runs as its own ``uvicorn --loop uvloop`` process (one worker, the same BLAS
threads). ``wrk -t1 -c32`` sends ``POST /predict`` (bodies from a Lua script) while a
thread of this process probes ``GET /health`` every 10 ms; the variants take turns in
interleaved rounds, so noise from the shared machine spreads over all of them. Server
RSS comes from ``/proc/PID/status``: before the load, its peak during the load, and 10 s
after the server's last round; CPU per request of the server's event-loop thread and of
its other threads from ``/proc/PID/task``. Each payload size gets fresh servers.

Needs ``wrk`` (Debian/Ubuntu: ``apt-get install wrk``; macOS: ``brew install wrk``);
without it the benchmark says so and exits 0.

Run::

    python benchmarks/bench_web.py              # ~4 minutes on 2 cores
    python benchmarks/bench_web.py --quick      # ~1 minute
    python benchmarks/bench_web.py --write-docs # also writes benchmarks/results/bench_web.md

It changes no tracked file unless given ``--write-docs`` (or ``--markdown PATH``).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: the checkout's root, not examples/ (its distributed.py
    sys.path.insert(0, str(ROOT))  # would shadow the dask package in processes that inherit the path)

from examples.web_service.model import IN_FEATURES  # noqa: E402 -- needs the checkout on the path
from examples.web_service.server import RunningServer, serve  # noqa: E402

USER_FEATURES = 32  # (benchmarks/_web_apps.py: not importable here without the examples on the path)

BASELINES = ("numpy in handler", "numpy to_thread")
#: label -> (uvicorn target, app dir)
EXAMPLE = "aiotensor batched (the example)"
OPS = "aiotensor (op by op)"
#: The user-style service (standardize + linear scoring, op by op, as the web
#: guide teaches) and its own NumPy twins (``_web_apps``).
USER = "user service: aiotensor"
USER_NUMPY = "user service: numpy in handler"
USER_THREAD = "user service: numpy to_thread"
#: The NumPy twin answering with orjson by hand, as ``web.rows_response`` answers: the
#: fair baseline for the response's share (the other twins answer through pydantic).
USER_NUMPY_ORJSON = "user service: numpy in handler, orjson"
#: The aiotensor service answering through the twins' pydantic model instead.
USER_MODEL = "user service: aiotensor, pydantic response"
USER_TWINS = (USER_NUMPY, USER_THREAD, USER_NUMPY_ORJSON)
USER_VARIANTS = (USER, USER_MODEL, *USER_TWINS)
VARIANTS: dict[str, tuple[str, Path]] = {
    EXAMPLE: ("web_service.app:app", ROOT / "examples"),
    OPS: ("web_service.app:ops_app", ROOT / "examples"),
    "aiotensor fused": ("web_service.app:fused_app", ROOT / "examples"),
    "aiotensor, no disconnect watch": ("_web_apps:no_watch_app", ROOT / "benchmarks"),
    "numpy in handler": ("web_service.baselines:numpy_app", ROOT / "examples"),
    "numpy to_thread": ("web_service.baselines:to_thread_app", ROOT / "examples"),
    USER: ("_web_apps:user_app", ROOT / "benchmarks"),
    USER_NUMPY: ("_web_apps:user_numpy_app", ROOT / "benchmarks"),
    USER_THREAD: ("_web_apps:user_to_thread_app", ROOT / "benchmarks"),
    USER_NUMPY_ORJSON: ("_web_apps:user_numpy_orjson_app", ROOT / "benchmarks"),
    USER_MODEL: ("_web_apps:user_model_response_app", ROOT / "benchmarks"),
}
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "bench_web.md"
INSTALL_HINT = "install it with `apt-get install wrk` (Debian/Ubuntu) or `brew install wrk` (macOS)"

LUA = """
local paths = {%s}
local reqs = {}
local i = 0
init = function(args)
  for k, p in ipairs(paths) do
    local f = assert(io.open(p, "rb"))
    local body = f:read("*a")
    f:close()
    reqs[k] = wrk.format("POST", "/predict", {["Content-Type"] = "application/json"}, body)
  end
end
request = function()
  i = i %% #reqs + 1
  return reqs[i]
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"connect\\": %%d, \\"read\\": %%d, \\"write\\": %%d," ..
    " \\"status\\": %%d, \\"timeout\\": %%d, \\"p50_us\\": %%d, \\"p99_us\\": %%d}\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass
class Measured:
    """One variant under one payload size, over all its rounds."""

    variant: str
    rows: int
    requests: int = 0
    seconds: float = 0.0
    errors: int = 0
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    health: list[float] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    windows: list[tuple[float, float]] = field(default_factory=list)
    loop_cpu: float = 0.0  # seconds of CPU of the server's main (event loop) thread during the rounds
    other_cpu: float = 0.0  # ... and of its other threads (the kernel pool, to_thread's executor)

    @property
    def rps(self) -> float:
        """Requests answered per second over all rounds."""
        return self.requests / self.seconds if self.seconds else 0.0

    def cpu_us(self, which: str) -> float:
        """CPU µs per request of the event-loop thread (``"loop"``) or of the other threads."""
        seconds = self.loop_cpu if which == "loop" else self.other_cpu
        return seconds / self.requests * 1e6 if self.requests else float("nan")

    def health_ms(self, q: float) -> float:
        """The ``q``-th percentile of the ``/health`` probes' latency, in ms."""
        return float(np.percentile(self.health, q) * 1e3) if self.health else float("nan")


# -- measuring -----------------------------------------------------------------------------
def rss_of(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (0 once it has exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of ``pid``'s main thread and of all its other threads."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        if task.name == str(pid):
            main += seconds
        else:
            other += seconds
    return main, other


class RssSampler(threading.Thread):
    """Samples the RSS of every server every 100 ms, with timestamps."""

    def __init__(self, pids: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.samples: dict[str, list[tuple[float, int]]] = {name: [] for name in pids}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.monotonic()
            for name, pid in self.pids.items():
                self.samples[name].append((now, rss_of(pid)))
            self.halt.wait(0.1)

    def peak(self, name: str, windows: list[tuple[float, float]]) -> int:
        """The highest sample inside any of ``windows``."""
        return max((r for t, r in self.samples[name] if any(a <= t <= b for a, b in windows)), default=0)

    def at(self, name: str, when: float) -> int:
        """The first sample taken at or after ``when``."""
        return next((r for t, r in self.samples[name] if t >= when), rss_of(self.pids[name]))


class Prober(threading.Thread):
    """``GET /health`` every ``every`` seconds on one keep-alive connection, recording latency."""

    def __init__(self, url: str, every: float) -> None:
        super().__init__(daemon=True)
        host, port = url.removeprefix("http://").split(":")
        self.address = (host, int(port))
        self.every = every
        self.latencies: list[float] = []
        self.errors = 0
        self.halt = threading.Event()

    def run(self) -> None:
        conn = http.client.HTTPConnection(*self.address, timeout=30)
        due = time.perf_counter()
        while not self.halt.is_set():
            start = time.perf_counter()
            try:
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    self.errors += 1
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
                conn = http.client.HTTPConnection(*self.address, timeout=30)
            else:
                self.latencies.append(time.perf_counter() - start)
            due = max(due + self.every, time.perf_counter())
            self.halt.wait(max(0.0, due - time.perf_counter()))
        conn.close()


def wrk(url: str, script: Path, args: argparse.Namespace, seconds: int) -> dict[str, int]:
    """One ``wrk`` run of ``seconds`` (whole: wrk takes no fractions) against ``url``/predict; its summary."""
    command = [
        *("wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{seconds}s", "--timeout", "30s"),
        *("-s", str(script), f"{url}/predict"),
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{out}")
    summary: dict[str, int] = json.loads(line.removeprefix("WRKJSON "))
    return summary


def write_bodies(directory: Path, rows: int, count: int = 8, features: int = IN_FEATURES) -> Path:
    """``count`` JSON bodies of ``rows`` random rows, and the Lua script that sends them in turn."""
    rng = np.random.default_rng(rows)
    paths = []
    for k in range(count):
        path = directory / f"body_{rows}_{features}_{k}.json"
        path.write_text(json.dumps({"inputs": rng.standard_normal((rows, features)).round(6).tolist()}))
        paths.append(path)
    script = directory / f"predict_{rows}_{features}.lua"
    script.write_text(LUA % ", ".join(json.dumps(str(p)) for p in paths))
    return script


def measure(rows: int, variants: list[str], args: argparse.Namespace, tmp: Path, console: Console) -> list[Measured]:
    """Serve every variant on fresh servers and load them in interleaved rounds."""
    scripts = {
        v: write_bodies(tmp, rows, features=USER_FEATURES if v in USER_VARIANTS else IN_FEATURES) for v in variants
    }
    blas = str(args.blas_threads)
    env = {"OPENBLAS_NUM_THREADS": blas, "OMP_NUM_THREADS": blas, "MKL_NUM_THREADS": blas}
    results = {v: Measured(v, rows) for v in variants}
    with contextlib.ExitStack() as stack:
        servers: dict[str, RunningServer] = {
            v: stack.enter_context(serve(VARIANTS[v][0], app_dir=VARIANTS[v][1], env=env)) for v in variants
        }
        sampler = RssSampler({v: s.process.pid for v, s in servers.items()})
        sampler.start()
        time.sleep(0.3)
        for v in variants:
            results[v].rss_before = rss_of(servers[v].process.pid)
            if args.warmup:
                wrk(servers[v].url, scripts[v], args, args.warmup)  # first calls, caches, the cost model
        last_end: dict[str, float] = {}
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                prober = Prober(servers[v].url, args.health_every)
                pid = servers[v].process.pid
                start = time.monotonic()
                cpu_before = thread_cpu(pid)
                prober.start()
                try:
                    summary = wrk(servers[v].url, scripts[v], args, args.duration)
                finally:
                    prober.halt.set()
                    prober.join()
                cpu_after = thread_cpu(pid)
                end = last_end[v] = time.monotonic()
                m = results[v]
                m.loop_cpu += cpu_after[0] - cpu_before[0]
                m.other_cpu += cpu_after[1] - cpu_before[1]
                m.windows.append((start, end))
                m.requests += summary["requests"]
                m.seconds += summary["duration_us"] / 1e6
                m.errors += sum(summary[k] for k in ("connect", "read", "write", "status", "timeout"))
                m.errors += prober.errors
                m.p50_ms.append(summary["p50_us"] / 1e3)
                m.p99_ms.append(summary["p99_us"] / 1e3)
                m.health.extend(prober.latencies)
                p99 = np.percentile(prober.latencies, 99) * 1e3 if prober.latencies else float("nan")
                console.print(
                    f"  {rows:>4} rows, round {r + 1}/{args.rounds}: {v:<32}"
                    f" {summary['requests'] / args.duration:8.0f} req/s, /health p99 {p99:7.1f} ms"
                )
        wait = max(last_end.values()) + args.after - time.monotonic()
        if wait > 0:
            console.print(f"  waiting {wait:.0f} s for the RSS {args.after:g} s after each server's last round")
            time.sleep(wait + 0.2)
        sampler.halt.set()
        sampler.join()
        for v in variants:
            results[v].rss_peak = sampler.peak(v, results[v].windows)
            results[v].rss_after = sampler.at(v, last_end[v] + args.after)
    for v, server in servers.items():
        if results[v].errors or server.process.returncode:
            console.print(f"server log of {v} (exit {server.process.returncode}):\n{server.log[-3000:]}")
    return [results[v] for v in variants]


# -- reporting -------------------------------------------------------------------------------
def best_baseline(results: list[Measured], user: bool = False) -> Measured | None:
    """The baseline with the most requests/s (of the user-style service's twins if ``user``)."""
    names = USER_TWINS if user else BASELINES
    baselines = [m for m in results if m.variant in names]
    return max(baselines, key=lambda m: m.rps) if baselines else None


def by_name(results: list[Measured], name: str) -> Measured | None:
    """The result of variant ``name``, if it was measured."""
    return next((m for m in results if m.variant == name), None)


def rows_of(results: list[Measured]) -> list[list[str]]:
    """Table rows: every variant with its figures and its ratio to the best baseline."""
    out = []
    for m in results:
        best = best_baseline([r for r in results if r.rows == m.rows], user=m.variant in USER_VARIANTS)
        ratio = f"{m.rps / best.rps:.2f}" if best is not None and best.rps else "-"
        out.append(
            [
                str(m.rows),
                m.variant,
                f"{m.rps:.0f}",
                ratio,
                f"{statistics.median(m.p50_ms):.1f}",
                f"{statistics.median(m.p99_ms):.1f}",
                f"{m.health_ms(50):.1f}",
                f"{m.health_ms(99):.1f}",
                str(m.errors),
                f"{m.rss_before / 2**20:.0f}",
                f"{m.rss_peak / 2**20:.0f}",
                f"{m.rss_after / 2**20:.0f}",
                f"{m.cpu_us('loop'):.0f}",
                f"{m.cpu_us('other'):.0f}",
            ]
        )
    return out


COLUMNS = [
    "rows",
    "variant",
    "req/s",
    "x best baseline",
    "p50 ms",
    "p99 ms",
    "/health p50 ms",
    "/health p99 ms",
    "errors",
    "RSS before MB",
    "RSS peak MB",
    "RSS after MB",
    "loop CPU us/req",
    "other threads CPU us/req",
]


def _health_targets(
    prefix: str, ours: Measured, thread: Measured | None, handler: Measured | None
) -> list[tuple[str, str, bool | None]]:
    """The ``/health`` targets: p99 <= to_thread's at 16 rows, <= 0.5x numpy in the handler's above."""
    out: list[tuple[str, str, bool | None]] = []
    p99 = ours.health_ms(99)
    if ours.rows <= 16 and thread is not None:
        theirs = thread.health_ms(99)
        out.append((f"{prefix}: /health p99 <= to_thread's", f"{p99:.1f} vs {theirs:.1f} ms", p99 <= theirs))
    if ours.rows > 16 and handler is not None:
        theirs = handler.health_ms(99)
        out.append(
            (
                f"{prefix}: /health p99 <= 0.5x numpy in handler's",
                f"{p99:.1f} vs {theirs:.1f} ms ({p99 / theirs:.2f}x)",
                p99 <= 0.5 * theirs,
            )
        )
    return out


def targets(results: list[Measured], subject: str = EXAMPLE) -> list[tuple[str, str, bool | None]]:
    """The issue's targets: (target, measured, met) for ``subject`` (the example's app: batched).

    The cost of watching for disconnects is measured on the op-by-op app, against the
    same app without the watcher.
    """
    out: list[tuple[str, str, bool | None]] = []
    sizes = sorted({m.rows for m in results})
    for rows in sizes:
        same = [m for m in results if m.rows == rows]
        ours, best = by_name(same, subject), best_baseline(same)
        thread, handler = by_name(same, "numpy to_thread"), by_name(same, "numpy in handler")
        watch, watched = by_name(same, "aiotensor, no disconnect watch"), by_name(same, OPS)
        if watched is not None and watch is not None and watch.rps:
            # The loop thread is what limits req/s here, so its CPU per request is the
            # throughput cost, with far less noise than req/s on a shared machine.
            cost = watched.cpu_us("loop") / watch.cpu_us("loop") - 1
            rps = 1 - watched.rps / watch.rps
            out.append(
                (
                    f"{rows} rows: disconnect watch costs <= 5% (loop CPU per request)",
                    f"{cost * 100:+.1f}% (req/s {-rps * 100:+.1f}%)",
                    cost <= 0.05,
                )
            )
        if ours is None or best is None:
            continue
        want = 1.0 if rows <= 16 else 0.95
        ratio = ours.rps / best.rps
        measured = f"{ratio:.2f}x ({best.variant})"
        out.append((f"{rows} rows: req/s >= {want:.2f}x best baseline", measured, ratio >= want))
        out += _health_targets(f"{rows} rows", ours, thread, handler)
        if thread is not None and thread.rss_after:
            ratio = ours.rss_after / thread.rss_after
            out.append((f"{rows} rows: RSS after <= 1.25x to_thread's", f"{ratio:.2f}x", ratio <= 1.25))
    errors = sum(m.errors for m in results)
    out.append(("zero errors", str(errors), errors == 0))
    return out


def targets_29(results: list[Measured]) -> list[tuple[str, str, bool | None]]:
    """Issue 29's targets, for the example and for the user-style service against its own twins."""
    out: list[tuple[str, str, bool | None]] = []
    apps = ((EXAMPLE, "numpy in handler", "numpy to_thread"), (USER, USER_NUMPY, USER_THREAD))
    for subject, handler_name, thread_name in apps:
        for rows in sorted({m.rows for m in results}):
            same = [m for m in results if m.rows == rows]
            ours, best = by_name(same, subject), best_baseline(same, user=subject == USER)
            thread, handler = by_name(same, thread_name), by_name(same, handler_name)
            if ours is None or best is None or not best.rps:
                continue
            ratio = ours.rps / best.rps
            measured = f"{ratio:.2f}x ({best.variant})"
            out.append((f"{subject}, {rows} rows: req/s >= 1.00x best baseline", measured, ratio >= 1.0))
            out.append((f"{subject}, {rows} rows: stretch goal req/s >= 1.30x best baseline", measured, ratio >= 1.3))
            out += _health_targets(f"{subject}, {rows} rows", ours, thread, handler)
    return out


def markdown(results: list[Measured], args: argparse.Namespace, command: str, load: str) -> str:
    """The snippet for docs/performance.md."""
    lines = [
        "### Web service under wrk: requests/s, /health latency, server RSS",
        "",
        f"`{command}` on {os.cpu_count()} cores ({load}), Python {platform.python_version()}; each variant a"
        f" `uvicorn --loop uvloop` process (one worker, BLAS threads {args.blas_threads}); "
        f"`wrk -t{args.threads} -c{args.connections}` POST /predict ({IN_FEATURES} float features per row; the"
        f" user-style service {USER_FEATURES}) for"
        f" {args.duration} s per round, {args.rounds} interleaved rounds; `/health` probed every"
        f" {args.health_every * 1e3:g} ms during the load; RSS before the load, its peak during it, and"
        f" {args.after:g} s after each server's last round. One run on a shared machine: expect noise.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---:|" * (len(COLUMNS) - 2),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows_of(results)]
    lines += ["", f"| goal ({EXAMPLE}) | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {'yes' if ok else 'no'} |" for t, m, ok in targets(results)]
    extra = targets_29(results)
    if extra:
        lines += ["", "| goal | measured | met |", "|---|---|---|"]
        lines += [f"| {t} | {m} | {'yes' if ok else 'no'} |" for t, m, ok in extra]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables; write the snippet only when asked."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s per variant (about a minute)")
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 512], help="rows per request (one workload each)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS), metavar="VARIANT")
    parser.add_argument("--duration", type=int, default=None, help="seconds of wrk per round (default 5; quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; quick 1)")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of wrk per server first (0: none)")
    parser.add_argument("--after", type=float, default=10.0, help="seconds after the load for the RSS 'after'")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--connections", type=int, default=32, help="wrk connections")
    parser.add_argument("--health-every", type=float, default=0.01, help="seconds between /health probes")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads per server (same for all)")
    parser.add_argument("--markdown", type=Path, default=None, help="write the snippet here")
    parser.add_argument("--write-docs", action="store_true", help=f"write the snippet to {DEFAULT_RESULTS.name}")
    args = parser.parse_args(argv)
    args.duration = args.duration or (2 if args.quick else 5)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if min(args.duration, args.rounds, args.threads, args.connections, args.blas_threads) < 1 or args.warmup < 0:
        parser.error("durations, rounds and counts must be at least 1 (the warm-up at least 0)")
    console = Console(width=160)
    if shutil.which("wrk") is None:
        console.print(f"bench_web: skipped: `wrk` is not on PATH; {INSTALL_HINT}.")
        return 0
    if not sys.platform.startswith("linux"):
        console.print("bench_web: skipped: server RSS is read from /proc (Linux only).")
        return 0
    load_before = os.getloadavg()[0]
    results: list[Measured] = []
    with tempfile.TemporaryDirectory(prefix="aiotensor-bench-web-") as tmp:
        for rows in args.rows:
            console.print(f"{rows} rows/request: serving {', '.join(args.variants)}")
            results += measure(rows, list(args.variants), args, Path(tmp), console)
    load = f"1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    table = Table(title=f"Web service under wrk ({load})")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("variant",) else "right")
    for row in rows_of(results):
        table.add_row(*row)
    console.print(table)
    goals = Table(title=f"Goals ({EXAMPLE})")
    for column in ("goal", "measured", "met"):
        goals.add_column(column)
    for t, m, ok in targets(results):
        goals.add_row(t, m, "yes" if ok else "no")
    console.print(goals)
    if targets_29(results):
        goals = Table(title="Goals of the two services")
        for column in ("goal", "measured", "met"):
            goals.add_column(column)
        for t, m, ok in targets_29(results):
            goals.add_row(t, m, "yes" if ok else "no")
        console.print(goals)
    command = " ".join(["python benchmarks/bench_web.py", *(sys.argv[1:] if argv is None else argv)])
    path = args.markdown or (DEFAULT_RESULTS if args.write_docs else None)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown(results, args, command, load))
        console.print(f"markdown snippet: {path}")
    return 1 if any(m.errors for m in results) else 0


if __name__ == "__main__":
    sys.exit(main())
