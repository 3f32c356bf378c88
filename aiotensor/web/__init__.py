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
* :func:`exception_handlers` / :func:`error_response`: ``InvalidArgumentError`` → 422
  naming the op and its inputs' dtypes and shapes, ``ResourceExhaustedError`` → 503 with
  ``Retry-After``, any other aiotensor error → 500 without internals.
* :class:`RequestStats`: what each request session did, for ``Sessions(on_request=...)``.
* :mod:`aiotensor.web.fastapi`: the same as FastAPI dependencies.

See the guide, docs/guides/web-services.md.
"""

from __future__ import annotations

from ._errors import error_response, exception_handlers
from ._middleware import RequestSessionMiddleware, app_session, request_session
from ._sessions import Sessions
from ._stats import Outcome, RequestStats

__all__ = [
    "Outcome",
    "RequestSessionMiddleware",
    "RequestStats",
    "Sessions",
    "app_session",
    "error_response",
    "exception_handlers",
    "request_session",
]
