"""Apps that only the web benchmark serves (``uvicorn --app-dir benchmarks``).

* ``no_watch_app``: the op-by-op example without the disconnect watcher (what watching
  costs is the difference).
* The **user-style service**, written as ``docs/guides/web-services.md``
  teaches, op by op, no batching: ``POST /predict`` with ``{"inputs": [[...32 floats],
  ...]}`` standardizes the rows with a fitted scaler (mean and scale of the app session)
  and scores them with a linear model (``x @ w + b``), answering ``{"scores": [...]}``.
  ``user_app`` is it on aiotensor, as the guide's whole service is written: the rows
  read by ``web.read_rows`` (under the guide's body limits), the request session from
  ``web.request_session``, the scores answered by ``web.rows_response``.
  ``user_numpy_app`` and ``user_to_thread_app`` are its twins in plain NumPy as
  FastAPI's own tutorial writes a handler (a pydantic body model, a pydantic response
  model), in the handler and through ``asyncio.to_thread``. For telling apart what the
  response costs: ``user_model_response_app`` is the aiotensor service answering with
  the twins' response model, ``user_numpy_orjson_app`` the in-handler twin answering
  with orjson by hand (what ``rows_response`` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

# Appended, not inserted first: examples/distributed.py would otherwise shadow the dask
# package in this process and in the worker processes that inherit its path.
sys.path.append(str(Path(__file__).resolve().parent.parent / "examples"))

from web_service.app import create_app

from aiotensor import web

#: The op-by-op example without the disconnect watcher: what watching costs is the difference.
no_watch_app = create_app(forward="ops", cancel_on_disconnect=False)

#: Features per row of the user-style service.
USER_FEATURES = 32
#: Scores per row (the linear model's outputs).
USER_OUTPUTS = 4
#: The body limits of the aiotensor service, as the guide's service sets them.
USER_LIMITS = web.Limits(max_bytes=1 << 20, max_rows=1024)


class ScoreRequest(BaseModel):
    """Rows of features."""

    inputs: list[list[float]]


class ScoreResponse(BaseModel):
    """One row of scores per input row."""

    scores: list[list[float]]


def user_weights(seed: int = 7) -> dict[str, np.ndarray[Any, np.dtype[np.float32]]]:
    """The fitted scaler and the linear model (fixed seed, float32)."""
    rng = np.random.default_rng(seed)
    return {
        "mean": rng.standard_normal(USER_FEATURES).astype(np.float32),
        "scale": (rng.random(USER_FEATURES) + 0.5).astype(np.float32),
        "w": rng.standard_normal((USER_FEATURES, USER_OUTPUTS)).astype(np.float32),
        "b": rng.standard_normal(USER_OUTPUTS).astype(np.float32),
    }


def _user_aiotensor_app(model_response: bool = False) -> FastAPI:
    sessions = web.Sessions(limits=USER_LIMITS)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with sessions.open() as s:  # the app session owns the model
            app.state.model = {k: await s.constant(v, name=k) for k, v in user_weights().items()}
            yield

    app = FastAPI(lifespan=lifespan)
    sessions.install(app)

    if model_response:

        @app.post("/predict")
        async def predict_model(request: Request) -> ScoreResponse:
            x = await web.read_rows(request, width=USER_FEATURES)
            s = web.request_session(request)
            m = request.app.state.model
            z = await s.divide(await s.subtract(x, m["mean"]), m["scale"])
            scores = await s.add(await s.matmul(z, m["w"]), m["b"])
            return ScoreResponse(scores=(await scores.numpy()).tolist())

    else:

        @app.post("/predict", response_model=ScoreResponse)  # (the schema; the body is rows_response's)
        async def predict(request: Request) -> Response:
            x = await web.read_rows(request, width=USER_FEATURES)  # float32[rows, 32], or a 413/422
            s = web.request_session(request)
            m = request.app.state.model
            z = await s.divide(await s.subtract(x, m["mean"]), m["scale"])
            scores = await s.add(await s.matmul(z, m["w"]), m["b"])
            return await web.rows_response(scores)  # {"scores": [[...], ...]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "requests_in_flight": sessions.in_flight}

    return app


def _user_numpy_app(offload: bool = False, by_orjson: bool = False) -> FastAPI:
    model = user_weights()
    in_flight = 0

    def score(rows: list[list[float]]) -> np.ndarray[Any, np.dtype[np.float32]]:
        x = np.asarray(rows, dtype=np.float32)
        out: np.ndarray[Any, np.dtype[np.float32]] = ((x - model["mean"]) / model["scale"]) @ model["w"] + model["b"]
        return out

    app = FastAPI()

    if by_orjson:

        @app.post("/predict", response_model=ScoreResponse)  # (the schema; the body is orjson's)
        async def predict_orjson(body: ScoreRequest) -> Response:
            nonlocal in_flight
            in_flight += 1
            try:
                y = score(body.inputs)
            finally:
                in_flight -= 1
            return Response(
                orjson.dumps({"scores": y}, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
            )

    else:

        @app.post("/predict")
        async def predict(body: ScoreRequest) -> ScoreResponse:
            nonlocal in_flight
            in_flight += 1
            try:
                y = await asyncio.to_thread(score, body.inputs) if offload else score(body.inputs)
            finally:
                in_flight -= 1
            return ScoreResponse(scores=y.tolist())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "requests_in_flight": in_flight}

    return app


#: The user-style service on aiotensor (op by op, a request session per request).
user_app = _user_aiotensor_app()
#: Its twin in plain NumPy inside the handler.
user_numpy_app = _user_numpy_app(offload=False)
#: Its twin through ``asyncio.to_thread``.
user_to_thread_app = _user_numpy_app(offload=True)
#: The user-style service on aiotensor answering with the twins' pydantic response model.
user_model_response_app = _user_aiotensor_app(model_response=True)
#: The in-handler twin answering with orjson by hand, as ``web.rows_response`` does.
user_numpy_orjson_app = _user_numpy_app(by_orjson=True)
