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


class BodyGuard:
    """What :class:`BodyLimitMiddleware` decides, for a middleware to apply itself (the request-session middleware).

    Args:
        limits: The limits of every route.
        route_limits: The limits of one path (exact match), replacing ``limits`` there.
    """

    __slots__ = ("limits", "route_limits")

    def __init__(self, limits: Limits, route_limits: Mapping[str, Limits] | None = None) -> None:
        self.limits = limits
        self.route_limits = dict(route_limits or {})

    def admit(self, scope: Scope) -> int | None:
        """Leave the request's limits in ``scope``; ``None`` to serve it as it is, else an argument for :meth:`serve`.

        That is the declared length when it is over ``max_bytes`` (a 413), or
        :data:`UNDECLARED` (no ``Content-Length`` under a ``max_bytes``: the body is counted).
        """
        limits = self.route_limits.get(scope.get("path", ""), self.limits) if self.route_limits else self.limits
        scope[SCOPE_KEY] = limits
        limit = limits.max_bytes
        if limit is None:
            return None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    break
                declared = int(value)
                return declared if declared > limit else None
        return UNDECLARED

    @staticmethod
    async def serve(verdict: int, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request :meth:`admit` did not let through as it is: refuse it, or run ``app`` counting its body."""
        limit = scope[SCOPE_KEY].max_bytes
        if verdict == UNDECLARED:
            await _Counted(app, limit)(scope, receive, send)
            return
        rejected = RequestRejected(413, f"the body is {verdict} bytes, at most {limit}")
        if verdict <= DRAIN_MAX:
            await _drain(receive)  # first: once the answer is sent the server reads no more
        response = JSONResponse(rejected.body, status_code=413, headers={"Connection": "close"})
        await response(scope, receive, send)


#: :meth:`BodyGuard.admit`'s answer for a body without a declared length, under a ``max_bytes``.
UNDECLARED = -1


class BodyLimitMiddleware:
    """Pure ASGI middleware: 413 for a request body over its route's ``max_bytes``, before the app reads it.

    :meth:`Sessions.install <aiotensor.web.Sessions.install>` does what it does inside
    the request-session middleware, first (a request refused for its
    ``Content-Length`` opens no session). A body whose ``Content-Length`` is over the limit
    is answered without being parsed: up to :data:`DRAIN_MAX` it is read and dropped
    first (so that the client gets the answer rather than a reset), beyond it the answer
    goes at once, the body unread. A body without a length is counted as it is read;
    past the limit the app sees the body end there (the rest is read and dropped up to
    :data:`DRAIN_MAX`) and its answer is replaced by the 413 (an ``on_request`` hook
    still sees the status the app answered with).

    Args:
        app: The ASGI app to wrap.
        limits: The limits of every route.
        route_limits: The limits of one path (exact match), replacing ``limits`` there.
    """

    def __init__(self, app: ASGIApp, limits: Limits, route_limits: Mapping[str, Limits] | None = None) -> None:
        self.app = app
        self.guard = BodyGuard(limits, route_limits)

    @property
    def limits(self) -> Limits:
        """The limits of every route."""
        return self.guard.limits

    @property
    def route_limits(self) -> dict[str, Limits]:
        """The limits of one path (exact match), replacing :attr:`limits` there."""
        return self.guard.route_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check the body's size, then run the app with a counting ``receive`` when the size is not declared."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        verdict = self.guard.admit(scope)
        if verdict is None:
            await self.app(scope, receive, send)
        else:
            await self.guard.serve(verdict, self.app, scope, receive, send)


class _Counted:
    """One request whose body has no declared length, read under ``limit``.

    Once the body passes the limit, the app is shown an empty rest of the body (the
    server's chunks are still read and dropped, up to :data:`DRAIN_MAX`) and whatever
    it answers is replaced by the 413. Nothing is raised inside ``receive``: the body
    may be read by another task than the app's (the request-session middleware's
    disconnect watcher), which must see a body that ends, not an exception.
    """

    __slots__ = ("app", "limit", "over", "replaced", "size", "started")

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.size = 0
        self.over = False
        self.replaced = False
        self.started = False  # the app answered before the limit was passed: its answer stands

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] != "http.request":
                return message
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                self.over = True
                more = message.get("more_body", False)
                while more and self.size <= DRAIN_MAX:  # drop the rest, so the client gets the 413
                    message = await receive()
                    if message["type"] != "http.request":
                        return message
                    self.size += len(message.get("body", b""))
                    more = message.get("more_body", False)
                return {"type": "http.request", "body": b"", "more_body": False}
            return message

        async def answer(message: Message) -> None:
            if not self.over or self.started:
                self.started = self.started or message["type"] == "http.response.start"
                await send(message)
                return
            if self.replaced:  # the rest of the app's own answer
                return
            self.replaced = True
            rejected = RequestRejected(413, f"the body is over {self.limit} bytes")
            body = JSONResponse(rejected.body, status_code=413).body
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 413, "headers": [*headers, (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, counted, answer)
