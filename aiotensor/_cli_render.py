"""How ``aiotensor demo`` shows its results: a rich progress bar and table, a matplotlib plot.

rich and matplotlib are imported inside the functions, so importing this module (and
``aiotensor._cli``) costs nothing when the ``demo`` extra is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._config import ResourceCleanupStrategy

__all__ = ["plot", "rich_report"]

# One look per strategy, kept the same in the table and the plot.
_STYLE = {
    "IN_BACKGROUND": ("tab:green", "-"),
    "ON_SAFE_POINTS": ("tab:blue", "--"),
    "ON_SESSION_CLOSE": ("tab:red", "-"),
}


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What one strategy did on the demo loop.

    Attributes:
        strategy: The cleanup strategy.
        peak_bytes: The most bytes the session held at once.
        final_bytes: Bytes held after the loop and an idle moment, the input and the last result referenced.
        closed_bytes: Bytes held after close (always 0).
        live_per_iteration: Bytes held at the end of each iteration.
        seconds: Wall time of the whole run, session open to close.
        error: Why the run stopped early (e.g. the memory limit), or ``None``.
    """

    strategy: ResourceCleanupStrategy
    peak_bytes: int
    final_bytes: int
    closed_bytes: int
    live_per_iteration: list[int]
    seconds: float
    error: str | None = field(default=None)


def rich_report(
    title: str,
    strategies: Sequence[ResourceCleanupStrategy],
    m: int,
    run: Callable[[ResourceCleanupStrategy, Callable[[int], object] | None], DemoResult],
) -> list[DemoResult]:
    """Run each strategy under a progress bar, then print a table of bytes and times.

    On a terminal that is not a tty (a pipe, CI) rich prints the finished bars once
    instead of animating them, so the output stays readable.
    """
    from rich.console import Console
    from rich.filesize import decimal
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console(highlight=False)
    console.print(title)
    results: list[DemoResult] = []
    columns = (TextColumn("{task.description:<17}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        for strategy in strategies:
            task = progress.add_task(strategy.name, total=m)

            def tick(i: int, task: TaskID = task) -> None:
                progress.update(task, completed=i)

            results.append(run(strategy, tick))

    table = Table(title="bytes held by the session", title_justify="left")
    table.add_column("strategy")
    for name in ("peak", "live at end", "after close", "seconds"):
        table.add_column(name, justify="right")
    for r in results:
        color = _STYLE[r.strategy.name][0].removeprefix("tab:")
        table.add_row(
            f"[{color}]{r.strategy.name}[/]",
            decimal(r.peak_bytes),
            decimal(r.final_bytes),
            decimal(r.closed_bytes),
            f"{r.seconds:.2f}",
        )
    console.print(table)
    console.print(
        "live at end: after a 10 ms idle moment, with the input and the last result held.\n"
        "ON_SAFE_POINTS frees the last dropped intermediate at its next op;\n"
        "ON_SESSION_CLOSE holds every intermediate (n x m buffers) until close."
    )
    for r in results:
        if r.error:
            console.print(f"[red]{r.strategy.name}: {r.error}[/]")
    return results


def plot(results: Sequence[DemoResult], path: Path, *, title: str) -> None:
    """Draw live bytes per iteration for each strategy (log scale) into ``path``.

    Uses a bare ``Figure`` (no pyplot): no GUI backend, no global figure state.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter, MaxNLocator

    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.add_subplot()
    for r in results:
        color, style = _STYLE[r.strategy.name]
        xs = range(1, len(r.live_per_iteration) + 1)
        label = f"{r.strategy.name} (peak {r.peak_bytes / 1e6:.3g} MB)"
        ax.plot(xs, r.live_per_iteration, style, color=color, linewidth=2, label=label)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(EngFormatter(unit="B"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration")
    ax.set_ylabel("live bytes (log scale)")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="center right")
    fig.savefig(path, dpi=120)
