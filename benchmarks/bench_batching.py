"""Issue 12: micro-batching. 32 concurrent clients each running a small MLP, six ways, in one run.

Every client loops: a (16, 64) float32 request -> 512 ReLU -> 10 softmax -> an ndarray
of probabilities. The variants: NumPy on the loop thread (the handler computes
synchronously, then yields), ``asyncio.to_thread`` per request, aiotensor op by op
(six ops), one fused function per request (``at.function``), the batched function
(``at.batched``: the requests of one loop iteration stacked into one kernel call), and
a hand-written batcher that does the least batching can do (plain NumPy, no sessions,
tensors or checks; one worker thread, the hidden layer computed in place): what this
machine allows any batcher, measured in the same run.
Rounds are interleaved, so machine noise hits all variants alike; the tables give the
median throughput over rounds with its ratio to NumPy on the loop of the same run, and
the p50/p99 *cycle time* per client (from one answer to the next: the latency a request
sees while all 32 clients keep one in flight) and the event loop thread's CPU time per
request (``time.thread_time``: what each variant costs the loop; kernels on worker threads
are not in it). A second table times one client alone:
the batched function against the fused one (a batch of one pays one loop iteration).

Run::

    python -m benchmarks.bench_batching            # ~1 minute on 2 cores; writes nothing
    python -m benchmarks.bench_batching --quick    # a smoke run
    python -m benchmarks.bench_batching --rows 64 --max-batch-size 2048   # batches long enough to split

``python -m benchmarks`` runs it as the ``batching`` scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import aiotensor as at

from ._harness import Report, Stat, loop_factories, ratio, run_on
from ._report import print_console

CLIENTS = 32
ROWS, IN, HIDDEN, OUT = 16, 64, 512, 10
NUMPY = "numpy on the loop"
TO_THREAD = "asyncio.to_thread"
OP_BY_OP = "aiotensor op by op"
FUSED = "aiotensor fused (unbatched)"
BATCHED = "aiotensor batched"
MINIMAL = "hand-written batcher (numpy)"

Array = np.ndarray[Any, np.dtype[np.float32]]
Request = Callable[[Array], Awaitable[Array]]


def mlp(ops: at.FusedOps, x: Any, w1: Any, b1: Any, w2: Any, b2: Any) -> Any:
    """The forward pass as a fused function."""
    return ops.softmax(ops.relu(x @ w1 + b1) @ w2 + b2, axis=-1)


def numpy_mlp(x: Array, w1: Array, b1: Array, w2: Array, b2: Array) -> Array:
    """The same in NumPy (the reference and the baselines)."""
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


class _MinimalBatcher:
    """The least a batcher can do, as a ceiling for this machine: no sessions, no tensors, no checks.

    The calls of one loop iteration are stacked, run on one worker thread with a recycled
    hidden layer (``out=``, in place), and each caller gets a view of its rows.
    """

    def __init__(self, weights: list[Array]) -> None:
        self._weights = weights
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minimal-batcher")
        self._pending: list[tuple[Array, asyncio.Future[Array]]] = []
        self._hidden: Array | None = None

    async def __call__(self, x: Array) -> Array:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Array] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush, loop)  # after the callbacks that are ready now
        self._pending.append((x, future))
        return await future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._pending = self._pending, []
        done = asyncio.wrap_future(self._pool.submit(self._forward, np.concatenate([x for x, _ in batch])), loop=loop)

        def split(f: asyncio.Future[Array]) -> None:
            y, lo = f.result(), 0
            for x, future in batch:
                future.set_result(y[lo : lo + len(x)])
                lo += len(x)

        done.add_done_callback(split)

    def _forward(self, x: Array) -> Array:
        w1, b1, w2, b2 = self._weights
        if self._hidden is None or self._hidden.shape[0] != x.shape[0]:
            self._hidden = np.empty((x.shape[0], w1.shape[1]), np.float32)
        h = np.matmul(x, w1, out=self._hidden)
        np.add(h, b1, out=h)
        np.maximum(h, 0, out=h)
        logits = h @ w2 + b2
        e = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]

    def close(self) -> None:
        self._pool.shutdown()


async def _clients(request: Request, inputs: list[Array], n: int) -> tuple[float, list[float]]:
    """``len(inputs)`` clients, ``n`` requests each: (requests/s, cycle times in seconds)."""
    cycles: list[float] = []

    async def client(x: Array) -> None:
        last = time.perf_counter()
        for _ in range(n):
            await request(x)
            now = time.perf_counter()
            cycles.append(now - last)
            last = now

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for x in inputs:
            tg.create_task(client(x))
    return len(inputs) * n / (time.perf_counter() - start), cycles


async def _measure(rounds: int, n: int, n_single: int, max_batch_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(0)
    weights = [
        (rng.standard_normal((IN, HIDDEN)) * np.sqrt(2 / IN)).astype(np.float32),
        (rng.standard_normal(HIDDEN) * 0.01).astype(np.float32),
        (rng.standard_normal((HIDDEN, OUT)) * np.sqrt(2 / HIDDEN)).astype(np.float32),
        (rng.standard_normal(OUT) * 0.01).astype(np.float32),
    ]
    inputs = [rng.standard_normal((ROWS, IN)).astype(np.float32) for _ in range(CLIENTS)]
    async with at.AsyncEagerSession() as s:
        w1, b1, w2, b2 = [await s.constant(w) for w in weights]
        fused = at.function(mlp)
        batch = at.batched(max_batch_size=max_batch_size)(mlp)

        async def numpy_inline(x: Array) -> Array:
            y = numpy_mlp(x, *weights)
            await asyncio.sleep(0)  # a handler returns to the loop between requests
            return y

        async def to_thread(x: Array) -> Array:
            return await asyncio.to_thread(numpy_mlp, x, *weights)

        async def op_by_op(x: Array) -> Array:
            h = await s.relu(await s.add(await s.matmul(x, w1), b1))
            y = await s.softmax(await s.add(await s.matmul(h, w2), b2), axis=-1)
            return await y.numpy()

        async def fused_call(x: Array) -> Array:
            y = await fused(x, w1, b1, w2, b2)
            assert isinstance(y, at.Tensor)
            return await y.numpy()

        async def batched_call(x: Array) -> Array:
            y = await batch(x, w1, b1, w2, b2)
            assert isinstance(y, at.Tensor)
            return await y.numpy()

        minimal = _MinimalBatcher(weights)
        variants: dict[str, Request] = {
            NUMPY: numpy_inline,
            TO_THREAD: to_thread,
            OP_BY_OP: op_by_op,
            FUSED: fused_call,
            BATCHED: batched_call,
            MINIMAL: minimal,
        }
        for request in variants.values():  # correctness first, then warm-up
            np.testing.assert_allclose(await request(inputs[0]), numpy_mlp(inputs[0], *weights), rtol=1e-4, atol=1e-6)
            await _clients(request, inputs, max(2, n // 10))
        many: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label in variants}
        single: dict[str, list[float]] = {label: [] for label in (NUMPY, FUSED, BATCHED)}
        calls = batches = rows = split = 0
        loop_cpu = dict.fromkeys(variants, 0.0)  # seconds of this (the loop's) thread, per variant
        for r in range(rounds):
            order = list(variants)[r % len(variants) :] + list(variants)[: r % len(variants)]
            for label in order:
                before = batch.stats()
                cpu = time.thread_time()
                rps, cycles = await _clients(variants[label], inputs, n)
                loop_cpu[label] += time.thread_time() - cpu
                after = batch.stats()
                calls += after.calls - before.calls
                batches += after.batches - before.batches
                rows += after.rows - before.rows
                split += after.split - before.split
                many[label][0].append(rps)
                many[label][1].extend(cycles)
            for label in single:
                single[label].extend((await _clients(variants[label], inputs[:1], n_single))[1])
        minimal.close()
    per_request = {label: seconds / (rounds * n * CLIENTS) * 1e6 for label, seconds in loop_cpu.items()}
    stats = (calls / max(batches, 1), rows / max(batches, 1), split / max(batches, 1))
    return {"many": many, "single": single, "stats": stats, "loop_us": per_request}, {}


def run(report: Report, n: int | None = None, max_batch_size: int = 512, blas_threads: int | None = 1) -> None:
    """Measure on every loop; add the tables and its three goals to ``report``.

    ``blas_threads`` (default 1, as a server would run; ``None``: the library's own) is
    set for the run and restored after it.
    """
    n = n or (20 if report.quick else 40)
    n_single = 100 if report.quick else 300
    if blas_threads is not None:
        at.set_blas_threads(blas_threads)
    try:
        for loop_name in loop_factories():
            measured, _ = run_on(loop_name, _measure(report.rounds, n, n_single, max_batch_size))
            _report(report, loop_name, measured, max_batch_size, blas_threads)
    finally:
        if blas_threads is not None:
            at.set_blas_threads(None)


def _report(report: Report, loop_name: str, measured: dict[str, Any], max_batch_size: int, blas: int | None) -> None:
    many, single, (calls, rows, split) = measured["many"], measured["single"], measured["stats"]
    loop_us = measured["loop_us"]  # the loop thread's CPU per request (kernels on workers not counted)
    base = Stat(tuple(many[NUMPY][0]))
    t = report.table(
        f"MLP {ROWS}x{IN} -> {HIDDEN} -> {OUT} float32, {CLIENTS} concurrent clients, {loop_name} loop,"
        f" BLAS threads {blas or 'default'} (batched: max_batch_size={max_batch_size}, {calls:.1f} calls and"
        f" {rows:.0f} rows per kernel call, {split:.0%} of them in two parts; cycle: from one answer of a"
        " client to its next)",
        "requests/s",
        ratio_label=f"x {NUMPY}",
        digits=0,
    )
    for label, (rps, cycles) in many.items():
        p50, p99 = np.percentile(np.array(cycles) * 1e3, [50, 99])
        stat = Stat(tuple(rps))
        note = f"cycle p50 {p50:.2f} ms, p99 {p99:.2f} ms; loop CPU {loop_us[label]:.1f} µs"
        t.add(label, stat, ratio(stat, base), note)
    alone = report.table(
        f"one client alone, {loop_name} loop: latency per request", "µs (p50)", ratio_label="x fused", digits=1
    )
    p50s = {label: float(np.percentile(np.array(v) * 1e6, 50)) for label, v in single.items()}
    for label, v in single.items():
        p99 = float(np.percentile(np.array(v) * 1e6, 99))
        alone.add(label, Stat((p50s[label],)), p50s[label] / p50s[FUSED], f"p99 {p99:.0f} µs")
    batched = Stat(tuple(many[BATCHED][0]))
    # Issue 29: batched against the hand-written batcher, the cost any batcher pays here.
    hand = Stat(tuple(many[MINIMAL][0]))
    vs_hand = ratio(batched, hand)
    lone_ratio = p50s[BATCHED] / p50s[FUSED]
    lone_met = "met" if lone_ratio <= 1.25 else "not met"
    against = report.table(
        f"{loop_name} loop: batched against the hand-written batcher (goals: >= 0.9x;"
        f" one client alone, batched p50 <= 1.25x fused: {lone_ratio:.2f}x, {lone_met})",
        "requests/s",
        ratio_label="x hand-written",
        digits=0,
    )
    against.add(MINIMAL, hand, 1.0, f"loop CPU {loop_us[MINIMAL]:.1f} µs per request")
    met = "met" if vs_hand >= 0.9 else "not met"
    against.add(BATCHED, batched, vs_hand, f"{met}; loop CPU {loop_us[BATCHED]:.1f} µs per request")
    vs_numpy = ratio(batched, base)
    vs_ops = ratio(batched, Stat(tuple(many[OP_BY_OP][0])))
    lone = p50s[BATCHED] / p50s[FUSED]
    report.target(12, f"batched >= 1.2x numpy on the loop, {CLIENTS} clients ({loop_name})",
                  f"{vs_numpy:.2f}x", vs_numpy >= 1.2)  # fmt: skip
    report.target(12, f"batched >= 3x aiotensor op by op, {CLIENTS} clients ({loop_name})",
                  f"{vs_ops:.2f}x", vs_ops >= 3)  # fmt: skip
    report.target(12, f"one client alone, batched p50 <= 1.25x fused unbatched ({loop_name})",
                  f"{p50s[BATCHED]:.0f} µs = {lone:.2f}x", lone <= 1.25)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print."""
    global ROWS
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_batching", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds (a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, quick 2)")
    parser.add_argument("--requests", type=int, default=None, help="requests per client per round (default 40)")
    parser.add_argument("--max-batch-size", type=int, default=512, help="rows per kernel call of the batched variant")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads per product (0: the library's)")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per request (a batch of 32 holds 32x as many)")
    args = parser.parse_args(argv)
    ROWS = args.rows
    report = Report(quick=args.quick, rounds=args.rounds or (2 if args.quick else 7))
    run(report, args.requests, args.max_batch_size, args.blas_threads or None)
    print_console(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
