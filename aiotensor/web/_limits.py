"""Request limits: :class:`Limits`, and the pure ASGI guard that answers 413 before a body too large is read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._errors import RequestRejected

__all__ = ["BodyLimitMiddleware", "Limits", "limits_for"]

#: The scope key under which the guard leaves the request's :class:`Limits` (for ``read_rows``).
SCOPE_KEY = "aiotensor.limits"


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one request may send: the service's defaults, or one route's.

    Give them to :class:`~aiotensor.web.Sessions` (``limits=`` for every route,
    ``route_limits={"/path": Limits(...)}`` for one path, which replaces the service's
    for that path) or to :func:`~aiotensor.web.read_rows` (for one call).

    Attributes:
        max_bytes: The most bytes of a request body, answered 413 beyond, never parsed:
            judged from the ``Content-Length`` header, else when the body read so far
            passes it (see :class:`BodyLimitMiddleware`). Applies to every route
            (handlers that take a pydantic body included). ``None``: no limit.
        max_rows: The most rows :func:`~aiotensor.web.read_rows` accepts, answered 413
            beyond. Counted from the body's ``[`` before it is parsed (a ``[`` anywhere
            in the body counts, in strings too), so rows over the limit never become
            floats. ``None``: no limit.
    """

    max_bytes: int | None = None
    max_rows: int | None = None


_NONE = Limits()

#: A refused body up to this size is read and dropped (never parsed) before the 413: a
#: server that closes a connection with unread bytes resets it, and the client may then
#: lose the answer. A larger one is answered at once, unread (its client may see a reset).
DRAIN_MAX = 16 << 20


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def limits_for(connection: Any) -> Limits:
    """The :class:`Limits` of a request (a Starlette ``Request`` or an ASGI scope), as the guard set them.

    ``Limits()`` (no limit) when the guard is not installed.
    """
    scope = connection if isinstance(connection, dict) else connection.scope
    limits = scope.get(SCOPE_KEY, _NONE)
    assert isinstance(limits, Limits)
    return limits


class BodyLimitMiddleware:
    """Pure ASGI middleware: 413 for a request body over its route's ``max_bytes``, before the app reads it.

    :meth:`Sessions.install <aiotensor.web.Sessions.install>` adds it (outermost: a
    refused request opens no session). A body whose ``Content-Length`` is over the limit
    is answered without being parsed: up to :data:`DRAIN_MAX` it is read and dropped
    first (so that the client gets the answer rather than a reset), beyond it the answer
    goes at once, the body unread. A body without a length is counted as the app reads it, and
    the read that passes the limit raises :class:`~aiotensor.web.RequestRejected` (413)
    in the app, answered by the installed handlers.

    Args:
        app: The ASGI app to wrap.
        limits: The limits of every route.
        route_limits: The limits of one path (exact match), replacing ``limits`` there.
    """

    def __init__(self, app: ASGIApp, limits: Limits, route_limits: Mapping[str, Limits] | None = None) -> None:
        self.app = app
        self.limits = limits
        self.route_limits = dict(route_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the body's size, then run the app with a counting ``receive`` when the size is not declared."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.route_limits.get(scope.get("path", ""), self.limits) if self.route_limits else self.limits
        scope[SCOPE_KEY] = limits
        limit = limits.max_bytes
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
                break
        if declared is not None:
            if declared > limit:
                rejected = RequestRejected(413, f"the body is {declared} bytes, at most {limit}")
                if declared <= DRAIN_MAX:
                    await _drain(receive)  # first: once the answer is sent the server reads no more
                response = JSONResponse(rejected.body, status_code=413, headers={"Connection": "close"})
                await response(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > limit:
                    raise RequestRejected(413, f"the body is over {limit} bytes")
            return message

        await self.app(scope, counted, send)
