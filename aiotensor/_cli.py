"""The ``aiotensor`` command: ``demo`` runs the seeds' n x m loop under the three strategies."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ._config import ResourceCleanupStrategy
from ._session import AsyncEagerSession

__all__ = ["DemoResult", "main", "run_demo"]


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What one strategy did on the demo loop."""

    strategy: ResourceCleanupStrategy
    peak_bytes: int
    final_bytes: int
    closed_bytes: int
    live_per_iteration: list[int]
    seconds: float


async def run_demo(strategy: ResourceCleanupStrategy, n: int, m: int, size: int) -> DemoResult:
    """n ops in a loop of m iterations, keeping only the last result (the seeds' warning)."""
    start = time.perf_counter()
    live: list[int] = []
    async with AsyncEagerSession(cleanup=strategy) as s:
        x = await s.random_normal((size,), dtype="float32", seed=0)
        last = x
        for _ in range(m):
            y = x
            for _ in range(n):
                y = await s.add(y, 1.0)  # the previous intermediate's handle is dropped here
            last = y
            live.append(s.stats().live_bytes)
        await asyncio.sleep(0.01)  # an idle moment: IN_BACKGROUND frees without further ops
        stats = s.stats()
        del last, y
    return DemoResult(strategy, stats.peak_bytes, stats.live_bytes, s.stats().live_bytes, live, time.perf_counter() - start)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiotensor", description="aiotensor command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="the n x m loop under the three cleanup strategies")
    demo.add_argument("-n", "--ops", type=_positive, default=10, help="ops per iteration (default 10)")
    demo.add_argument("-m", "--iterations", type=_positive, default=100, help="iterations (default 100)")
    demo.add_argument("--size", type=_positive, default=10_000, help="float32 elements per tensor (default 10000)")
    return parser


def _demo(args: argparse.Namespace) -> int:
    n, m, size = args.ops, args.iterations, args.size
    print(f"{n} ops x {m} iterations on float32[{size}] ({size * 4} bytes per tensor), keeping only the last result\n")
    header = f"{'strategy':<18}{'peak bytes':>14}{'live at end':>14}{'after close':>14}{'seconds':>10}"
    print(header)
    print("-" * len(header))
    for strategy in ResourceCleanupStrategy:
        r = asyncio.run(run_demo(strategy, n, m, size))
        print(f"{strategy.name:<18}{r.peak_bytes:>14,}{r.final_bytes:>14,}{r.closed_bytes:>14,}{r.seconds:>10.2f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiotensor`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
