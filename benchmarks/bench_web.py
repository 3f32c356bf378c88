"""The web-service example under load: aiotensor against plain NumPy in the handler and ``asyncio.to_thread``.

Each app (``examples/web_service``) runs as a real ``uvicorn --loop uvloop`` process
with the same settings (one worker, BLAS threads pinned); an ``httpx.AsyncClient``
sends ``POST /predict`` at a fixed concurrency while a second client probes
``GET /health`` every few milliseconds, so the table shows both throughput and how
responsive the event loop stays while it serves. All apps serve for the whole run and
take turns in interleaved rounds.

Run::

    python benchmarks/bench_web.py                       # ~2 minutes on 2 cores
    python benchmarks/bench_web.py --requests 500 --heavy-requests 50   # a quick look

It prints a table and writes a markdown snippet (``--markdown``) for ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvloop
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from web_service.model import IN_FEATURES  # noqa: E402 -- needs the examples directory on the path
from web_service.server import serve  # noqa: E402

APPS = {
    "aiotensor": "web_service.app:app",
    "aiotensor fused (apply)": "web_service.app:fused_app",
    "numpy in handler": "web_service.baselines:numpy_app",
    "numpy to_thread": "web_service.baselines:to_thread_app",
}
HEALTH_EVERY = 0.005  # seconds between /health probes


@dataclass(frozen=True, slots=True)
class Result:
    """One app under one workload."""

    app: str
    workload: str
    requests: int
    seconds: float
    latencies: np.ndarray[Any, np.dtype[np.float64]]
    health: np.ndarray[Any, np.dtype[np.float64]]
    errors: int

    @property
    def rps(self) -> float:
        """Requests answered per second."""
        return self.requests / self.seconds

    def ms(self, which: str, q: float) -> float:
        """The ``q``-th percentile of ``latencies`` or ``health``, in milliseconds."""
        values = self.latencies if which == "predict" else self.health
        return float(np.percentile(values, q) * 1e3) if values.size else float("nan")


async def load(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float], list[float], int]:
    """Send every body to ``/predict`` from ``concurrency`` workers, probing ``/health`` meanwhile."""
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    health: list[float] = []
    errors = 0
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency)
    async with (
        httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as c,
        httpx.AsyncClient(base_url=url, timeout=120) as probe,
    ):
        queue = iter(bodies)

        async def worker() -> None:
            nonlocal errors
            for body in queue:
                start = time.perf_counter()
                try:
                    response = await c.post("/predict", content=body, headers=headers)
                except httpx.TransportError as exc:  # counted, not retried: the table shows it
                    print(f"  /predict failed: {exc!r}", file=sys.stderr)
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - start)
                errors += response.status_code != 200

        async def prober() -> None:
            while not done.is_set():
                start = time.perf_counter()
                try:
                    await probe.get("/health")
                except httpx.TransportError as exc:
                    print(f"  /health failed: {exc!r}", file=sys.stderr)
                else:
                    health.append(time.perf_counter() - start)
                await asyncio.sleep(HEALTH_EVERY)

        probing = asyncio.create_task(prober())
        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker())
        seconds = time.perf_counter() - start
        done.set()
        await probing
    return seconds, latencies, health, errors


def bodies_for(n: int, rows: int, seed: int) -> list[bytes]:
    """``n`` JSON request bodies of ``rows`` random rows each (a few distinct ones, reused)."""
    rng = np.random.default_rng(seed)
    distinct = [
        httpx.Request("POST", "/", json={"inputs": rng.standard_normal((rows, IN_FEATURES)).round(6).tolist()}).content
        for _ in range(min(n, 16))
    ]
    return [distinct[i % len(distinct)] for i in range(n)]


def measure(workloads: dict[str, list[bytes]], args: argparse.Namespace) -> list[Result]:
    """Serve every app at once and run the workloads in interleaved rounds.

    Every app serves for the whole run; each round sends a slice of each workload to
    each app in turn, in a rotating order, so load from other processes on the machine
    spreads over all apps instead of landing on whichever ran at that moment.
    """
    blas = str(args.blas_threads)
    env = {"OPENBLAS_NUM_THREADS": blas, "OMP_NUM_THREADS": blas, "MKL_NUM_THREADS": blas}
    samples: dict[tuple[str, str], tuple[list[float], list[float], list[float], list[int]]] = {
        (app, workload): ([], [], [], []) for workload in workloads for app in APPS
    }
    with contextlib.ExitStack() as stack, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        servers = {app: stack.enter_context(serve(target, env=env)) for app, target in APPS.items()}
        urls = {app: server.url for app, server in servers.items()}
        for workload, bodies in workloads.items():
            for url in urls.values():  # warm-up
                runner.run(load(url, bodies[: max(1, len(bodies) // 10)], args.concurrency))
            share = -(-len(bodies) // args.rounds)
            for r in range(args.rounds):
                order = list(urls)[r % len(urls) :] + list(urls)[: r % len(urls)]
                for app in order:
                    seconds, latencies, health, errors = runner.run(
                        load(urls[app], bodies[r * share : (r + 1) * share], args.concurrency)
                    )
                    times, lat, probes, errs = samples[app, workload]
                    times.append(seconds)
                    lat.extend(latencies)
                    probes.extend(health)
                    errs.append(errors)
    for app, server in servers.items():
        if any(sum(samples[app, workload][3]) for workload in workloads):
            print(f"server log of {app}:\n{server.log}", file=sys.stderr)
    return [
        Result(app, workload, len(workloads[workload]), sum(t), np.array(lat), np.array(probes), sum(errs))
        for (app, workload), (t, lat, probes, errs) in samples.items()
    ]


def markdown(results: list[Result], args: argparse.Namespace, command: str, load: str) -> str:
    """The snippet for docs/performance.md."""
    lines = [
        "### Web service: requests/s and latency",
        "",
        f"`{command}` on {os.cpu_count()} cores ({load}), Python {platform.python_version()}, "
        f"`uvicorn --loop uvloop`, one worker, BLAS threads {args.blas_threads}, concurrency {args.concurrency}; "
        f"`/health` probed every {HEALTH_EVERY * 1e3:.0f} ms during the load; {args.rounds} interleaved rounds."
        " One run on a shared machine: expect noise.",
        "",
        "| workload | app | req/s | p50 ms | p99 ms | /health p50 ms | /health p99 ms | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.workload} | {r.app} | {r.rps:.0f} | {r.ms('predict', 50):.1f} | {r.ms('predict', 99):.1f}"
            f" | {r.ms('health', 50):.1f} | {r.ms('health', 99):.1f} | {r.errors} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and write the markdown snippet."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000, help="requests of the small-batch workload")
    parser.add_argument("--rows", type=int, default=16, help="rows per small batch")
    parser.add_argument("--heavy-requests", type=int, default=200, help="requests of the large-batch workload")
    parser.add_argument("--heavy-rows", type=int, default=512, help="rows per large batch")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds each workload is split into")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads per server (same for all apps)")
    parser.add_argument("--markdown", type=Path, default=ROOT / "benchmarks" / "results" / "bench_web.md")
    args = parser.parse_args(argv)
    counts = (args.requests, args.rows, args.heavy_requests, args.heavy_rows, args.concurrency, args.blas_threads)
    if min(*counts, args.rounds) < 1:
        parser.error("every count must be at least 1")
    workloads = {
        f"{args.rows} rows/request": bodies_for(args.requests, args.rows, 0),
        f"{args.heavy_rows} rows/request": bodies_for(args.heavy_requests, args.heavy_rows, 1),
    }
    console = Console(width=120)
    console.print(f"serving {', '.join(APPS.values())}; {args.rounds} interleaved rounds")
    load_before = os.getloadavg()[0]
    results = measure(workloads, args)
    load = f"1-minute load average {load_before:.1f} before the run, {os.getloadavg()[0]:.1f} after"
    table = Table(title="Web service under load (ms; /health probed during the load)")
    for column in ("workload", "app", "req/s", "p50", "p99", "/health p50", "/health p99", "errors"):
        table.add_column(column, justify="left" if column in ("workload", "app") else "right")
    for r in results:
        table.add_row(
            r.workload,
            r.app,
            f"{r.rps:.0f}",
            f"{r.ms('predict', 50):.1f}",
            f"{r.ms('predict', 99):.1f}",
            f"{r.ms('health', 50):.1f}",
            f"{r.ms('health', 99):.1f}",
            str(r.errors),
        )
    console.print(table)
    command = " ".join(["python benchmarks/bench_web.py", *(sys.argv[1:] if argv is None else argv)])
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(markdown(results, args, command, load))
    console.print(f"markdown snippet: {args.markdown}")
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
