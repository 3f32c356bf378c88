"""Rendering a :class:`Report`: a rich table on the console, markdown and matplotlib PNGs for the docs."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np

import aiotensor as at

from ._harness import Report, Table

VERDICT = {True: "yes", False: "**no**", None: "not judged (--quick)"}
#: What the goals table shows, said once above it (console and page).
GOALS_NOTE = (
    "Each row: what is measured and against which baseline, timed in the same run, with the goal set for the"
    " ratio; the measured ratio; whether this run reached the goal."
)


def machine() -> str:
    """One line on what the numbers were measured on, with the load while they were."""
    load = ""
    if hasattr(os, "getloadavg"):
        one, five, fifteen = os.getloadavg()
        load = f", load average {one:.1f} / {five:.1f} / {fifteen:.1f}"
    return (
        f"{os.cpu_count()} cores, {platform.machine()}, Python {sys.version.split()[0]}, numpy {np.__version__},"
        f" aiotensor {at.__version__}, BLAS threads {at.blas_threads()}{load} (1 / 5 / 15 min, at the end)"
    )


def print_console(report: Report) -> None:
    """Every table and the goals, on the terminal."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table as RichTable

    console = Console()
    for t in report.tables:
        rt = RichTable(title=t.title, title_justify="left")
        rt.add_column("variant")
        rt.add_column(f"{t.unit}: median (min-max)", justify="right")
        if t.ratio_label:
            rt.add_column(t.ratio_label, justify="right")
        for row in t.rows:
            cells = [escape(row.label) + (escape(f"  [{row.note}]") if row.note else ""), row.stat.fmt(t.digits)]
            if t.ratio_label:
                cells.append("" if row.ratio is None else f"{row.ratio:.2f}")
            rt.add_row(*cells)
        console.print(rt)
    if not report.targets:
        return
    rt = RichTable(title="goals", caption=GOALS_NOTE, title_justify="left", caption_justify="left")
    for col in ("what is measured, against which baseline (goal)", "measured", "goal reached"):
        rt.add_column(col)
    for target in report.targets:
        rt.add_row(target.text, target.measured, VERDICT[target.met].strip("*"))
    console.print(rt)


def _markdown_table(t: Table) -> str:
    head = f"| variant | {t.unit}: median (min-max) |" + (f" {t.ratio_label} |" if t.ratio_label else "")
    sep = "|---|---:|" + ("---:|" if t.ratio_label else "")
    lines = [f"**{t.title}**", "", head, sep]
    for row in t.rows:
        label = row.label + (f" ({row.note})" if row.note else "")
        cells = f"| {label} | {row.stat.fmt(t.digits)} |"
        if t.ratio_label:
            cells += " |" if row.ratio is None else f" {row.ratio:.2f} |"
        lines.append(cells)
    if t.note:
        lines += ["", t.note]
    return "\n".join(lines)


def plot(report: Report, img_dir: Path) -> list[str]:
    """Write the PNGs; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    latency = {k: v for k, v in report.series.items() if k.startswith("latency_")}
    if latency:
        fig, axes = plt.subplots(1, len(latency), figsize=(6.5 * len(latency), 4.8), squeeze=False)
        for ax, (key, series) in zip(axes[0], sorted(latency.items()), strict=True):
            for label, points in series.items():
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("float32 elements per operand")
            ax.set_ylabel("µs per add (median)")
            ax.set_title(f"per-op latency, {key.removeprefix('latency_')} loop")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(img_dir / "perf_latency.png", dpi=110)
        plt.close(fig)
        written.append("perf_latency.png")
    memory = report.series.get("memory")
    if memory:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        styles = ["-", "--", "-.", ":"]
        for i, (label, points) in enumerate(memory.items()):
            xs, ys = zip(*points, strict=True)
            # dashes keep the bounded strategies visible where their lines coincide
            ax.plot(xs, [y / 1e6 for y in ys], styles[i % len(styles)], label=label, linewidth=2.5 - 0.4 * i)
        ax.set_yscale("log")
        ax.set_xlabel("iteration (m)")
        ax.set_ylabel("live MB after the iteration")
        ax.set_title("the demo's loop: live bytes per strategy")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(img_dir / "perf_memory.png", dpi=110)
        plt.close(fig)
        written.append("perf_memory.png")
    return written


def markdown(report: Report, command: str, images: list[str], commentary: str) -> str:
    """The whole ``docs/performance.md``."""
    out = [
        "# Performance",
        "",
        "<!-- Written by `python -m benchmarks --write-docs`:"
        " edit benchmarks/commentary.md or benchmarks/_report.py instead. -->",
        "",
        f"Measured with `{command}` on {machine()}."
        f" Each figure is the median over {report.rounds} rounds, with the fastest and slowest round in"
        " brackets; ratios compare medians measured in the same run. The machine was shared while this ran,"
        " so absolute times are noisy: read the ratios. glibc's allocator is settled before the first"
        " scenario (`benchmarks/_harness.py`, `settle_allocator`), so that no baseline pays page faults"
        " that depend on what the process happened to free earlier.",
        "",
        "## Goals",
        "",
        GOALS_NOTE,
        "",
        "| what is measured, against which baseline (goal) | measured | goal reached |",
        "|---|---|---|",
    ]
    out += [f"| {t.text} | {t.measured} | {VERDICT[t.met]} |" for t in report.targets]
    out += ["", commentary.strip(), ""]
    for name in images:
        out += [f"![{name}](img/{name})", ""]
    out += ["## Tables", ""]
    for t in report.tables:
        out += [_markdown_table(t), ""]
    for title, body in report.sections:
        out += [f"## {title}", "", body.strip(), ""]
    return "\n".join(out)
