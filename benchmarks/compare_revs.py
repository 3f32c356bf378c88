"""Two git revisions, the same benchmarks, runs alternated in one sitting: ratios side by side.

``python -m benchmarks.compare_revs 955bf55 main`` exports each revision with
``git archive`` into a temporary directory (the checkout is not touched) and runs the
chosen benchmark modules (default ``bench_engine``, ``bench_batching``, ``bench_pool``)
alternately in the two trees, ``--alternations`` times each, every run a fresh
process of the same interpreter with ``PYTHONPATH`` and the working directory set to
its tree: the before/after order alternates too, so drift in the machine's load lands
on both. Each row's ratio to the benchmark's own baseline (numpy, ``asyncio.to_thread``,
the fused call, ...), measured in that same run, is collected; the table prints, per
row, the median [min-max] of those ratios for each revision and the after/before
ratio of the medians (each ratio reads as its benchmark defines it: a time over the
baseline's, lower is better, unless the table says throughput). A ratio, never an
absolute time, is compared: on a shared machine only a baseline of the same run
means anything.

Per-module arguments keep runs short, e.g.
``--args bench_engine="--rounds 3 -n 300" --args bench_pool="--quick"``; the defaults
below are short settings (a few minutes for the three modules, two alternations).

How rows are read: a benchmark that prints through ``benchmarks._report.print_console``
has its ``Report`` captured as JSON instead of printed (row label, ratio, and the table's
title up to its first parenthesis, where run-dependent figures live); any other
benchmark's stdout is read as lines ending in three numbers, the last a ratio
(``bench_engine``'s format), or as indented rows ending in a statistic's
``median (min-max)`` and a ratio written ``0.96x``, each under its table's title, an
unindented line (``bench_blocked``'s format).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

DEFAULT_MODULES = ("bench_engine", "bench_batching", "bench_pool")
DEFAULT_ARGS = {
    "bench_engine": "--rounds 3 -n 300",
    "bench_batching": "--rounds 2 --requests 15",
    "bench_pool": "--quick",
}
MARK = "@@compare_revs@@"

# Runs inside the exported tree: the report is emitted as JSON after MARK instead of a rich table.
_DRIVER = r"""
import json, runpy, sys
from pathlib import Path
import aiotensor
tree = Path(sys.argv[1]).resolve()
if tree not in Path(aiotensor.__file__).resolve().parents:
    raise SystemExit(f"aiotensor imported from {aiotensor.__file__}, not from {tree}")
import benchmarks._report as _report
def dump(report):
    rows = [
        {"table": t.title.split(" (")[0], "label": row.label, "ratio": row.ratio}
        for t in report.tables for row in t.rows if row.ratio is not None
    ]
    print(MARK + json.dumps(rows))
_report.print_console = dump
module = "benchmarks." + sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
""".replace("MARK", repr(MARK))

_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_STDOUT_ROW = re.compile(rf"^(?P<label>\S.*?)\s+{_NUMBER}\s+{_NUMBER}\s+(?P<ratio>{_NUMBER})\s*$")
# An indented row: label, ``median (min-max)`` (Stat.fmt), ratio with an "x".
_STAT_ROW = re.compile(rf"^\s+(?P<label>\S.*?)\s+{_NUMBER}\s+\({_NUMBER}-{_NUMBER}\)\s+(?P<ratio>{_NUMBER})x\s*$")

Rows = dict[tuple[str, str], float]


def export(rev: str, into: Path) -> str:
    """Write ``rev``'s tracked files into ``into``; return the full commit hash."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", "--format=tar", commit], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    with tempfile.TemporaryFile() as tmp:
        tmp.write(archive)
        tmp.seek(0)
        with tarfile.open(fileobj=tmp) as tar:
            tar.extractall(into, filter="data")
    return commit


def parse(module: str, stdout: str) -> Rows:
    """The rows of one run: (table, label) -> ratio."""
    rows: Rows = {}
    for line in stdout.splitlines():
        if line.startswith(MARK):
            for r in json.loads(line[len(MARK) :]):
                rows[(r["table"], r["label"])] = float(r["ratio"])
            return rows
    title = module  # of the rows in the x format: the last unindented line above them
    for line in stdout.splitlines():
        if m := _STDOUT_ROW.match(line):
            rows[(module, m["label"])] = float(m["ratio"])
        elif m := _STAT_ROW.match(line):
            rows[(title, m["label"])] = float(m["ratio"])
        elif line.strip() and not line[0].isspace():
            title = line.strip()
    return rows


def run_once(tree: Path, module: str, args: str, timeout: float) -> Rows:
    """One run of ``benchmarks.<module>`` in ``tree``, as a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-c", _DRIVER, str(tree), module, *shlex.split(args)]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{module} in {tree} exited {done.returncode}:\n{done.stderr[-3000:]}")
    rows = parse(module, done.stdout)
    if not rows:
        raise RuntimeError(f"{module} in {tree} printed no ratio row:\n{done.stdout[-2000:]}")
    return rows


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def table(module: str, names: tuple[str, str], runs: tuple[list[Rows], list[Rows]]) -> str:
    """Markdown: per row, each revision's median [min-max] ratio and after/before."""
    keys: list[tuple[str, str]] = []
    for side in runs:
        for rows in side:
            keys += [k for k in rows if k not in keys]
    lines = [
        f"**{module}**",
        "",
        f"| table | row | {names[0]} | {names[1]} | after/before |",
        "|---|---|---:|---:|---:|",
    ]
    for key in keys:
        before, after = ([r[key] for r in side if key in r] for side in runs)
        change = f"{statistics.median(after) / statistics.median(before):.2f}" if before and after else "-"
        lines.append(f"| {key[0]} | {key[1]} | {_fmt(before)} | {_fmt(after)} | {change} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, export both revisions, alternate the runs, print the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare_revs", description=__doc__.splitlines()[0])
    parser.add_argument("before", help="git revision measured as 'before'")
    parser.add_argument("after", help="git revision measured as 'after'")
    parser.add_argument("--modules", nargs="+", default=list(DEFAULT_MODULES), help="benchmark modules to run")
    parser.add_argument("--alternations", type=int, default=2, help="runs of each module per revision")
    parser.add_argument("--args", action="append", default=[], metavar="MODULE=ARGS",
                        help="arguments for one module (repeatable); defaults: " + str(DEFAULT_ARGS))  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    opts = parser.parse_args(argv)
    extra = dict(DEFAULT_ARGS)
    for item in opts.args:
        module, _, args = item.partition("=")
        extra[module] = args
    with tempfile.TemporaryDirectory(prefix="compare_revs_") as tmp:
        trees = (Path(tmp) / "before", Path(tmp) / "after")
        commits = [export(rev, tree) for rev, tree in zip((opts.before, opts.after), trees, strict=True)]
        names = (f"{opts.before} ({commits[0][:7]})", f"{opts.after} ({commits[1][:7]})")
        print(f"before {names[0]}, after {names[1]}; {opts.alternations} alternations; python {sys.executable}")
        print(f"load average at the start: {os.getloadavg()}")
        for module in opts.modules:
            args = extra.get(module, "")
            runs: tuple[list[Rows], list[Rows]] = ([], [])
            for i in range(opts.alternations):
                # ABBA order: neither revision always runs first, so a load trend lands on both.
                order = (0, 1) if i % 2 == 0 else (1, 0)
                for side in order:
                    print(f"  {module} {args!r} on {names[side]}, run {i + 1}", file=sys.stderr, flush=True)
                    runs[side].append(run_once(trees[side], module, args, opts.timeout))
            print()
            print(table(module, names, runs))
    print()
    print(f"load average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
