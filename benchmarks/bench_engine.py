"""The engine's goals: per-op overhead, expressions and fused calls against numpy, in one run.

``python -m benchmarks.bench_engine`` prints, for asyncio and uvloop, the median over
interleaved rounds of each variant and its ratio to the numpy baseline of the same
round. The "minimal session" rows time the issue's reference implementation
(``_minimal.py``: the least a session of owned tensors can do) against the same
baseline, so each run shows the floor beside aiotensor. Nothing is written to the
checkout. The C allocator is settled first (``_harness.settle_allocator``): otherwise
whether numpy's 256x256 temporaries fault depends on what the process freed before.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

import aiotensor as at
from aiotensor import xp

from ._harness import settle_allocator
from ._minimal import MinimalSession
from .bench_blocked import chain

Timer = Callable[[], Awaitable[float]]


async def _per_call(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n * 1e6


def _sync_per_call(fn: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


async def _rows(rounds: int, n: int) -> dict[str, tuple[float, float, float]]:
    """name -> (variant µs, baseline µs, ratio), medians over interleaved rounds."""
    results: dict[str, list[tuple[float, float]]] = {}
    settle_allocator()
    rng = np.random.default_rng(0)
    async with at.AsyncEagerSession() as s:
        small = rng.standard_normal(16).astype(np.float32)
        big = rng.standard_normal((256, 256)).astype(np.float32)
        # The baseline adds two distinct arrays, as the session adds two tensors: x + x
        # reads half the memory (at 256x256 it takes ~0.65x the time of x + y).
        small2, big2 = small.copy(), big.copy()
        a16, b16 = await s.constant(small), await s.constant(small2)
        a256, b256 = await s.constant(big), await s.constant(big2)
        # The reference: the least a session of owned tensors can do (_minimal.py).
        m = MinimalSession()
        m16, n16, m256, n256 = (m.constant(v) for v in (small, small2, big, big2))
        x = rng.standard_normal((16, 64)).astype(np.float32)
        w1 = rng.standard_normal((64, 512)).astype(np.float32) * 0.1
        w2 = rng.standard_normal((512, 10)).astype(np.float32) * 0.1
        tx, tw1, tw2 = await s.constant(x), await s.constant(w1), await s.constant(w2)

        def chain_xp(t: at.Tensor) -> at.Expr:
            # the shared chain written with aiotensor.xp's functions: it must cost what operators cost.
            y = xp.add(xp.multiply(t, 2.0), 1.0)
            y = xp.subtract(y, 0.5)
            y = xp.multiply(y, y)
            y = xp.divide(y, 3.0)
            y = xp.add(y, t)
            y = xp.abs(y)
            y = xp.multiply(y, 0.1)
            y = xp.subtract(y, t)
            return xp.add(y, 1.0)

        def mlp(ops: at.FusedOps, v: Any, w1: Any, w2: Any) -> Any:
            return ops.relu(v @ w1) @ w2

        fused = s.function(mlp)
        # "A fused call costs less than the same ops one by one whenever it has more than
        # two ops": the smallest such function, on tiny tensors (all overhead, no kernel).
        fused3 = s.function(lambda ops, v, w: (v + w) * w - v)

        async def three_ops() -> Any:
            h = await s.add(a16, b16)
            h = await s.multiply(h, b16)
            return await s.subtract(h, a16)

        async def mlp_ops() -> Any:
            h = await s.matmul(tx, tw1)
            h = await s.relu(h)
            return await s.matmul(h, tw2)

        async def request() -> Any:
            async with at.AsyncEagerSession(parent=s) as r:
                return await r.add(a16, b16)

        cases: list[tuple[str, Timer, Timer]] = [
            _add_case("add 16 f32", lambda: s.add(a16, b16), small, small2, n),
            _add_case("add 256x256 f32", lambda: s.add(a256, b256), big, big2, n // 4),
            _add_case("minimal session: add 16 f32", lambda: m.add(m16, n16), small, small2, n),
            _add_case("minimal session: add 256x256", lambda: m.add(m256, n256), big, big2, n // 4),
            (
                "10-op expr 16 f32",
                lambda: _per_call(lambda: _awaited(chain(a16)), n),
                lambda: _np(lambda: chain(small), n),
            ),
            (
                "10-op expr 256x256",
                lambda: _per_call(lambda: _awaited(chain(a256)), n // 8),
                lambda: _np(lambda: chain(big), n // 8),
            ),
            (
                "10-op xp functions vs operators 256x256",
                lambda: _per_call(lambda: _awaited(chain_xp(a256)), n // 8),
                lambda: _per_call(lambda: _awaited(chain(a256)), n // 8),
            ),
            (
                "fused MLP vs ops one by one",
                lambda: _per_call(lambda: fused(tx, tw1, tw2), n // 4),
                lambda: _per_call(mlp_ops, n // 4),
            ),
            (
                "fused 3 ops 16 f32 vs one by one",
                lambda: _per_call(lambda: fused3(a16, b16), n),
                lambda: _per_call(three_ops, n),
            ),
            (
                "request session + add vs add",
                lambda: _per_call(request, n),
                lambda: _per_call(lambda: s.add(a16, b16), n),
            ),
        ]
        await fused(tx, tw1, tw2)  # the first call of a shape is timed on the pool
        await fused3(a16, b16)
        for _ in range(rounds):
            for name, variant, baseline in cases:
                v, b = await variant(), await baseline()
                results.setdefault(name, []).append((v, b))
    m.close()
    out = {}
    for name, pairs in results.items():
        v = statistics.median(p[0] for p in pairs)
        b = statistics.median(p[1] for p in pairs)
        out[name] = (v, b, statistics.median(p[0] / p[1] for p in pairs))
    return out


def _add_case(name: str, add: Callable[[], Awaitable[Any]], x: Any, y: Any, n: int) -> tuple[str, Timer, Timer]:
    # An add (awaited) against numpy's np.add(x, y) on the loop thread, n calls each.
    return name, lambda: _per_call(add, n), lambda: _np(lambda: np.add(x, y), n)


async def _awaited(e: at.Expr) -> Any:
    return await e


async def _np(fn: Callable[[], Any], n: int) -> float:
    return _sync_per_call(fn, n)


def main() -> None:
    """Run on asyncio and uvloop and print the table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=2000)
    args = parser.parse_args()
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop

        loops["uvloop"] = uvloop.new_event_loop
    except ImportError:
        pass
    print(f"{'loop':8} {'case':32} {'variant µs':>11} {'baseline µs':>12} {'ratio':>7}")
    for loop_name, factory in loops.items():
        with asyncio.Runner(loop_factory=factory) as runner:
            rows = runner.run(_rows(args.rounds, args.n))
        for name, (v, b, ratio) in rows.items():
            print(f"{loop_name:8} {name:32} {v:11.2f} {b:12.2f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
