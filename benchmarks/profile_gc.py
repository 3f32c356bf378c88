"""The garbage collector's share of the user-style service's loop time, per request.

Drives ``profile_web``'s user-style rungs in process (32 clients, no sockets) and times
every collection with ``gc.callbacks``: the mean loop CPU per request (collections
included, unlike ``profile_web``'s median over rounds, which a rare full collection
misses) and, per generation, the collections and their time per request.

Run::

    python -m benchmarks.profile_gc                # ~20 s
    python -m benchmarks.profile_gc --requests 50  # a smoke run
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import aiotensor as at

from ._harness import loop_factories, run_on
from ._web_apps import USER_FEATURES
from .profile_web import CLIENTS, USER_RUNGS, _bodies, _load, user_rung

#: The rungs measured: the session alone, one op, two ops, the whole service.
STAGES = (2, 3, 4, 7)


async def _measure(requests: int) -> list[tuple[str, float, dict[int, tuple[int, float]]]]:
    started = [0.0]
    spent = {g: [0, 0.0] for g in range(3)}

    def timer(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            entry = spent[info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - started[0]

    rows = []
    bodies = _bodies(16, USER_FEATURES)
    for stage in STAGES:
        app = user_rung(stage)
        async with app.router.lifespan_context(app):
            await _load(app, bodies, max(2, requests // 10))  # warm-up
            for entry in spent.values():
                entry[:] = [0, 0.0]
            gc.callbacks.append(timer)
            try:
                us = await _load(app, bodies, requests)
            finally:
                gc.callbacks.remove(timer)
        n = CLIENTS * requests
        rows.append((USER_RUNGS[stage], us, {g: (c, t / n * 1e6) for g, (c, t) in spent.items()}))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_gc", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per client (default 200)")
    parser.add_argument("--loop", choices=list(loop_factories()), default=list(loop_factories())[-1])
    args = parser.parse_args(argv)
    at.set_blas_threads(1)
    try:
        rows = run_on(args.loop, _measure(args.requests))
    finally:
        at.set_blas_threads(None)
    print(f"{'rung':<50} {'loop µs/req':>11}  collections (count, µs/req) by generation")
    for label, us, gens in rows:
        detail = "  ".join(f"gen{g}: {c:4d} {t:6.2f}" for g, (c, t) in gens.items())
        print(f"{label:<50} {us:11.1f}  {detail}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
