"""Every error of a service as one JSON shape: :data:`ErrorBody`, and the handlers that answer with it.

One call, :func:`install_error_handlers` (which :meth:`Sessions.install
<aiotensor.web.Sessions.install>` makes), registers handlers for aiotensor's errors, for
the refusals of :func:`~aiotensor.web.read_rows` and the body limits
(:class:`RequestRejected`), for Starlette's ``HTTPException`` (404, 405, ...), for
FastAPI's request-validation errors, and a last-resort 500; each answers with an
:data:`ErrorBody`. The bodies say what a client can act on: the op and the dtypes and
shapes of its inputs for a refused op (not the array library's own wording), where in
the body a value was refused, a ``Retry-After`` for a 503, and nothing of the server's
internals for a 500 (the exception goes to the ``aiotensor.web`` logger instead).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypedDict

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import HTTPExceptionHandler

from .._errors import AioTensorError, InvalidArgumentError, ResourceExhaustedError

__all__ = [
    "ErrorBody",
    "ErrorItem",
    "RequestRejected",
    "error_body",
    "error_response",
    "exception_handlers",
    "install_error_handlers",
]

logger = logging.getLogger("aiotensor.web")

#: The ``error`` code of each status an answer may have without a more precise one.
_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "too_many_requests",
    500: "internal",
    503: "unavailable",
}


class ErrorItem(TypedDict):
    """One refused part of a request: where (``loc``, e.g. ``["body", "inputs", 3]``), why, and a code."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(TypedDict):
    """The JSON body of every 4xx and 5xx answer of a service set up with :func:`install_error_handlers`.

    Every key is always present:

    * ``error``: a short code a client can branch on: ``"invalid_input"`` (the body was
      refused: not JSON, ragged or non-numeric rows, NaN, a FastAPI validation error),
      ``"invalid_argument"`` (an op refused its arguments), ``"too_large"`` (413),
      ``"resource_exhausted"`` (503), ``"internal"`` (500), ``"not_found"``,
      ``"method_not_allowed"``, ... (Starlette's ``HTTPException``; ``"http_<status>"``
      for the rest);
    * ``detail``: one sentence for a person;
    * ``op``: the op that refused its arguments, else ``None``;
    * ``inputs``: that op's inputs as ``{"dtype": ..., "shape": [...]}``, else ``[]``;
    * ``errors``: the refused parts of the request as :class:`ErrorItem`, else ``[]``.
    """

    error: str
    detail: str
    op: str | None
    inputs: list[dict[str, Any]]
    errors: list[ErrorItem]


def error_body(
    error: str,
    detail: str,
    *,
    op: str | None = None,
    inputs: Sequence[dict[str, Any]] = (),
    errors: Sequence[ErrorItem] = (),
) -> ErrorBody:
    """An :data:`ErrorBody` (for handlers of your own that should answer in the same shape)."""
    return {"error": error, "detail": detail, "op": op, "inputs": list(inputs), "errors": list(errors)}


class RequestRejected(HTTPException):
    """Raised when a request is refused before any tensor work: a body too large, or rows that are not valid input.

    A Starlette ``HTTPException`` (so FastAPI lets it through its body parsing, and an
    app without :func:`install_error_handlers` still answers with its status); the
    installed handler answers with :attr:`body`.

    Args:
        status: 413 (too large) or 422 (invalid input).
        detail: One sentence saying what was refused and why, e.g.
            ``"inputs[3]: 63 values, expected 64"``.
        errors: The refused parts, each with its place in the body.
    """

    def __init__(self, status: int, detail: str, errors: Sequence[ErrorItem] = ()) -> None:
        super().__init__(status, detail)
        self.errors = list(errors)

    @property
    def body(self) -> ErrorBody:
        """The answer's JSON body."""
        return error_body(_CODES.get(self.status_code, f"http_{self.status_code}"), self.detail, errors=self.errors)


def _input_text(spec: dict[str, Any]) -> str:
    if "dtype" in spec:
        return f"{spec['dtype']}{spec['shape']}"
    return str(spec.get("value", "?"))


def error_response(exc: AioTensorError, *, retry_after: int = 1) -> JSONResponse:
    """The JSON response (an :data:`ErrorBody`) for an aiotensor error.

    * :class:`~aiotensor.InvalidArgumentError`: 422, ``{"error": "invalid_argument",
      "op": ..., "inputs": [{"dtype": ..., "shape": [...]}, ...], "detail": ..., "errors": []}``.
      When a kernel refused its arguments, ``detail`` is built from the op and its
      inputs; an error raised before any kernel ran (``op`` is ``None``) keeps its own
      message.
    * :class:`~aiotensor.ResourceExhaustedError`: 503 with ``Retry-After: retry_after``.
    * any other :class:`~aiotensor.AioTensorError`: 500, ``{"error": "internal", ...}``.
    """
    if isinstance(exc, InvalidArgumentError):
        if exc.op is not None:
            detail = f"invalid arguments for {exc.op}: {', '.join(_input_text(i) for i in exc.inputs)}"
        else:
            detail = str(exc)
        body = error_body("invalid_argument", detail, op=exc.op, inputs=exc.inputs)
        return JSONResponse(body, status_code=422)
    if isinstance(exc, ResourceExhaustedError):
        body = error_body("resource_exhausted", "not enough memory for this request now; retry later")
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(retry_after)})
    return _internal()


def _internal() -> JSONResponse:
    return JSONResponse(error_body("internal", "internal server error"), status_code=500)


def _where(request: Request) -> str:
    return f"{request.method} {request.url.path}"


def exception_handlers(*, retry_after: int = 1) -> dict[Any, HTTPExceptionHandler]:
    """Starlette/FastAPI exception handlers answering with an :data:`ErrorBody` (see :func:`install_error_handlers`).

    Keys: :class:`~aiotensor.AioTensorError` (see :func:`error_response`), Starlette's
    ``HTTPException`` (:class:`RequestRejected` included), FastAPI's
    ``RequestValidationError`` when FastAPI is installed, and ``Exception`` (a 500).
    Pass them as ``Starlette(exception_handlers=...)``, or call
    :func:`install_error_handlers`. Each error is logged to the ``aiotensor.web``
    logger: a 500 with its traceback, a 503 as a warning, the rest at debug level.
    """

    async def aiotensor_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AioTensorError)
        response = error_response(exc, retry_after=retry_after)
        if response.status_code == 500:
            logger.error("%s failed: %s", _where(request), type(exc).__name__, exc_info=exc)
        elif response.status_code == 503:
            logger.warning("%s: %s", _where(request), exc)
        else:
            logger.debug("%s: %s", _where(request), exc)
        return response

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        logger.debug("%s: %s %s", _where(request), exc.status_code, exc.detail)
        if isinstance(exc, RequestRejected):
            body = exc.body
        else:
            body = error_body(_CODES.get(exc.status_code, f"http_{exc.status_code}"), str(exc.detail))
        if exc.status_code in (204, 304):  # no body allowed
            return Response(status_code=exc.status_code, headers=exc.headers)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def unexpected(request: Request, exc: Exception) -> Response:
        # Starlette's last resort: it logs the exception (and re-raises it to the server) itself.
        return _internal()

    handlers: dict[Any, HTTPExceptionHandler] = {AioTensorError: aiotensor_error, HTTPException: http_error}
    try:
        from fastapi.exceptions import RequestValidationError
    except ImportError:  # plain Starlette
        pass
    else:
        handlers[RequestValidationError] = _validation_error
    handlers[Exception] = unexpected
    return handlers


async def _validation_error(request: Request, exc: Exception) -> Response:
    # FastAPI's RequestValidationError: its list of pydantic errors, in the one shape.
    raw: Sequence[dict[str, Any]] = exc.errors()  # type: ignore[attr-defined]
    errors: list[ErrorItem] = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))} for e in raw
    ]
    parts = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    detail = "; ".join(parts) + more if parts else "the request is not valid"
    logger.debug("%s: %s", _where(request), detail)
    return JSONResponse(error_body("invalid_input", detail, errors=errors), status_code=422)


def install_error_handlers(app: Any, *, retry_after: int = 1) -> None:
    """Make every 4xx and 5xx of ``app`` (Starlette or FastAPI) answer with an :data:`ErrorBody`.

    One call, before the app serves; :meth:`Sessions.install <aiotensor.web.Sessions.install>`
    makes it. It adds the handlers of :func:`exception_handlers`: aiotensor's errors,
    :class:`RequestRejected`, Starlette's ``HTTPException``, FastAPI's request-validation
    errors (422, with pydantic's list under ``errors``) and any other exception (500,
    logged with its traceback by Starlette, nothing of it in the answer). A handler you
    add afterwards for one of these classes replaces ours.
    """
    for exc_class, handler in exception_handlers(retry_after=retry_after).items():
        app.add_exception_handler(exc_class, handler)
