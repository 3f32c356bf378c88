"""Where the event loop's time goes per request: a ladder of in-process ASGI apps.

Each rung adds one piece of the request path to the one before, so the difference of
two rungs' loop CPU per request is what that piece costs the loop thread:

* the **user-style service** (``_web_apps.user_app``: standardize 16 or 512 rows of 32
  features with a fitted scaler, score them linearly, op by op, as
  ``docs/guides/web-services.md`` teaches): FastAPI with the body parsed as
  ``web.read_rows`` parses it, + the middleware and the body limits, + ``read_rows``
  (the request session opened, the rows its tensor, closed by the middleware), + each
  of its four ops, + the fetch and the response (``web.rows_response``); beside the
  same service answering with a pydantic response model, the same written with a
  pydantic body and the ``RequestSession`` dependency, and its NumPy twins (in the
  handler, ``to_thread``, and in the handler answering with orjson by hand: what the
  response path is worth to a NumPy service too). The loop CPU of a body parsed on the pool is not in the
  figure (it runs on a worker thread);
* the **web example** (an MLP, 64 -> 512 -> 512 -> 10): op by op, fused, batched, and
  its NumPy twins.

The requests are driven in process (no sockets, no HTTP parsing: what uvicorn adds is
the same for every rung): 32 clients keep one request each in flight (each yields to the
loop between its requests, as a server's connection does), and the loop
thread's CPU time (``time.thread_time``) over a run, divided by the requests, is the
figure. Rungs take turns in interleaved rounds; the table gives the median over rounds.

Run::

    python -m benchmarks.profile_web            # ~1 minute
    python -m benchmarks.profile_web --quick    # a smoke run
    python -m benchmarks.profile_web --markdown  # also print the table as markdown
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request

import aiotensor as at
from aiotensor import web
from aiotensor.web.fastapi import RequestSession

from ._harness import loop_factories, run_on

# Appended, not inserted first: examples/distributed.py would otherwise shadow the dask
# package in this process and in the worker processes that inherit its path.
sys.path.append(str(Path(__file__).resolve().parent.parent / "examples"))

from web_service import app as example
from web_service import baselines
from web_service.model import IN_FEATURES

from ._web_apps import (
    USER_FEATURES,
    USER_LIMITS,
    ScoreRequest,
    ScoreResponse,
    user_model_response_app,
    user_numpy_app,
    user_numpy_orjson_app,
    user_to_thread_app,
    user_weights,
)

App = Callable[..., Awaitable[None]]
CLIENTS = 32
#: The user-style service's rungs: how far its handler goes.
USER_RUNGS = (
    "FastAPI, the body parsed as read_rows parses it, no aiotensor",
    "+ middleware and body limits (no session)",
    "+ read_rows (request session open/close, the rows its tensor)",
    "+ subtract",
    "+ divide",
    "+ matmul",
    "+ add",
    "+ fetch and response by web.rows_response (the service)",
)


def _model_app(sessions: web.Sessions) -> FastAPI:
    # A FastAPI app whose lifespan opens the app session holding the user-style model.
    weights = user_weights()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        async with sessions.open() as s:
            app.state.model = {k: await s.constant(v, name=k) for k, v in weights.items()}
            yield

    return FastAPI(lifespan=lifespan)


def user_rung(stage: int) -> FastAPI:
    """The user-style service cut after rung ``stage`` (an index into :data:`USER_RUNGS`)."""
    sessions = web.Sessions(limits=USER_LIMITS)
    app = _model_app(sessions)
    if stage >= 1:
        sessions.install(app)
    fixed = ScoreResponse(scores=[[0.0]])

    if stage < 2:

        @app.post("/predict")
        async def bare(request: Request) -> ScoreResponse:
            web.parse_rows(await request.body(), width=USER_FEATURES)
            return fixed

        return app

    @app.post("/predict")
    async def predict(request: Request) -> ScoreResponse:
        x: Any = await web.read_rows(request, width=USER_FEATURES)
        s = web.request_session(request)
        m = request.app.state.model
        if stage >= 3:
            x = await s.subtract(x, m["mean"])
        if stage >= 4:
            x = await s.divide(x, m["scale"])
        if stage >= 5:
            x = await s.matmul(x, m["w"])
        if stage >= 6:
            x = await s.add(x, m["b"])
        if stage >= 7:
            return await web.rows_response(x)  # type: ignore[return-value]  # (a Response: sent as it is)
        return fixed

    return app


def user_before() -> FastAPI:
    """The user-style service as it was written before: a pydantic body, the session from the dependency."""
    sessions = web.Sessions()
    app = _model_app(sessions)
    sessions.install(app)

    @app.post("/predict")
    async def predict(body: ScoreRequest, request: Request, s: RequestSession) -> ScoreResponse:
        m = request.app.state.model
        x = np.asarray(body.inputs, dtype=np.float32)
        z = await s.divide(await s.subtract(x, m["mean"]), m["scale"])
        scores = await s.add(await s.matmul(z, m["w"]), m["b"])
        return ScoreResponse(scores=(await scores.numpy()).tolist())

    return app


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


async def _request(app: App, body: bytes) -> int:
    """One POST /predict through ``app`` as a server would drive it; its status."""
    read = False
    answered = asyncio.get_running_loop().create_future()
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered  # the disconnect a server sends once the response is out
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False) and not answered.done():
            answered.set_result(None)

    await app(_scope("/predict", body), receive, send)
    return status


async def _load(app: App, bodies: list[bytes], n: int) -> float:
    """``CLIENTS`` clients, ``n`` requests each: the loop thread's CPU µs per request."""

    async def client(k: int) -> None:
        for i in range(n):
            status = await _request(app, bodies[(k + i) % len(bodies)])
            if status != 200:
                raise RuntimeError(f"status {status}")
            # A server reads a connection's next request on a later turn of the loop. Without
            # this, a request that never suspends runs whole in its client's step, the
            # client goes straight on to its next one, and the 32 clients run one after
            # the other, each round in one step: what the loop queued meanwhile (a
            # disconnect watcher's start) waits for the end of the client's round.
            await asyncio.sleep(0)

    start = time.thread_time()
    async with asyncio.TaskGroup() as tg:
        for k in range(CLIENTS):
            tg.create_task(client(k))
    return (time.thread_time() - start) / (CLIENTS * n) * 1e6


def _bodies(rows: int, features: int) -> list[bytes]:
    rng = np.random.default_rng(rows)
    return [json.dumps({"inputs": rng.standard_normal((rows, features)).round(6).tolist()}).encode() for _ in range(8)]


async def _measure(apps: dict[str, FastAPI], bodies: list[bytes], rounds: int, n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {label: [] for label in apps}
    async with contextlib.AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        for app in apps.values():
            await _load(app, bodies, max(2, n // 4))  # warm-up: first calls, the cost model
        labels = list(apps)
        for r in range(rounds):
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                out[label].append(await _load(apps[label], bodies, n))
    return out


def profile(rounds: int, n: int, loop_name: str) -> list[tuple[str, str, float, float | None]]:
    """(workload, rung, loop µs per request, µs over the rung before) for both services on ``loop_name``."""
    rows: list[tuple[str, str, float, float | None]] = []
    at.set_blas_threads(1)
    try:
        user: dict[str, FastAPI] = {label: user_rung(i) for i, label in enumerate(USER_RUNGS)}
        user["the service answering with the pydantic response model"] = user_model_response_app
        user["written with a pydantic body and the dependency"] = user_before()
        user["numpy in handler"] = user_numpy_app
        user["numpy to_thread"] = user_to_thread_app
        user["numpy in handler, answering with orjson by hand"] = user_numpy_orjson_app
        for size in (16, 512):
            bodies = _bodies(size, USER_FEATURES)
            measured = run_on(loop_name, _measure(user, bodies, rounds, n if size == 16 else max(1, n // 4)))
            previous = None
            for label in user:
                us = statistics.median(measured[label])
                step = us - previous if previous is not None and label in USER_RUNGS else None
                rows.append((f"user-style service, {size}x{USER_FEATURES}", label, us, step))
                previous = us if label in USER_RUNGS else previous
        ex = {
            "example op by op": example.ops_app,
            "example fused": example.fused_app,
            "example batched": example.app,
            "numpy in handler": baselines.numpy_app,
            "numpy to_thread": baselines.to_thread_app,
        }
        for size in (16, 512):
            per = n if size == 16 else max(1, n // 4)
            measured = run_on(loop_name, _measure(ex, _bodies(size, IN_FEATURES), rounds, per))
            rows += [(f"web example, {size}x{IN_FEATURES}", k, statistics.median(v), None) for k, v in measured.items()]
    finally:
        at.set_blas_threads(None)
    return rows


def markdown(rows: list[tuple[str, str, float, float | None]], command: str, loop_name: str) -> str:
    """The table for docs/performance.md."""
    lines = [
        f"`{command}`, {loop_name} loop, {CLIENTS} clients in process (no HTTP parsing), BLAS threads 1;"
        " loop-thread CPU per request, median over interleaved rounds, on a machine shared with other jobs.",
        "",
        "| workload | rung | loop CPU µs/request | µs over the rung above |",
        "|---|---|---:|---:|",
    ]
    for workload, label, us, step in rows:
        lines.append(f"| {workload} | {label} | {us:.0f} | {'' if step is None else f'{step:+.0f}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run, print."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_web", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests and rounds")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    parser.add_argument("--requests", type=int, default=None, help="requests per client per round (default 40)")
    parser.add_argument("--loop", choices=list(loop_factories()), default=list(loop_factories())[-1])
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    n = args.requests or (10 if args.quick else 40)
    rows = profile(rounds, n, args.loop)
    command = " ".join(["python -m benchmarks.profile_web", *(sys.argv[1:] if argv is None else argv)])
    if args.markdown:
        print(markdown(rows, command, args.loop))
    else:
        for workload, label, us, step in rows:
            print(f"{workload:<28} {label:<40} {us:8.1f} µs {'' if step is None else f'{step:+8.1f}'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
