"""DaskBackend: per-op overhead on a cluster, and matmul throughput on 1 vs 2 worker processes.

Run: ``python benchmarks/bench_distributed.py`` (``--quick`` for a smoke run,
``--markdown FILE`` to also write the tables as a snippet for ``docs/performance.md``).

1. Per-op latency of a chain of dependent ``add(y, 1.0)`` ops, each awaited, on a
   LocalCluster of 2 single-threaded worker processes: aiotensor's DaskBackend against
   a plain ``client.submit`` chain (Dask's own floor: it batches messages every few ms)
   and against the local thread-pool backend.
2. Throughput of a batch of independent float64 matmuls submitted at once, on clusters
   of 1 and 2 worker processes (one BLAS thread each), with the local backend as reference.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import distributed
import numpy as np
from distributed import Client, LocalCluster, wait
from threadpoolctl import threadpool_limits

import aiotensor as at
from aiotensor.distributed import DaskBackend


@dataclass(frozen=True, slots=True)
class Row:
    """One measured variant: its label and the per-round values."""

    label: str
    values: list[float]
    note: str = ""

    @property
    def median(self) -> float:
        """The median over rounds."""
        return statistics.median(self.values)

    def cell(self, digits: int) -> str:
        """``median (min-max)``."""
        return f"{self.median:.{digits}f} ({min(self.values):.{digits}f}-{max(self.values):.{digits}f})"


def markdown(title: str, unit: str, rows: list[Row], base: str, digits: int, ratio_label: str) -> str:
    """A markdown table with each row's ratio to the row labelled ``base``."""
    ref = next(r.median for r in rows if r.label == base)
    lines = [f"**{title}**", "", f"| variant | {unit}, median (min-max) | {ratio_label} | note |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.label} | {r.cell(digits)} | {r.median / ref:.2f}x | {r.note} |")
    return "\n".join(lines)


def _cluster(n_workers: int) -> LocalCluster:
    return LocalCluster(
        n_workers=n_workers,
        processes=True,
        threads_per_worker=1,
        host="127.0.0.1",
        dashboard_address=None,
        # (the scheduler's /health and /metrics: any free port, not 8787, which may be taken)
        scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        asynchronous=True,
    )


def _add_one(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return x + np.float32(1.0)


async def _timed(n: int, step: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await step()
    return (time.perf_counter() - start) / n * 1e3


# -- 1. per-op overhead ------------------------------------------------------------------
async def per_op(client: Client, backend: DaskBackend, size: int, ops: int, rounds: int) -> list[Row]:
    """ms per dependent op: plain Dask chains, aiotensor on Dask, aiotensor locally."""
    data = np.zeros(size, dtype=np.float32)
    plain_wait, plain_gather, dask_at, local_at = [], [], [], []
    async with at.AsyncEagerSession(backend=backend) as ds, at.AsyncEagerSession() as ls:
        dx, lx = await ds.constant(data), await ls.constant(data)
        fx = client.submit(np.zeros, size, dtype=np.float32, pure=False)
        await wait(fx)
        state: dict[str, Any] = {}

        async def submit_wait() -> None:
            state["f"] = client.submit(_add_one, state["f"], pure=False)
            await wait(state["f"])

        async def submit_gather() -> None:
            state["f"] = client.submit(_add_one, state["f"], pure=False)
            await state["f"]

        async def on_dask() -> None:
            state["d"] = await ds.add(state["d"], 1.0)

        async def local() -> None:
            state["l"] = await ls.add(state["l"], 1.0)

        for _ in range(rounds):  # interleaved, so load from elsewhere hits every variant alike
            state.update(f=fx, d=dx, l=lx)
            plain_wait.append(await _timed(ops, submit_wait))
            state["f"] = fx
            plain_gather.append(await _timed(ops, submit_gather))
            dask_at.append(await _timed(ops, on_dask))
            local_at.append(await _timed(ops, local))
            state.clear()
    return [
        Row("client.submit + await wait(future)", plain_wait, "Dask's floor: no data back"),
        Row("client.submit + await future", plain_gather, "also gathers the result"),
        Row("aiotensor, DaskBackend", dask_at, "metadata only, data stays on workers"),
        Row("aiotensor, local backend", local_at, "thread pool in this process"),
    ]


# -- 2. matmul throughput ----------------------------------------------------------------
async def _matmul_batch(session: at.AsyncEagerSession, n: int, k: int, devices: list[str]) -> float:
    """Seconds for k independent n x n matmuls submitted together (inputs already in place)."""
    pairs = []
    for i in range(k):
        with session.device(devices[i % len(devices)]):
            a = await session.random_normal((n, n), seed=2 * i)
            b = await session.random_normal((n, n), seed=2 * i + 1)
        pairs.append((a, b))
    start = time.perf_counter()
    products = await asyncio.gather(*(session.matmul(a, b) for a, b in pairs))
    elapsed = time.perf_counter() - start
    a0, b0, p0 = await session.run([*pairs[0], products[0]])
    np.testing.assert_allclose(p0, a0 @ b0, rtol=1e-7, atol=1e-8)
    return elapsed


async def matmuls(n: int, k: int, rounds: int) -> list[Row]:
    """GFLOP/s of a batch of k n x n matmuls: local backend, then clusters of 1 and 2 workers."""
    flops = 2.0 * n**3 * k / 1e9
    rows: list[Row] = []
    for label, blas in (("BLAS threads as numpy starts", None), ("1 BLAS thread per pool thread", 1)):
        local = []
        with threadpool_limits(limits=blas):
            async with at.AsyncEagerSession() as s:
                for _ in range(rounds):
                    local.append(flops / await _matmul_batch(s, n, k, ["/cpu:0"]))
        rows.append(Row(f"local backend, {label}", local, f"{os.cpu_count()} cores, shared pool"))
    for workers in (1, 2):
        async with _cluster(workers) as cluster, Client(cluster, asynchronous=True) as client:
            backend = DaskBackend(client)
            values = []
            async with at.AsyncEagerSession(backend=backend) as s:
                devices = s.list_devices()[1:]  # spread inputs over the workers
                for _ in range(rounds):
                    values.append(flops / await _matmul_batch(s, n, k, devices))
            await backend.aclose()
        rows.append(Row(f"DaskBackend, {workers} worker process(es)", values, "1 thread, 1 BLAS thread each"))
    return rows


async def run(quick: bool) -> list[str]:
    """Run both benchmarks, printing each table as it is measured; return them as markdown."""
    ops, rounds, k = (30, 2, 4) if quick else (150, 5, 8)
    n = 512 if quick else 1024
    tables = []
    async with _cluster(2) as cluster, Client(cluster, asynchronous=True) as client:
        backend = DaskBackend(client)
        await backend.start()
        for size in (1_000, 1_000_000):
            rows = await per_op(client, backend, size, ops, rounds)
            tables.append(
                markdown(
                    f"Per-op latency, chain of {ops} dependent add(y, 1.0) on float32[{size:,}],"
                    f" LocalCluster of 2 worker processes, {rounds} rounds",
                    "ms per op",
                    rows,
                    rows[0].label,
                    2,
                    "vs Dask's floor",
                )
            )
            print(tables[-1], "\n", flush=True)
        await backend.aclose()
    rows = await matmuls(n, k, rounds)
    tables.append(
        markdown(
            f"Throughput, batch of {k} independent float64 {n}x{n} matmuls submitted together, {rounds} rounds",
            "GFLOP/s",
            rows,
            rows[2].label,
            1,
            "vs 1 worker",
        )
    )
    print(tables[-1], "\n")
    return tables


def main() -> int:
    """Parse the command line, run, optionally write the markdown snippet."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer ops and rounds (a smoke run)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables to FILE")
    args = parser.parse_args()
    tables = asyncio.run(run(args.quick))
    if args.markdown:
        machine = f"_Measured by `python benchmarks/bench_distributed.py` on {os.cpu_count()} cores,"
        machine += f" Python {sys.version.split()[0]}, distributed {distributed.__version__}._"
        with open(args.markdown, "w") as f:
            f.write("\n\n".join([*tables, machine]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
