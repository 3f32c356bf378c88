"""The aiotensor web service: an MLP behind FastAPI, built on :mod:`aiotensor.web`.

Run it with uvicorn on uvloop (the app sets BLAS to one thread per product itself)::

    uvicorn --app-dir examples web_service.app:app --loop uvloop

Two kinds of session, both managed by :class:`aiotensor.web.Sessions`:

* the **app session**, opened by the lifespan handler, owns the model weights for the
  life of the process;
* a **request session** per request, a child of the app session, made by the
  :data:`~aiotensor.web.fastapi.RequestSession` dependency. It reads the weights without
  copying them and owns every intermediate buffer of the request; the middleware closes
  it when the response is ready, when the handler raises, or when the client goes away
  (the handler is then cancelled), so everything is freed however the request ends.

The forward pass is micro-batched by default (``at.batched``: the requests that arrive
within one loop iteration share one kernel call); ``ops_app`` is the same service op by
op, the version to read first, and ``fused_app`` runs one ``apply`` op per request.

Endpoints: ``POST /predict`` (``{"inputs": [[...64 floats], ...]}`` in,
``{"probabilities": [[...10 floats], ...]}`` out), ``GET /stats``, ``GET /health``.

Input is read with :func:`aiotensor.web.read_rows`: a body over :data:`LIMITS` is a 413
before it is parsed, and ragged, non-numeric or non-finite rows (NaN, ``1e39``, which
overflows float32) are a 422 naming the row, before anything is computed. Every error
answer, FastAPI's own included, has the same JSON shape (:data:`aiotensor.web.ErrorBody`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel

import aiotensor as at
from aiotensor import web
from aiotensor.web.fastapi import RequestSession

from .model import DTYPE, IN_FEATURES, SEED, Model, batched_forward, make_weights

#: What one request may send: 4096 rows (8 MiB covers them as ``json.dumps`` writes floats).
LIMITS = web.Limits(max_bytes=8 << 20, max_rows=4096)

__all__ = [
    "LIMITS",
    "PredictRequest",
    "PredictResponse",
    "Service",
    "SessionDep",
    "app",
    "create_app",
    "fused_app",
    "ops_app",
]


class PredictRequest(BaseModel):
    """A batch of input rows (the body's schema; ``/predict`` reads it with ``web.read_rows``)."""

    inputs: list[list[float]]


class PredictResponse(BaseModel):
    """Class probabilities, one row per input row."""

    probabilities: list[list[float]]


@dataclasses.dataclass
class RequestCounters:
    """What request sessions did, for ``GET /stats`` (totals since the app started)."""

    closed: int = 0
    failed: int = 0
    disconnected: int = 0
    allocated: int = 0
    freed: int = 0
    # Buffers a request session still held after close(): always 0 unless close is broken.
    left_after_close: int = 0

    def record(self, stats: web.RequestStats) -> None:
        """The ``on_request`` hook: add one closed request session."""
        self.closed += 1
        if stats.outcome == "disconnected":
            self.disconnected += 1
        elif stats.outcome == "failed" or (stats.status is not None and stats.status >= 400):
            self.failed += 1
        self.allocated += stats.session.allocated
        self.freed += stats.session.freed
        self.left_after_close += stats.session.live_tensors


class Service:
    """App-lifetime state: the sessions, the model in the app session, the request counters.

    Args:
        sessions: The app session (open while the app serves) and the request sessions.
        model: The weights, as tensors of the app session.
        counters: Totals over closed request sessions (``sessions``'s ``on_request`` hook).
    """

    def __init__(self, sessions: web.Sessions, model: Model, counters: RequestCounters) -> None:
        self.sessions = sessions
        #: The app session (still readable after shutdown, closed).
        self.session = sessions.app_session
        self.model = model
        self.counters = counters

    @property
    def in_flight(self) -> int:
        """Request sessions open right now."""
        return self.sessions.in_flight

    def stats(self) -> dict[str, Any]:
        """The app session's stats and the request counters, as JSON-ready dicts."""
        live = [s.stats() for s in self.sessions.request_sessions]
        requests: dict[str, Any] = {"opened": self.sessions.opened, **dataclasses.asdict(self.counters)}
        requests["in_flight"] = len(live)
        requests["live_tensors"] = sum(st.live_tensors for st in live) + self.counters.left_after_close
        requests["live_bytes"] = sum(st.live_bytes for st in live)
        return {
            "app": dataclasses.asdict(self.session.stats()),
            "model_bytes": self.model.nbytes,
            "request_cleanup": self.sessions.request_cleanup.name,
            "requests": requests,
            # The batched forward pass (the default): calls, batches, rows and calls per batch.
            "batching": dataclasses.asdict(batched_forward.stats()),
            # How busy the event loop is, and the kernels that sent to the pool (at.loop_load).
            "loop": dataclasses.asdict(at.loop_load()),
        }


async def get_service(request: Request) -> Service:
    """The :class:`Service` the lifespan handler stored on the app.

    ``async`` although it never awaits: FastAPI runs a plain ``def`` dependency in its
    thread pool, a thread hop per request for an attribute lookup.
    """
    service: Service = request.app.state.service
    return service


ServiceDep = Annotated[Service, Depends(get_service)]
#: The request session (kept under the name the tests and older code use).
SessionDep = RequestSession


def create_app(
    *,
    seed: int = SEED,
    request_cleanup: at.ResourceCleanupStrategy = at.ResourceCleanupStrategy.ON_SAFE_POINTS,
    forward: Literal["batched", "ops", "fused"] = "batched",
    fused: bool = False,
    blas_threads: int | None = 1,
    cancel_on_disconnect: bool = True,
) -> FastAPI:
    """The FastAPI app.

    Args:
        seed: The seed the model weights are drawn from.
        request_cleanup: The strategy of request sessions. The default, ``ON_SAFE_POINTS``,
            frees each intermediate at the next op once ``h`` is rebound: a request holds
            about two layers' activations rather than all ten buffers until it ends.
        forward: How the forward pass runs: ``"batched"`` (the default,
            :meth:`Model.predict_batched`: concurrent requests share one kernel call),
            ``"ops"`` (op by op, the teaching version, :meth:`Model.predict`) or
            ``"fused"`` (one ``apply`` op per request, :meth:`Model.predict_fused`).
        fused: The same as ``forward="fused"`` (kept for older callers).
        blas_threads: BLAS threads per matrix product while the app serves
            (``at.set_blas_threads``; restored at shutdown): a server's parallelism comes
            from concurrent requests. ``None`` leaves BLAS as it is; so does a missing
            threadpoolctl.
        cancel_on_disconnect: Cancel a prediction whose client went away (the benchmark
            turns it off once, to measure what watching for disconnects costs).
    """
    mode = "fused" if fused else forward
    if mode not in ("batched", "ops", "fused"):
        raise ValueError(f"forward must be 'batched', 'ops' or 'fused', got {forward!r}")

    async def run_forward(model: Model, s: at.AsyncEagerSession, x: at.Tensor) -> Any:
        if mode == "batched":
            return await model.predict_batched(s, x)
        if mode == "fused":
            return await model.predict_fused(s, x)
        return await model.predict(s, x)

    counters = RequestCounters()
    sessions = web.Sessions(
        request_cleanup=request_cleanup,
        on_request=counters.record,
        cancel_on_disconnect=cancel_on_disconnect,
        limits=LIMITS,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with _blas_threads(blas_threads):
            async with sessions.open() as session:
                model = await Model.load(session, make_weights(seed))
                app.state.service = Service(sessions, model, counters)
                yield

    app = FastAPI(title="aiotensor MLP", lifespan=lifespan)
    sessions.install(app)  # the request-session middleware, the body limit and the error handlers

    body_schema = {"content": {"application/json": {"schema": PredictRequest.model_json_schema()}}, "required": True}

    @app.post("/predict", openapi_extra={"requestBody": body_schema})
    async def predict(request: Request, service: ServiceDep, s: SessionDep) -> PredictResponse:
        """Class probabilities for a batch of rows."""
        x = await web.read_rows(request, width=IN_FEATURES, dtype=DTYPE, session=s)  # 413/422 before any op
        probs = await run_forward(service.model, s, x)
        return PredictResponse(probabilities=probs.tolist())

    @app.get("/stats")
    async def stats(service: ServiceDep) -> dict[str, Any]:
        """The app session's stats and what request sessions allocated, freed and hold."""
        return service.stats()

    @app.get("/health")
    async def health(service: ServiceDep) -> dict[str, Any]:
        """Liveness, with the number of requests being computed as it was answered."""
        return {"status": "ok", "requests_in_flight": service.in_flight}

    return app


@contextlib.contextmanager
def _blas_threads(threads: int | None) -> Any:
    if threads is None or at.blas_threads() is None:  # no threadpoolctl: nothing to set
        yield
        return
    at.set_blas_threads(threads)
    try:
        yield
    finally:
        at.set_blas_threads(None)


#: The service: micro-batched forward passes (concurrent requests share one kernel call).
app = create_app()
#: The same service op by op: the teaching version (every op a visible await).
ops_app = create_app(forward="ops")
#: The same service, each forward pass fused into one op.
fused_app = create_app(forward="fused")
