"""aiotensor's errors as HTTP answers: 422 for bad arguments, 503 for memory, 500 for the rest.

The bodies are JSON and say what a client can act on: the op and the dtypes and shapes
of its inputs for a 422 (from :attr:`InvalidArgumentError.op` and ``.inputs``, not the
array library's own wording), a ``Retry-After`` for a 503, and nothing of the server's
internals for a 500 (the exception goes to the ``aiotensor.web`` logger instead).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import HTTPExceptionHandler

from .._errors import AioTensorError, InvalidArgumentError, ResourceExhaustedError

__all__ = ["error_response", "exception_handlers"]

logger = logging.getLogger("aiotensor.web")


def _input_text(spec: dict[str, Any]) -> str:
    if "dtype" in spec:
        return f"{spec['dtype']}{spec['shape']}"
    return str(spec.get("value", "?"))


def error_response(exc: AioTensorError, *, retry_after: int = 1) -> JSONResponse:
    """The JSON response for an aiotensor error.

    * :class:`~aiotensor.InvalidArgumentError`: 422, ``{"error": "invalid_argument",
      "op": ..., "inputs": [{"dtype": ..., "shape": [...]}, ...], "detail": ...}``. When
      a kernel refused its arguments, ``detail`` is built from the op and its inputs;
      an error raised before any kernel ran (``op`` is ``None``) keeps its own message.
    * :class:`~aiotensor.ResourceExhaustedError`: 503 with ``Retry-After: retry_after``.
    * any other :class:`~aiotensor.AioTensorError`: 500, ``{"error": "internal"}``.
    """
    if isinstance(exc, InvalidArgumentError):
        if exc.op is not None:
            detail = f"invalid arguments for {exc.op}: {', '.join(_input_text(i) for i in exc.inputs)}"
        else:
            detail = str(exc)
        body = {"error": "invalid_argument", "op": exc.op, "inputs": list(exc.inputs), "detail": detail}
        return JSONResponse(body, status_code=422)
    if isinstance(exc, ResourceExhaustedError):
        body = {"error": "resource_exhausted", "detail": "not enough memory for this request now; retry later"}
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(retry_after)})
    return JSONResponse({"error": "internal", "detail": "internal server error"}, status_code=500)


def exception_handlers(*, retry_after: int = 1) -> dict[Any, HTTPExceptionHandler]:
    """Starlette/FastAPI exception handlers for :class:`~aiotensor.AioTensorError` (see :func:`error_response`).

    Pass them as ``Starlette(exception_handlers=...)``, or let
    :meth:`Sessions.install <aiotensor.web.Sessions.install>` add them. Each error is
    logged to the ``aiotensor.web`` logger: a 500 with its traceback, a 503 as a warning,
    a 422 at debug level.
    """

    async def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AioTensorError)
        response = error_response(exc, retry_after=retry_after)
        where = f"{request.method} {request.url.path}"
        if response.status_code == 500:
            logger.error("%s failed: %s", where, type(exc).__name__, exc_info=exc)
        elif response.status_code == 503:
            logger.warning("%s: %s", where, exc)
        else:
            logger.debug("%s: %s", where, exc)
        return response

    return {AioTensorError: handle}
