"""The aiotensor web service: an MLP behind FastAPI, one session per request.

Run it with uvicorn on uvloop::

    uvicorn --app-dir examples web_service.app:app --loop uvloop

Two kinds of session:

* the **app session**, opened by the lifespan handler, owns the model weights for the
  life of the process;
* a **request session** per request, ``AsyncEagerSession(parent=app_session)``, opened
  by a FastAPI dependency with ``yield``. It reads the weights without copying them and
  owns every intermediate buffer of the request; leaving the dependency closes it, so
  everything is freed when the handler returns, raises, or is cancelled because the
  client went away.

Endpoints: ``POST /predict`` (``{"inputs": [[...64 floats], ...]}`` in,
``{"probabilities": [[...10 floats], ...]}`` out), ``GET /stats``, ``GET /health``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

import aiotensor as at

from .model import SEED, Model, make_weights

__all__ = ["ClientDisconnected", "PredictRequest", "PredictResponse", "Service", "app", "create_app", "fused_app"]

T = TypeVar("T")

#: The status nginx logs for "client closed the request"; nobody receives it.
CLIENT_CLOSED_REQUEST = 499


class PredictRequest(BaseModel):
    """A batch of input rows."""

    inputs: list[list[float]]


class PredictResponse(BaseModel):
    """Class probabilities, one row per input row."""

    probabilities: list[list[float]]


class ClientDisconnected(Exception):
    """Raised in a handler whose client went away before the answer was ready."""


@dataclasses.dataclass
class RequestCounters:
    """What request sessions did, for ``GET /stats`` (totals since the app started)."""

    opened: int = 0
    closed: int = 0
    failed: int = 0
    disconnected: int = 0
    allocated: int = 0
    freed: int = 0
    # Buffers a request session still held after close(): always 0 unless close is broken.
    left_after_close: int = 0


class Service:
    """App-lifetime state: the app session, the model in it, and the request sessions.

    Args:
        session: The open app session holding the weights.
        model: The weights, as tensors of ``session``.
        request_cleanup: The cleanup strategy of each request session.
    """

    def __init__(
        self, session: at.AsyncEagerSession, model: Model, request_cleanup: at.ResourceCleanupStrategy
    ) -> None:
        self.session = session
        self.model = model
        self.request_cleanup = request_cleanup
        self.counters = RequestCounters()
        self._open: set[at.AsyncEagerSession] = set()

    @contextlib.asynccontextmanager
    async def request_session(self) -> AsyncIterator[at.AsyncEagerSession]:
        """A child of the app session that is closed, whatever happens, when the block ends."""
        counters = self.counters
        s = at.AsyncEagerSession(cleanup=self.request_cleanup, parent=self.session)
        counters.opened += 1
        self._open.add(s)
        try:
            async with s:
                yield s
        except ClientDisconnected:
            counters.disconnected += 1
            raise
        except BaseException:
            counters.failed += 1
            raise
        finally:
            self._open.discard(s)
            stats = s.stats()
            counters.closed += 1
            counters.allocated += stats.allocated
            counters.freed += stats.freed
            counters.left_after_close += stats.live_tensors

    @property
    def in_flight(self) -> int:
        """Request sessions open right now."""
        return len(self._open)

    def stats(self) -> dict[str, Any]:
        """The app session's stats and the request counters, as JSON-ready dicts."""
        live = [s.stats() for s in self._open]
        requests = dataclasses.asdict(self.counters)
        requests["in_flight"] = len(live)
        requests["live_tensors"] = sum(st.live_tensors for st in live) + self.counters.left_after_close
        requests["live_bytes"] = sum(st.live_bytes for st in live)
        return {
            "app": dataclasses.asdict(self.session.stats()),
            "model_bytes": self.model.nbytes,
            "request_cleanup": self.request_cleanup.name,
            "requests": requests,
        }


def get_service(request: Request) -> Service:
    """The :class:`Service` the lifespan handler stored on the app."""
    service: Service = request.app.state.service
    return service


async def request_session(request: Request) -> AsyncIterator[at.AsyncEagerSession]:
    """FastAPI dependency: this request's session, closed before the response is sent."""
    async with get_service(request).request_session() as s:
        yield s


ServiceDep = Annotated[Service, Depends(get_service)]
# scope="function": the session closes when the handler ends, before the response is
# sent, so a client that got its answer can already see the session in /stats.
SessionDep = Annotated[at.AsyncEagerSession, Depends(request_session, scope="function")]


async def cancel_on_disconnect(request: Request, fn: Callable[..., Awaitable[T]], /, *args: Any) -> T:
    """``await fn(*args)``, cancelled if the client disconnects first (then ClientDisconnected).

    Starlette does not cancel a plain handler when its client goes away; without this
    the kernels of an abandoned request would keep the pool busy to the end.
    """
    result: list[T] = []
    error: Exception | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            # The body was read before the handler ran: the next message is the disconnect.
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            result.append(await fn(*args))
        except Exception as exc:  # raised below as itself, not wrapped in an ExceptionGroup
            error = exc
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    if not result:
        raise ClientDisconnected
    return result[0]


def create_app(
    *,
    seed: int = SEED,
    request_cleanup: at.ResourceCleanupStrategy = at.ResourceCleanupStrategy.ON_SESSION_CLOSE,
    fused: bool = False,
) -> FastAPI:
    """The FastAPI app.

    Args:
        seed: The seed the model weights are drawn from.
        request_cleanup: The strategy of request sessions. The default, ``ON_SESSION_CLOSE``,
            suits short sessions: no cleanup task per request, and close frees everything.
        fused: Run the forward pass as one ``apply`` op (:meth:`Model.predict_fused`)
            rather than op by op.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with at.AsyncEagerSession() as session:
            model = await Model.load(session, make_weights(seed))
            app.state.service = Service(session, model, request_cleanup)
            yield

    app = FastAPI(title="aiotensor MLP", lifespan=lifespan)

    @app.exception_handler(at.InvalidArgumentError)
    async def invalid_argument(request: Request, exc: at.InvalidArgumentError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(ClientDisconnected)
    async def client_disconnected(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.post("/predict")
    async def predict(body: PredictRequest, request: Request, service: ServiceDep, s: SessionDep) -> PredictResponse:
        """Class probabilities for a batch of rows."""
        forward = service.model.predict_fused if fused else service.model.predict
        probs = await cancel_on_disconnect(request, forward, s, body.inputs)
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


app = create_app()
#: The same service, each forward pass fused into one op.
fused_app = create_app(fused=True)
