"""A request session's life, in a bare loop and inside a request: what opening and closing one costs the loop.

A request session is made (``AsyncEagerSession(parent=app_session)``, or as
``web.Sessions``' middleware makes them, with its request cleanup and config), opened
on the running loop and closed; with one adopted tensor (``read_rows``'s rows) too. The same life is timed:

* **back to back** in one task of a bare loop (``time.perf_counter`` around each life);
* **inside a request** of the user-style service's FastAPI app (middleware and body
  limits installed, the body parsed, 32 clients in process as ``profile_web`` drives
  them): the handler lives ``k`` such sessions in a row; the first of a request and
  the ones after it are reported apart.

The first life in a request costs about twice a life back to back, the later ones
about the same as back to back: between two requests the loop runs the rest of the
request path (HTTP, FastAPI, pydantic), which takes the session code's and objects'
cache lines; the first life pays for bringing them back. (Not the garbage collector,
nor the 32 requests in flight: the same with one client, and with the collector off.)
So what a request session costs a request is set by how much code and how many
objects its life touches, more than by how fast it runs when warm.

Run::

    python -m benchmarks.profile_request_session              # ~20 s
    python -m benchmarks.profile_request_session --markdown   # also print the table as markdown
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from fastapi import FastAPI, Request

import aiotensor as at
from aiotensor import web

from . import profile_web
from ._harness import loop_factories, run_on
from ._web_apps import USER_FEATURES, USER_LIMITS, ScoreResponse

SAFE = at.ResourceCleanupStrategy.ON_SAFE_POINTS
ROWS = np.ones((16, USER_FEATURES), dtype=np.float32)


async def _life(make: Callable[[], at.AsyncEagerSession], rows: bool) -> None:
    s = make()
    s._engine.open_now()
    if rows:
        x = s._engine.adopt(ROWS.copy(), "inputs")
        assert x is not None
        del x
    done = s._engine.close_now()  # as the middleware closes it: without suspending when it can
    if done is False:
        await s._engine.close(None)
    elif done is not True:
        await asyncio.wait([done])


CONSTRUCTOR = "AsyncEagerSession(parent=)"
SESSIONS = "as web.Sessions makes it"


def _makers(sessions: web.Sessions) -> dict[str, Callable[[], at.AsyncEagerSession]]:
    parent = sessions.app_session
    return {
        CONSTRUCTOR: lambda: at.AsyncEagerSession(cleanup=SAFE, parent=parent),
        SESSIONS: lambda: at.AsyncEagerSession(
            cleanup=sessions.request_cleanup, config=sessions.request_config, parent=parent
        ),
    }


async def _bare(sessions: web.Sessions, n: int) -> dict[str, float]:
    out = {}
    for label, make in _makers(sessions).items():
        for rows in (False, True):
            start = time.perf_counter()
            for _ in range(n):
                await _life(make, rows)
            out[f"{label}{', one tensor' if rows else ''}"] = (time.perf_counter() - start) / n * 1e6
    return out


def _app(sessions: web.Sessions, make: str, rows: bool, k: int, lives: dict[str, list[float]]) -> FastAPI:
    app = FastAPI(lifespan=sessions.lifespan)
    sessions.install(app)
    fixed = ScoreResponse(scores=[[0.0]])

    @app.post("/predict")
    async def predict(request: Request) -> ScoreResponse:
        web.parse_rows(await request.body(), width=USER_FEATURES)
        maker = _makers(sessions)[make]
        for i in range(k):
            start = time.perf_counter()
            await _life(maker, rows)
            lives["first" if i == 0 else "later"].append(time.perf_counter() - start)
        return fixed

    return app


async def _inside(make: str, rows: bool, n: int) -> dict[str, float]:
    sessions = web.Sessions(limits=USER_LIMITS)
    lives: dict[str, list[float]] = {"first": [], "later": []}
    app = _app(sessions, make, rows, 4, lives)
    bodies = profile_web._bodies(16, USER_FEATURES)
    async with app.router.lifespan_context(app):
        await profile_web._load(app, bodies, 2)
        for v in lives.values():
            v.clear()
        await profile_web._load(app, bodies, n)
    return {k: sum(v) / len(v) * 1e6 for k, v in lives.items()}


async def _measure(rounds: int, n: int) -> list[tuple[str, str, float]]:
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        sessions = web.Sessions()
        async with sessions.open():
            for label, us in (await _bare(sessions, n * 100)).items():
                results.setdefault((label, "back to back, bare loop"), []).append(us)
        for make in (CONSTRUCTOR, SESSIONS):
            for rows in (False, True):
                label = f"{make}{', one tensor' if rows else ''}"
                for where, us in (await _inside(make, rows, n)).items():
                    results.setdefault((label, f"inside a request, the {where}"), []).append(us)
    return [(label, where, statistics.median(v)) for (label, where), v in results.items()]


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profile_request_session", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (the median is reported)")
    parser.add_argument("--requests", type=int, default=20, help="requests per client per round")
    parser.add_argument("--loop", choices=list(loop_factories()), default=list(loop_factories())[-1])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    rows = sorted(run_on(args.loop, _measure(args.rounds, args.requests)), key=lambda r: (r[0], r[1]))
    command = " ".join(["python -m benchmarks.profile_request_session", *(sys.argv[1:] if argv is None else argv)])
    if args.markdown:
        print(
            f"`{command}`, {args.loop} loop; µs per life (make, open, close), median over rounds,"
            " on a machine shared with other jobs.\n"
        )
        print("| request session | where | µs per life |\n|---|---|---:|")
        for label, where, us in rows:
            print(f"| {label} | {where} | {us:.1f} |")
    else:
        for label, where, us in rows:
            print(f"{label:<42} {where:<36} {us:6.2f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
