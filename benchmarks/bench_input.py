"""A request body's rows to an array: ``aiotensor.web.parse_rows`` against the usual ways, in one run.

Each variant turns the same JSON body ``{"inputs": [[64 floats], ...]}`` (16 and 512
rows, floats as ``json.dumps`` writes them) into a float32 ``(rows, 64)`` array:

* ``json.loads`` + ``np.asarray(list_of_lists)``: the standard library's parser and one
  conversion, with no check (the baseline);
* pydantic's ``list[list[float]]`` as FastAPI parses a body (``json.loads``, then the
  model validates the Python lists), then ``np.asarray``;
* pydantic's own JSON parser (``model_validate_json``), then ``np.asarray``;
* ``web.parse_rows``: orjson when installed, then ``np.asarray``, with the width,
  raggedness, type and non-finite checks.

Run: ``python -m benchmarks.bench_input [--rounds N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from pydantic import BaseModel

from aiotensor import web

from ._harness import Report, Stat, calibrated_sync, interleaved, ratio

WIDTH = 64
SIZES = (16, 512)
BASELINE = "json.loads + np.asarray(list_of_lists)"
PYDANTIC = "pydantic list[list[float]] (json.loads, validate) + np.asarray"
PYDANTIC_JSON = "pydantic list[list[float]] (model_validate_json) + np.asarray"
PARSE_ROWS = "web.parse_rows (checked)"


class _Body(BaseModel):
    inputs: list[list[float]]


def body_of(rows: int, seed: int = 0) -> bytes:
    """The JSON body of ``rows`` random rows."""
    return json.dumps({"inputs": np.random.default_rng(seed).standard_normal((rows, WIDTH)).tolist()}).encode()


def variants(body: bytes) -> dict[str, Callable[[], Any]]:
    """The four ways, each a callable returning the float32 array."""
    f32 = np.float32
    return {
        BASELINE: lambda: np.asarray(json.loads(body)["inputs"], dtype=f32),
        PYDANTIC: lambda: np.asarray(_Body.model_validate(json.loads(body)).inputs, dtype=f32),
        PYDANTIC_JSON: lambda: np.asarray(_Body.model_validate_json(body).inputs, dtype=f32),
        PARSE_ROWS: lambda: web.parse_rows(body, width=WIDTH, dtype=f32),
    }


async def measure(rounds: int, budget: float) -> dict[int, dict[str, Stat]]:
    """µs per body for each variant and size, interleaved rounds."""
    out: dict[int, dict[str, Stat]] = {}
    for rows in SIZES:
        fns = variants(body_of(rows))
        expected = fns[BASELINE]()
        for fn in fns.values():
            np.testing.assert_array_equal(fn(), expected)  # all four give the same array
        timed: dict[str, Callable[[], Awaitable[float]]] = {k: calibrated_sync(f, budget) for k, f in fns.items()}
        out[rows] = await interleaved(timed, rounds)
    return out


def run(report: Report) -> None:
    """Add one table per size: µs per body and the ratio to the baseline's time."""
    measured = asyncio.run(measure(report.rounds, 0.02 if report.quick else 0.1))
    for rows, stats in measured.items():
        base = stats[BASELINE]
        t = report.table(
            f"a JSON body of {rows} rows x {WIDTH} floats to a float32 array", "µs per body", ratio_label="x baseline"
        )
        for label, stat in stats.items():
            t.add(label, stat, ratio(stat, base))


def main(argv: list[str] | None = None) -> int:
    """Print the tables."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_input", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    report = Report(quick=False, rounds=args.rounds)
    run(report)
    for t in report.tables:
        print(f"\n{t.title} ({t.unit}: median (min-max) of {args.rounds} rounds; ratio: time / baseline's time)")
        for row in t.rows:
            print(f"  {row.label:<64} {row.stat.fmt(1):>24}  {row.ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
