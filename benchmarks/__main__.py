"""Run the whole benchmark suite in one process: ``python -m benchmarks [--quick]``.

Prints every table (median and min-max over rounds) and the goals for measured ratios; with
``--write-docs`` it also writes ``docs/performance.md`` with the plots under ``docs/img/``
(without it, a run changes no tracked file). The web and Dask
benchmarks (``bench_web.py``, ``bench_distributed.py``, owned by their examples) run
as subprocesses when present, writing ``benchmarks/results/bench_*.md``; those
snippets (fresh, or from an earlier run) become sections of the page.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import (
    bench_batching,
    bench_blocked,
    bench_dispatch,
    bench_input,
    bench_kernels,
    bench_memory,
    bench_overheads,
    bench_pool,
)
from ._harness import Report, settle_allocator
from ._report import markdown, plot, print_console

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SCENARIOS: dict[str, Callable[[Report], None]] = {
    "dispatch": bench_dispatch.run,
    "overheads": bench_overheads.run,
    "memory": bench_memory.run,
    "kernels": bench_kernels.run,
    "batching": bench_batching.run,
    "pool": bench_pool.run,
    "blocked": bench_blocked.run,
    "input": bench_input.run,
}
EXTERNAL: dict[str, tuple[str, list[str], list[str]]] = {
    "web": ("bench_web.py", ["--quick"], []),
    "distributed": ("bench_distributed.py", ["--quick"], []),
}


def _external(report: Report, name: str, quick: bool, run: bool, timeout: float, write: bool) -> None:
    """Run bench_<name>.py (if asked) and include its snippet.

    Its snippet goes to ``benchmarks/results/bench_<name>.md`` (tracked) only with
    ``write``; otherwise to a temporary file, so that a run leaves the checkout as it was.
    """
    script, quick_args, full_args = EXTERNAL[name]
    path = ROOT / "benchmarks" / script
    kept = RESULTS / f"{path.stem}.md"
    snippet = kept if write else Path(tempfile.mkdtemp(prefix="aiotensor-bench-")) / kept.name
    extra = quick_args if quick else full_args
    shown = " ".join(["python", f"benchmarks/{script}", *extra])
    if run and path.exists():
        snippet.parent.mkdir(exist_ok=True)
        cmd = [sys.executable, str(path), *extra, "--markdown", str(snippet)]
        try:
            done = subprocess.run(cmd, cwd=ROOT, check=True, timeout=timeout, capture_output=True, text=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            stderr = str(getattr(exc, "stderr", "") or "")
            report.sections.append((f"{name}: `{shown}` failed", f"```\n{stderr[-1500:]}\n```"))
            return
        if not snippet.exists():  # the benchmark skipped itself (e.g. bench_web without wrk): say why
            said = (done.stdout or "").strip().splitlines()[-1:] or ["no output"]
            report.sections.append((f"{name}: `{shown}` skipped", said[0]))
            return
        title = f"{name} (`{shown}`, run by this command)"
    elif kept.exists():
        snippet = kept
        title = f"{name} (from `benchmarks/results/{snippet.name}`, written by an earlier `{shown}`)"
    else:
        return
    report.sections.append((title, snippet.read_text()))


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the suite."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds (< 60 s, a smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per measurement (default 5, quick 2)")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--external", choices=["auto", "yes", "no"], default="auto",
                        help="run bench_web.py / bench_distributed.py too (auto: not with --quick or --only);"
                             " when not run, their last snippets in benchmarks/results/ are included")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "performance.md", help="the page to write")
    parser.add_argument(
        "--write-docs",
        action="store_true",
        help="also write the page (--out), its plots and benchmarks/results/; without it a run changes no tracked file",
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    report = Report(quick=args.quick, rounds=rounds)
    start = time.perf_counter()
    settle_allocator()
    for name in args.only or SCENARIOS:
        t0 = time.perf_counter()
        try:
            SCENARIOS[name](report)
        except Exception:  # one broken scenario must not lose the others' numbers
            report.sections.append((f"scenario {name} failed", f"```\n{traceback.format_exc()}\n```"))
            traceback.print_exc()
        print(f"[{name}: {time.perf_counter() - t0:.1f} s]", file=sys.stderr)
    run_external = args.external == "yes" or (args.external == "auto" and not args.quick and not args.only)
    for name in EXTERNAL:
        _external(report, name, args.quick, run_external, timeout=900, write=args.write_docs)
    print_console(report)
    print(f"[total: {time.perf_counter() - start:.1f} s]", file=sys.stderr)
    if args.write_docs:
        images = plot(report, args.out.parent / "img")
        command = "python -m benchmarks" + (" --quick" if args.quick else "")
        commentary_file = ROOT / "benchmarks" / "commentary.md"
        commentary = commentary_file.read_text() if commentary_file.exists() else ""
        args.out.write_text(markdown(report, command, images, commentary))
        print(f"wrote {args.out} and {len(images)} plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
