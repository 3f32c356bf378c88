"""The ``aiotensor`` command: ``demo`` (the n x m loop under the three strategies) and ``info``.

rich (progress bar, table) and matplotlib (``--plot``) are the ``demo`` extra: they are
imported inside the commands that use them, never by ``import aiotensor``. Without
rich the demo prints a plain table; without matplotlib ``--plot`` says what to install.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ._cli_render import DemoResult, plot, rich_report
from ._config import ResourceCleanupStrategy, SessionConfig
from ._errors import AioTensorError, ResourceExhaustedError
from ._registry import PHYSICAL_MEMORY
from ._session import AsyncEagerSession

__all__ = ["DemoResult", "collect_info", "main", "run_demo"]

_INSTALL_DEMO = "pip install 'aiotensor[demo]'"
_PLOT_FORMATS = ("png", "svg", "pdf")


class CommandError(Exception):
    """A problem the user can fix (a missing extra, an unwritable path): message, exit 1."""


async def run_demo(
    strategy: ResourceCleanupStrategy,
    n: int,
    m: int,
    size: int,
    *,
    on_iteration: Callable[[int], object] | None = None,
    memory_limit: int | None = None,
) -> DemoResult:
    """n ops in a loop of m iterations, keeping only the last result (without cleanup: n*m buffers).

    ``on_iteration(i)`` is called after each iteration (the progress bar). A run that
    hits ``memory_limit`` stops there and reports it in :attr:`DemoResult.error`.
    """
    start = time.perf_counter()
    live: list[int] = []
    error: str | None = None
    config = SessionConfig(memory_limit=memory_limit)
    async with AsyncEagerSession(cleanup=strategy, config=config) as s:
        x = await s.random_normal((size,), dtype="float32", seed=0)
        last = x
        try:
            for i in range(m):
                y = x
                for _ in range(n):
                    y = await s.add(y, 1.0)  # the previous intermediate's handle is dropped here
                last = y
                live.append(s.stats().live_bytes)
                if on_iteration is not None:
                    on_iteration(i + 1)
        except ResourceExhaustedError as exc:
            error = f"stopped at iteration {len(live) + 1} of {m}: {exc}"
        y = last  # only the last result stays referenced
        await asyncio.sleep(0.01)  # an idle moment: IN_BACKGROUND frees without further ops
        stats = s.stats()
        del last, y
    return DemoResult(
        strategy, stats.peak_bytes, stats.live_bytes, s.stats().live_bytes, live, time.perf_counter() - start, error
    )


# -- arguments ------------------------------------------------------------------------
def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _strategy(text: str) -> ResourceCleanupStrategy:
    key = text.strip().upper().replace("-", "_")
    try:
        return ResourceCleanupStrategy[key]
    except KeyError:
        names = ", ".join(s.name.lower() for s in ResourceCleanupStrategy)
        raise argparse.ArgumentTypeError(f"unknown strategy {text!r}; choose from {names}") from None


def _plot_path(text: str) -> Path:
    path = Path(text)
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in _PLOT_FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the plot file must end in {', '.join('.' + f for f in _PLOT_FORMATS)}"
        )
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no directory {str(parent)!r}")
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiotensor", description="aiotensor: an asyncio-native eager tensor runtime")
    parser.add_argument("--version", action="version", version=f"aiotensor {_version('aiotensor')}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,info}")
    demo = sub.add_parser(
        "demo",
        help="the n x m loop under the three cleanup strategies",
        description="Run n ops in a loop of m iterations, keeping only the last result, under each cleanup"
        " strategy; print peak and final bytes and time.",
    )
    demo.add_argument("-n", "--ops", type=_positive, default=10, help="ops per iteration (default 10)")
    demo.add_argument("-m", "--iterations", type=_positive, default=100, help="iterations (default 100)")
    demo.add_argument("--size", type=_positive, default=10_000, help="float32 elements per tensor (default 10000)")
    demo.add_argument(
        "-s",
        "--strategy",
        type=_strategy,
        action="append",
        dest="strategies",
        metavar="NAME",
        help="run only this strategy (in_background, on_safe_points, on_session_close); repeatable",
    )
    demo.add_argument("--plot", type=_plot_path, metavar="FILE.png", help="draw live bytes per iteration (matplotlib)")
    demo.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="event loop (default asyncio)")
    demo.add_argument(
        "--memory-limit",
        type=_positive,
        metavar="BYTES",
        help="stop a strategy that holds more than this (default: half of this machine's memory)",
    )
    info = sub.add_parser("info", help="versions, devices, pool size, BLAS threads, where kernels run")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


# -- demo -----------------------------------------------------------------------------
def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise CommandError("--loop uvloop needs uvloop: pip install 'aiotensor[uvloop]'") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CommandError(f"--plot needs matplotlib, which is not installed: {_INSTALL_DEMO}") from None


def _demo(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plotting()  # before the runs, not after
    loop_factory = _loop_factory(args.loop)
    strategies: list[ResourceCleanupStrategy] = list(dict.fromkeys(args.strategies or ResourceCleanupStrategy))
    n, m, size = args.ops, args.iterations, args.size
    limit = args.memory_limit
    if limit is None and PHYSICAL_MEMORY is not None:
        limit = PHYSICAL_MEMORY // 2  # ON_SESSION_CLOSE holds n*m buffers: never let it swap the machine
    title = (
        f"{n} ops x {m} iterations on float32[{size}] ({size * 4:,} bytes per tensor),\nkeeping only the last result"
    )

    def run(strategy: ResourceCleanupStrategy, tick: Callable[[int], object] | None) -> DemoResult:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(run_demo(strategy, n, m, size, on_iteration=tick, memory_limit=limit))

    if importlib.util.find_spec("rich") is None:  # plain text, no progress bar
        results = _plain_report(title, strategies, m, run)
    else:
        results = rich_report(title, strategies, m, run)
    if args.plot is not None:
        try:
            plot(results, args.plot, title=f"live bytes per iteration: {n} ops x {m} iterations, float32[{size}]")
        except OSError as exc:
            raise CommandError(f"cannot write the plot to {str(args.plot)!r}: {exc}") from None
        print(f"plot written to {args.plot}")
    return 1 if any(r.error for r in results) else 0


def _plain_report(
    title: str,
    strategies: list[ResourceCleanupStrategy],
    m: int,
    run: Callable[[ResourceCleanupStrategy, Callable[[int], object] | None], DemoResult],
) -> list[DemoResult]:
    print(title + "\n")
    header = f"{'strategy':<18}{'peak bytes':>14}{'live at end':>14}{'after close':>14}{'seconds':>10}"
    print(header)
    print("-" * len(header))
    results = []
    for strategy in strategies:
        r = run(strategy, None)
        results.append(r)
        print(f"{strategy.name:<18}{r.peak_bytes:>14,}{r.final_bytes:>14,}{r.closed_bytes:>14,}{r.seconds:>10.2f}")
        if r.error:
            print(f"  {r.error}")
    return results


# -- info -----------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _blas() -> list[dict[str, Any]] | str:
    try:
        threadpoolctl = importlib.import_module("threadpoolctl")
    except ImportError:
        return "unknown: threadpoolctl is not installed (pip install 'aiotensor[bench]')"
    import numpy  # noqa: F401 -- loads numpy's BLAS so threadpoolctl can see it

    return [
        {"library": i.get("internal_api"), "version": i.get("version"), "threads": i.get("num_threads")}
        for i in threadpoolctl.threadpool_info()
        if i.get("user_api") == "blas"
    ]


def collect_info() -> dict[str, Any]:
    """What ``aiotensor info`` reports: versions, devices, pool size and priority, BLAS threads, placement constants."""
    import numpy

    from ._backends import _affinity
    from ._backends._base import DEFAULT_PRIORITY, default_executor
    from ._backends._priority import describe
    from ._fusion._batch_split import settings as batch_split_settings
    from ._loopload import BUSY_ABOVE, BUSY_FREE_US, BUSY_INLINE_US, GIL_TRANSFER_US, IDLE_BELOW
    from ._programs._blocked_jit import available as compiled_runs
    from ._programs._blocked_run import settings as blocked_settings

    pool = default_executor()
    return {
        "aiotensor": _version("aiotensor"),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "anyio": _version("anyio"),
        "uvloop": _version("uvloop"),
        "devices": AsyncEagerSession().list_devices(),
        "cpu_count": os.cpu_count(),
        "pool_workers": pool.max_workers,
        # What SessionConfig.worker_priority does by default, on this platform.
        "worker_priority": describe(DEFAULT_PRIORITY),
        "blas": _blas(),
        "physical_memory": PHYSICAL_MEMORY,
        "blocked": blocked_settings(),  # element-wise runs in blocks (measured: docs/performance.md)
        "numba": compiled_runs(),  # runs of correctly rounded float ops as one compiled loop, when installed
        "batch_split": batch_split_settings(),  # a long batch's callers in two parts (the same page)
        # Whether the worker woken for a split's second part is kept off its spawner's core (_affinity).
        "parts_steered": _affinity.can_steer(),
        # Where a cheap kernel runs: on the loop up to the first estimate, up to the second
        # while the loop is saturated and contended (busy-loop placement, at.loop_load()),
        # and above it too for kernels that run mostly holding the GIL.
        "inline": {
            "inline_threshold_us": SessionConfig().inline_threshold_us,
            "busy_inline_us": BUSY_INLINE_US,
            "busy_above": BUSY_ABOVE,
            "idle_below": IDLE_BELOW,
            "busy_free_us": BUSY_FREE_US,
            "gil_transfer_us": GIL_TRANSFER_US,
        },
    }


def _info(args: argparse.Namespace) -> int:
    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    blas = info["blas"]
    if isinstance(blas, list):
        blas = "; ".join(f"{b['library']} {b['version']}: {b['threads']} threads" for b in blas) or "none loaded"
    rows = {
        "aiotensor": info["aiotensor"],
        "python": info["python"],
        "platform": info["platform"],
        "numpy": info["numpy"],
        "anyio": info["anyio"],
        "uvloop": info["uvloop"] or "not installed",
        "devices": ", ".join(info["devices"]),
        "pool workers": f"{info['pool_workers']} (cpu count {info['cpu_count']})",
        "worker priority": info["worker_priority"],
        "BLAS": blas,
        "memory": f"{info['physical_memory']:,} bytes" if info["physical_memory"] else "unknown",
        "blocked runs": "element-wise runs in one step from {min_items:,} items, in blocks of {block_items:,}"
        " from {block_from_items:,}, shared by the workers from {split_min_bytes:,} bytes (from"
        " {split_idle_min_bytes:,} while a core is free, then in blocks of {split_block_items:,}, waiting up to"
        " {split_wait_us} µs for the second worker); one-block results aligned, {parked_bytes:,} bytes of"
        " misaligned chunks kept from malloc (at most {parked_max_bytes:,})".format(**info["blocked"]),
        "compiled runs": f"numba {info['numba']}: runs of + - * / abs sqrt square on one float dtype as one loop"
        if info["numba"]
        else "numba not installed (pip install aiotensor[jit]): runs in blocks of ufunc calls",
        "batched kernels": "a batch whose one-part kernel took {min_us:g} µs or more runs its callers in two"
        " parts on two workers while a core is free and BLAS is single-threaded (one run in {refresh_every}"
        " in one part, timed again), cut at a caller boundary on the first of {row_multiples} rows that keeps"
        " BLAS products' rows bit for bit".format(**info["batch_split"]),
        "split parts": "the worker woken for a second part runs off the core of the thread computing the first"
        if info["parts_steered"]
        else "placed by the OS scheduler (per-thread CPU affinity is Linux's)",
        "inline kernels": "estimated up to {inline_threshold_us:g} µs run on the loop; up to {busy_inline_us:g} µs"
        " while its thread is busy (over {busy_above:.0%}, until under {idle_below:.0%}), and above that"
        " if at most {busy_free_us:g} µs run without the GIL ({gil_transfer_us:g} µs off per release after"
        " the first)".format(**info["inline"]),
    }
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key + ':':<{width + 2}}{value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``aiotensor`` console script; returns the exit status.

    Bad arguments exit with status 2 and a usage message, a missing extra or an
    unwritable path with status 1 and one line naming the fix; never a traceback.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return _demo(args) if args.command == "demo" else _info(args)
    except CommandError as exc:
        print(f"aiotensor: error: {exc}", file=sys.stderr)
        return 1
    except AioTensorError as exc:
        print(f"aiotensor: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aiotensor: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
