"""Apps built on aiotensor.web, served by a real uvicorn in tests/test_web.py (and used in process).

``fastapi_app`` and ``starlette_app`` serve the same routes, one through the FastAPI
dependency, the other through ``web.request_session(request)``:

* ``POST /matmul`` ``{"x": [[...3 floats], ...]}``: ``x @ W`` with ``W`` (3x2) a tensor of
  the app session; a wrong width is a 422 from the matmul kernel.
* ``GET /oom``: allocates more than the request sessions' ``memory_limit`` (503).
* ``GET /kernel-error``: an ``apply`` whose function raises (500).
* ``GET /bug``: allocates, then the handler itself raises ``RuntimeError`` (500).
* ``POST /slow`` / ``GET /slow``: allocates, then waits for a kernel sleeping
  :data:`SLOW_SECONDS` on the pool (the disconnect tests leave during it).
* ``POST /rows`` ``{"inputs": [[...3 floats], ...]}``: the rows read by ``web.read_rows``
  (at most :data:`MAX_ROWS`), times ``W``; bad input is a 422 or a 413 before any op.
* ``POST /session-rows``: the same, its session opened before the body is read (so the
  disconnect watcher reads the body: the limits must work through it).
* ``POST /model`` (FastAPI only) ``{"x": [[floats]]}``: a pydantic body, for FastAPI's
  validation errors in aiotensor's error shape.
* ``GET /health``: ``{"in_flight": ...}`` without a request session.
* ``GET /log``: every :class:`aiotensor.web.RequestStats` the ``on_request`` hook got.

At shutdown each app prints whether its app session is closed and what it holds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import aiotensor as at
from aiotensor import web
from aiotensor.web.fastapi import RequestSession

#: The app session's weight.
W = np.arange(6, dtype=np.float32).reshape(3, 2)
#: The request sessions' memory limit; /oom asks for twice as much.
REQUEST_LIMIT = 1 << 20
#: How long /slow's kernel sleeps.
SECRET = "secret-internal-detail"
SLOW_SECONDS = 1.5
#: The most bytes of any request body, and the most rows of ``/rows``.
MAX_BYTES = 1 << 20
MAX_ROWS = 256


def _sleep_kernel(x: Any) -> Any:
    time.sleep(SLOW_SECONDS)
    return np.asarray(x) + 1


def _failing_kernel(x: Any) -> Any:
    raise RuntimeError(SECRET)


class Handlers:
    """The routes' work, given a request session (shared by the two apps)."""

    def __init__(self) -> None:
        self.log: list[dict[str, object]] = []
        self.sessions = web.Sessions(
            request_config=at.SessionConfig(memory_limit=REQUEST_LIMIT),
            on_request=lambda stats: self.log.append(stats.as_dict()),
            limits=web.Limits(max_bytes=MAX_BYTES),
            route_limits={
                path: web.Limits(max_bytes=MAX_BYTES, max_rows=MAX_ROWS) for path in ("/rows", "/session-rows")
            },
        )
        self.weight: at.Tensor | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        async with self.sessions.open() as s:
            self.weight = await s.constant(W, name="W")
            yield
        stats = s.stats()
        print(f"app session closed={s.closed} live_tensors={stats.live_tensors}", flush=True)

    async def matmul(self, s: at.AsyncEagerSession, body: Any) -> dict[str, Any]:
        x = await s.constant(np.asarray(body["x"], dtype=np.float32))
        y = await s.matmul(x, self.weight)
        return {"y": (await y.numpy()).tolist()}

    async def rows(self, request: Request) -> dict[str, Any]:
        x = await web.read_rows(request, width=3)
        y = await web.request_session(request).matmul(x, self.weight)
        return {"y": (await y.numpy()).tolist()}

    async def session_rows(self, request: Request, s: at.AsyncEagerSession) -> dict[str, Any]:
        x = await web.read_rows(request, width=3, session=s)
        y = await s.matmul(x, self.weight)
        return {"y": (await y.numpy()).tolist()}

    async def oom(self, s: at.AsyncEagerSession) -> None:
        await s.zeros(2 * REQUEST_LIMIT, dtype=np.uint8)

    async def kernel_error(self, s: at.AsyncEagerSession) -> None:
        await s.apply(_failing_kernel, await s.ones(2))

    async def bug(self, s: at.AsyncEagerSession) -> None:
        await s.ones(4)
        raise RuntimeError("a bug in the handler")

    async def slow(self, s: at.AsyncEagerSession) -> dict[str, Any]:
        y = await s.apply(_sleep_kernel, await s.ones(2))
        assert isinstance(y, at.Tensor)  # one kernel output: one tensor
        return {"y": (await y.numpy()).tolist()}

    def health(self) -> dict[str, Any]:
        return {"in_flight": self.sessions.in_flight}


class XBody(BaseModel):
    """``/model``'s body."""

    x: list[list[float]]


def make_fastapi_app() -> FastAPI:
    """The routes on FastAPI, the session from the ``RequestSession`` dependency."""
    h = Handlers()
    app = FastAPI(lifespan=h.lifespan)
    h.sessions.install(app)
    app.state.handlers = h

    @app.post("/matmul")
    async def matmul(body: dict[str, Any], s: RequestSession) -> dict[str, Any]:
        return await h.matmul(s, body)

    @app.post("/rows")
    async def rows(request: Request) -> dict[str, Any]:
        return await h.rows(request)

    @app.post("/session-rows")
    async def session_rows(request: Request, s: RequestSession) -> dict[str, Any]:
        return await h.session_rows(request, s)

    @app.post("/model")
    async def model(body: XBody, s: RequestSession) -> dict[str, Any]:
        return await h.matmul(s, body.model_dump())

    @app.get("/oom")
    async def oom(s: RequestSession) -> None:
        await h.oom(s)

    @app.get("/kernel-error")
    async def kernel_error(s: RequestSession) -> None:
        await h.kernel_error(s)

    @app.get("/bug")
    async def bug(s: RequestSession) -> None:
        await h.bug(s)

    @app.api_route("/slow", methods=["GET", "POST"])
    async def slow(s: RequestSession) -> dict[str, Any]:
        return await h.slow(s)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return h.health()

    @app.get("/log")
    async def log() -> list[dict[str, object]]:
        return h.log

    return app


def make_starlette_app() -> Starlette:
    """The routes on plain Starlette, the session from ``web.request_session(request)``."""
    h = Handlers()

    async def matmul(request: Request) -> Response:
        body = await request.json()
        return JSONResponse(await h.matmul(web.request_session(request), body))

    async def rows(request: Request) -> Response:
        return JSONResponse(await h.rows(request))

    async def session_rows(request: Request) -> Response:
        return JSONResponse(await h.session_rows(request, web.request_session(request)))

    async def oom(request: Request) -> Response:
        await h.oom(web.request_session(request))
        return Response()

    async def kernel_error(request: Request) -> Response:
        await h.kernel_error(web.request_session(request))
        return Response()

    async def bug(request: Request) -> Response:
        await h.bug(web.request_session(request))
        return Response()

    async def slow(request: Request) -> Response:
        # The session before the body is read: the watcher must wait for the app to read it.
        s = web.request_session(request)
        await request.body()
        return JSONResponse(await h.slow(s))

    async def health(request: Request) -> Response:
        return JSONResponse(h.health())

    async def log(request: Request) -> Response:
        return JSONResponse(h.log)

    app = Starlette(
        routes=[
            Route("/matmul", matmul, methods=["POST"]),
            Route("/rows", rows, methods=["POST"]),
            Route("/session-rows", session_rows, methods=["POST"]),
            Route("/oom", oom),
            Route("/kernel-error", kernel_error),
            Route("/bug", bug),
            Route("/slow", slow, methods=["GET", "POST"]),
            Route("/health", health),
            Route("/log", log),
        ],
        lifespan=h.lifespan,
    )
    h.sessions.install(app)
    app.state.handlers = h
    return app


fastapi_app = make_fastapi_app()
starlette_app = make_starlette_app()
