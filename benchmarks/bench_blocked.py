"""Issue 30: element-wise runs evaluated in cache-sized blocks, against numpy's op-by-op chain.

Rows (asyncio and uvloop, aiotensor and numpy interleaved round by round, ratio of
medians): the 10-op float32 chain of ``bench_engine`` at 16 floats, 256x256,
1024x1024 and 2048x2048, and the standardization
``(x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8)`` on (4096, 512).

``python -m benchmarks.bench_blocked`` prints the table; ``--calibrate`` measures the
block size and the split threshold on the kernel itself (what ``_blocked``'s constants
come from); ``--write-docs`` also times the chain's kernel alone at more sizes and writes
``docs/img/perf_blocked.png`` (ratio vs size).
Without it nothing in the checkout is written. ``--trace RUNS`` stamps where awaited
1024x1024 chains spend their time, beside the two-thread split written by hand with no
runtime (``_blocked_trace``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

import aiotensor as at

from ._harness import Report, Stat, calibrated, calibrated_sync, interleaved, loop_factories, run_on, settle_allocator

SIZES: dict[str, tuple[int, ...]] = {
    "16 floats": (16,),
    "256x256": (256, 256),
    "1024x1024": (1024, 1024),
    "2048x2048": (2048, 2048),
}
#: The issue's targets (ratio to numpy), per case.
TARGETS = {"16 floats": 5.0, "256x256": 1.0, "1024x1024": 0.5, "2048x2048": 0.35, "standardization": 0.7}
STANDARDIZE_SHAPE = (4096, 512)
ROOT = Path(__file__).resolve().parent.parent


def chain(v: Any) -> Any:
    """The 10-op chain (``* + - * / + abs * - +``) on an array or a tensor (an expression)."""
    y = v * 2.0 + 1.0
    y = y - 0.5
    y = y * y
    y = y / 3.0
    y = y + v
    y = abs(y)
    y = y * 0.1
    y = y - v
    return y + 1.0


def standardize(v: Any) -> Any:
    """Columns to zero mean and unit deviation."""
    return (v - v.mean(axis=0)) / (v.std(axis=0) + 1e-8)


async def _case(
    s: at.AsyncEagerSession, formula: Callable[[Any], Any], value: Any, rounds: int, budget: float
) -> tuple[Stat, Stat]:
    t = await s.constant(value)

    async def ours() -> Any:
        return await formula(t)

    variants: dict[str, Callable[[], Awaitable[float]]] = {
        "numpy": calibrated_sync(lambda: formula(value), budget),
        "aiotensor": await calibrated(ours, budget),
    }
    found = await interleaved(variants, rounds)
    return found["aiotensor"], found["numpy"]


async def measure(rounds: int, budget: float, sizes: dict[str, tuple[int, ...]]) -> dict[str, tuple[Stat, Stat]]:
    """case -> (aiotensor µs, numpy µs) over interleaved rounds, in one session."""
    settle_allocator()
    rng = np.random.default_rng(0)
    out: dict[str, tuple[Stat, Stat]] = {}
    async with at.AsyncEagerSession() as s:
        for label, shape in sizes.items():
            value = rng.standard_normal(shape).astype(np.float32)
            out[label] = await _case(s, chain, value, rounds, budget)
        value = rng.standard_normal(STANDARDIZE_SHAPE).astype(np.float32)
        out["standardization"] = await _case(s, standardize, value, rounds, budget)
    return out


def _ratio(pair: tuple[Stat, Stat]) -> float:
    return pair[0].median / pair[1].median


def run(report: Report) -> None:
    """The rows of blocked evaluation and their goals, on every loop."""
    rounds = max(3, report.rounds)
    budget = 0.02 if report.quick else 0.1
    sizes = dict(SIZES)
    series: dict[str, list[tuple[float, float]]] = {}
    for loop_name in loop_factories():
        found = run_on(loop_name, measure(rounds, budget, sizes))
        t = report.table(
            f"blocked element-wise runs, {loop_name}: float32, aiotensor vs numpy in one run",
            "µs",
            ratio_label="x numpy",
        )
        for label, pair in found.items():
            name = "10-op chain" if label != "standardization" else f"standardization {STANDARDIZE_SHAPE}"
            t.add(
                f"{name} {label if label != 'standardization' else ''}".strip() + ": aiotensor", pair[0], _ratio(pair)
            )
            t.add(f"{name} {label if label != 'standardization' else ''}".strip() + ": numpy", pair[1], 1.0)
            ratio = _ratio(pair)
            shown = name if label == "standardization" else f"{name} {label}"
            report.target(30, f"{loop_name}: {shown} <= {TARGETS[label]}x numpy", f"{ratio:.2f}x", None
                          if report.quick else ratio <= TARGETS[label])  # fmt: skip
        series[loop_name] = [(float(np.prod(SIZES[k])), _ratio(found[k])) for k in SIZES]
    report.series["blocked"] = series


def plot(series: dict[str, list[tuple[float, float]]], path: Path) -> None:
    """Ratio to numpy against elements per operand, one line per loop."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=label)
    ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("float32 elements per operand")
    ax.set_ylabel("aiotensor / numpy (median time)")
    ax.set_title("10-op chain, blocked evaluation vs numpy's op-by-op chain")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- calibration: the block size and the split threshold, measured on the kernel ------------
def _kernel_program(shape: tuple[int, ...]) -> tuple[Any, Any]:
    # The chain's compiled program (one blocked step) and its input.
    from aiotensor._engine._expressions import _is_tensor
    from aiotensor._expr import Expr
    from aiotensor._programs._compile import compile_program

    async def build() -> tuple[Any, Any]:
        async with at.AsyncEagerSession() as s:
            value = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            t = await s.constant(value)
            e = chain(t)
            program, _ = compile_program([e], _is_tensor, "numpy", Expr)
            await e
            return program, value

    return asyncio.run(build())


def _time(fn: Callable[..., Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def _quartiles(variants: dict[Any, Callable[[], Any]], calls: int) -> dict[Any, float]:
    # Each variant's first-quartile time of one call, the variants called in turn call by
    # call: on a shared machine a slow stretch hits every variant alike, and the fastest
    # quarter of the calls is what each costs when the core and the memory bus are its.
    times: dict[Any, list[float]] = {k: [] for k in variants}
    for _ in range(calls):
        for k, fn in variants.items():
            start = time.perf_counter_ns()
            fn()
            times[k].append(time.perf_counter_ns() - start)
    return {k: float(np.percentile(v, 25)) for k, v in times.items()}


def calibrate(rounds: int, only_split: bool = False) -> None:
    """Print the chain's time per block size (one thread), and split vs one thread on the pool.

    Ratios to numpy's chain (or to one worker), first quartile of ``rounds * 10`` calls
    per variant, the variants interleaved call by call (see :func:`_quartiles`). The
    interpreter's blocks are measured: runs as one compiled loop (``_blocked_layout.JIT``) are off.
    """
    from aiotensor._programs import _blocked_layout

    jit = _blocked_layout.JIT
    _blocked_layout.JIT = False
    try:
        _calibrate(rounds, only_split)
    finally:
        _blocked_layout.JIT = jit


def _calibrate(rounds: int, only_split: bool) -> None:
    from aiotensor._backends._base import default_executor
    from aiotensor._programs import _blocked_run as _blocked
    from aiotensor._programs import _blocked_split as _split

    settle_allocator()
    pool = default_executor()
    chosen, threshold, split_from = _blocked.BLOCK_ITEMS, _blocked.BLOCK_FROM_ITEMS, _split.SPLIT_MIN_BYTES
    calls = rounds * 10
    print("block items, and one pass per op in place ('whole'): ratio to numpy's chain, one thread")
    for n in () if only_split else (512, 1024, 2048, 4096):
        _blocked.BLOCK_FROM_ITEMS = 1 << 62
        whole, value = _kernel_program((n, n))
        variants: dict[Any, Callable[[], Any]] = {
            "numpy": functools.partial(chain, value),
            "whole": functools.partial(whole.fresh(), value),
        }
        _blocked.BLOCK_FROM_ITEMS = 0
        for items in (16384, 32768, 65536, 131072):
            _blocked.BLOCK_ITEMS = items
            program, _ = _kernel_program((n, n))  # (its layout, with these blocks, is kept by its run)
            variants[items] = functools.partial(program.fresh(), value)
        found = _quartiles(variants, max(5, calls * 1024 * 1024 // (n * n) // 4))
        print(f"{n}x{n}", "  ".join(f"{k}: {t / found['numpy']:.2f}" for k, t in found.items() if k != "numpy"))
    _blocked.BLOCK_ITEMS, _blocked.BLOCK_FROM_ITEMS = chosen, threshold
    print("split over the pool's workers vs one worker, per split block size (items): ratio")
    print("(and each variant's ratio to numpy's chain on the calling thread, in brackets)")
    _blocked.BLOCK_FROM_ITEMS = _split.SPLIT_MIN_BYTES = 0
    core_free = _split.core_free
    _split.core_free = lambda: True  # (split whatever the machine runs: the variants are what they say)
    for shape in SPLIT_SHAPES:
        variants, value = _split_variants(shape, pool, _split)
        found = _quartiles(variants, calls)
        print(
            f"[a core free {_free_share(core_free):.0%}]",
            f"{shape} ({value.nbytes:,} bytes):",
            "  ".join(
                f"{k}: {t / found['one']:.2f} [{t / found['numpy']:.2f}]" for k, t in found.items() if k != "numpy"
            ),
        )
    _blocked.BLOCK_FROM_ITEMS, _split.SPLIT_MIN_BYTES, _split.core_free = threshold, split_from, core_free


def _free_share(core_free: Callable[[], bool]) -> float:
    # How often a core was free (``_blocked_split.core_free``) over the next 50 ms.
    found = 0
    for _ in range(50):
        found += core_free()
        time.sleep(0.001)
    return found / 50


#: The outputs the split calibration measures (float32: 2 to 32 MiB).
SPLIT_SHAPES = ((512, 1024), (1024, 1024), (2048, 1024), (4096, 512), (2048, 2048), (4096, 2048))
#: The split block sizes it compares (output elements per block of a split run).
SPLIT_ITEMS = (65536, 131072, 262144, 524288)


def _split_variants(shape: tuple[int, int], pool: Any, split_mod: Any) -> tuple[dict[Any, Callable[[], Any]], Any]:
    # numpy's chain; the kernel on one worker (blocks of BLOCK_ITEMS); split over the pool's
    # workers, one program per split block size, each layout made (at its first split
    # run) while SPLIT_BLOCK_ITEMS has its size. Each writes into a result buffer of its
    # own, as awaited runs write into one the session's cache recycled (a fresh 16 MiB
    # result is an mmap whose pages fault as they are written, which two threads do
    # under one lock).
    chosen = split_mod.SPLIT_BLOCK_ITEMS
    program, value = _kernel_program(shape)

    def on_pool(program: Any, workers: int) -> Callable[[], Any]:
        out = np.empty_like(value)

        def call() -> Any:
            kernel = split_mod.with_pool(program.fresh(), pool.spawn, workers)
            return pool.submit(functools.partial(kernel, value, out=out)).result()

        return call

    variants: dict[Any, Callable[[], Any]] = {"numpy": functools.partial(chain, value), "one": on_pool(program, 1)}
    for items in SPLIT_ITEMS:
        split_mod.SPLIT_BLOCK_ITEMS = items
        program, _ = _kernel_program(shape)
        variants[items] = on_pool(program, pool.max_workers)
        variants[items]()  # (its split layout made now, with these blocks)
    split_mod.SPLIT_BLOCK_ITEMS = chosen
    return variants, value


def kernel_sweep(rounds: int) -> list[tuple[float, float]]:
    """The compiled chain's kernel alone (one thread, no dispatch) against numpy's chain, per size.

    The kernel an awaited run takes: one compiled loop when numba is installed, made at
    its first run here (not on a thread of its own while the interpreter runs).
    """
    from aiotensor._programs import _blocked_jit

    background = _blocked_jit.BACKGROUND
    _blocked_jit.BACKGROUND = False
    try:
        return _kernel_sweep(rounds)
    finally:
        _blocked_jit.BACKGROUND = background


def _kernel_sweep(rounds: int) -> list[tuple[float, float]]:
    settle_allocator()
    points = []
    for n in (64, 128, 256, 512, 1024, 1448, 2048, 2896, 4096):
        program, value = _kernel_program((n, n))
        calls = max(3, int(1e6 // value.size))
        ratios = []
        for _ in range(rounds):
            base = _time(lambda v=value: chain(v), calls)
            ratios.append(_time(lambda v=value, p=program: p.fresh()(v), calls) / base)
        points.append((float(value.size), statistics.median(ratios)))
    return points


def lines(report: Report) -> list[str]:
    """The tables as printed: a title, then per row its label, time and ratio to numpy (``0.96x``)."""
    out: list[str] = []
    for t in report.tables:
        out.append(t.title)
        out += [f"  {row.label:48} {row.stat.fmt(1):>28} {row.ratio:6.2f}x" for row in t.rows]
    return out


def main() -> None:
    """Run on asyncio and uvloop and print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--calibrate", action="store_true", help="measure the block size and the split threshold")
    parser.add_argument("--only-split", action="store_true", help="with --calibrate: the split threshold alone")
    parser.add_argument("--write-docs", action="store_true", help="also write docs/img/perf_blocked.png")
    parser.add_argument(
        "--trace", type=int, metavar="RUNS", help="where RUNS awaited 1024x1024 chains spend their time (asyncio)"
    )
    args = parser.parse_args()
    if args.trace:
        from . import _blocked_trace

        _blocked_trace.main(chain, SIZES["1024x1024"], args.trace)
        return
    if args.calibrate:
        calibrate(args.rounds, args.only_split)
        return
    report = Report(quick=args.quick, rounds=args.rounds)
    run(report)
    print("\n".join(lines(report)))
    if args.write_docs:
        series = dict(report.series["blocked"])
        series["kernel alone, one thread (no dispatch)"] = kernel_sweep(args.rounds)
        print("kernel alone:", "  ".join(f"{int(x)}: {y:.2f}x" for x, y in series[list(series)[-1]]))
        plot(series, ROOT / "docs" / "img" / "perf_blocked.png")
        print("wrote docs/img/perf_blocked.png")


if __name__ == "__main__":
    main()
