"""aiotensor in a web service: the pieces every Starlette or FastAPI service writes otherwise.

Needs the ``web`` extra (``pip install 'aiotensor[web]'``); ``import aiotensor`` does
not import this package.

* :class:`Sessions`: the **app session** (opened by the app's ``lifespan``, holding the
  model for the life of the process) and the settings of **request sessions**;
  :meth:`Sessions.install` adds the middleware and the exception handlers.
* :class:`RequestSessionMiddleware` (pure ASGI): a request session per request, a child
  of the app session, made when the handler first asks (:func:`request_session`) and
  closed when the response is produced, the handler raises, or the client disconnects;
  a handler whose client went away is cancelled.
* :func:`install_error_handlers` (one call, made by :meth:`Sessions.install`): every 4xx
  and 5xx answers with one JSON shape, :data:`ErrorBody`: ``InvalidArgumentError`` →
  422 naming the op and its inputs' dtypes and shapes, ``ResourceExhaustedError`` →
  503 with ``Retry-After``, any other error → 500 without internals, FastAPI's
  validation errors and Starlette's ``HTTPException`` (404, 405, ...) in the same shape.
* :func:`read_rows` / :func:`parse_rows`: a request body's rows as a tensor (an array)
  of a given width and dtype; ragged, non-numeric, non-finite or oversized input is a
  422 or 413 (:class:`RequestRejected`) saying which row and why. :class:`Limits`
  (``max_bytes``, ``max_rows``) per service and per route; :class:`BodyLimitMiddleware`
  answers a body too large before it is read.
* :func:`rows_response` / :func:`rows_json`: the other way, a tensor's (an array's)
  values as a JSON response ``{"scores": [[...], ...]}``, written by ``orjson`` from
  the array's memory (no Python float per value, no response-model validation).
* :class:`RequestStats`: what each request session did, for ``Sessions(on_request=...)``.
* :mod:`aiotensor.web.fastapi`: the same as FastAPI dependencies.

See the guide, docs/guides/web-services.md.
"""

from __future__ import annotations

from ._errors import (
    ErrorBody,
    ErrorItem,
    RequestRejected,
    error_body,
    error_response,
    exception_handlers,
    install_error_handlers,
)
from ._input import parse_rows, read_body, read_rows
from ._limits import BodyLimitMiddleware, Limits, limits_for
from ._middleware import RequestSessionMiddleware, app_session, request_session
from ._output import rows_json, rows_response
from ._sessions import Sessions
from ._stats import Outcome, RequestStats

__all__ = [
    "BodyLimitMiddleware",
    "ErrorBody",
    "ErrorItem",
    "Limits",
    "Outcome",
    "RequestRejected",
    "RequestSessionMiddleware",
    "RequestStats",
    "Sessions",
    "app_session",
    "error_body",
    "error_response",
    "exception_handlers",
    "install_error_handlers",
    "limits_for",
    "parse_rows",
    "read_body",
    "read_rows",
    "request_session",
    "rows_json",
    "rows_response",
]
