"""The same service without aiotensor, for ``benchmarks/bench_web.py``.

* ``numpy_app``: the forward pass in plain NumPy inside the ``async def`` handler. It is
  the fastest per request, but each computation blocks the event loop: every other
  request, ``/health`` included, waits for it.
* ``to_thread_app``: the same NumPy call through ``asyncio.to_thread``. The loop stays
  free; memory is whatever NumPy's temporaries hold until the garbage collector runs,
  with no accounting and no per-request bound.

Both serve the same ``/predict`` and ``/health`` as :mod:`web_service.app`, computing
in float32 with the same weights, so that the benchmark compares like with like.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
from fastapi import FastAPI

from .app import PredictRequest, PredictResponse
from .model import DTYPE, SEED, Array, Layer, make_weights, numpy_forward

__all__ = ["create_baseline_app", "numpy_app", "to_thread_app"]


def create_baseline_app(*, offload: bool, seed: int = SEED) -> FastAPI:
    """The service in plain NumPy: on the event loop, or with ``asyncio.to_thread`` if ``offload``."""
    in_flight = 0
    layers: list[Layer] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        layers.extend(make_weights(seed))
        yield
        layers.clear()

    app = FastAPI(title=f"NumPy MLP ({'to_thread' if offload else 'in handler'})", lifespan=lifespan)

    def forward(rows: list[list[float]]) -> Array:
        return numpy_forward(layers, np.asarray(rows, dtype=DTYPE))

    run: Callable[[list[list[float]]], Any]
    if offload:

        async def run(rows: list[list[float]]) -> Array:
            return await asyncio.to_thread(forward, rows)

    else:

        async def run(rows: list[list[float]]) -> Array:
            return forward(rows)

    @app.post("/predict")
    async def predict(body: PredictRequest) -> PredictResponse:
        """Class probabilities for a batch of rows."""
        nonlocal in_flight
        in_flight += 1
        try:
            probs: Array = await run(body.inputs)
        finally:
            in_flight -= 1
        return PredictResponse(probabilities=probs.tolist())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, with the number of requests being computed as it was answered."""
        return {"status": "ok", "requests_in_flight": in_flight}

    return app


numpy_app = create_baseline_app(offload=False)
to_thread_app = create_baseline_app(offload=True)
