"""One request session per HTTP request, as pure ASGI middleware, and disconnect cancellation.

:class:`RequestSessionMiddleware` wraps the app's ``receive`` and ``send``. A request
session is made only when the handler asks for one (:func:`request_session`), so
requests that do no tensor work (``/health``) pay for two wrapped callables and nothing
else. The session closes just before the last chunk of the response body goes out
(the response's bytes exist by then), or when the app returns or raises without a
response, or after the client disconnected: in every case before the middleware
returns.

Disconnects: once the request body has been read, the next ASGI message can only be
``http.disconnect`` (sent when the client goes away, or after the response). So for a
request with a session, one task waits on ``receive()`` and cancels the request's task
if the disconnect comes before the response. That is one extra task per request that
suspends (one answered without suspending costs a place in a queue, which one callback
per pass of the loop drains) and no polling;
the handler's ``await`` of a running op gets the ``CancelledError``, and aiotensor's
cancellation rules free what the request held when its session closes.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import _loopload
from .._session import AsyncEagerSession
from ._limits import BodyGuard, Limits
from ._stats import Outcome, RequestStats

if TYPE_CHECKING:
    from ._sessions import Sessions

__all__ = ["RequestSessionMiddleware", "app_session", "request_session"]

logger = logging.getLogger("aiotensor.web")

#: The scope key of the per-request state (ASGI lets servers and middleware add keys).
SCOPE_KEY = "aiotensor.request"


class _Request:
    """The state of one HTTP request under the middleware: its session and its watcher."""

    __slots__ = (
        "_receive",
        "_send",
        "arrived",
        "body_done",
        "cancelled",
        "closed",
        "disconnected",
        "finished",
        "in_receive",
        "method",
        "path",
        "pending",
        "response_done",
        "session",
        "sessions",
        "start",
        "status",
        "task",
        "want_watch",
        "watch_queued",
        "watcher",
    )

    def __init__(self, sessions: Sessions, scope: Scope, receive: Receive, send: Send, task: asyncio.Task[Any]) -> None:
        #: The task running the app for this request: what a disconnect cancels.
        self.task: asyncio.Task[Any] | None = task
        self.sessions = sessions
        # Not the scope itself: the scope holds this object, and a cycle would leave every
        # request (the server's cycle object, its body) to the garbage collector.
        self.method: str = scope.get("method", "")
        self.path: str = scope.get("path", "")
        self._receive = receive
        self._send = send
        self.session: AsyncEagerSession | None = None
        self.watcher: asyncio.Task[Message] | None = None
        # Body chunks the watcher read before the app asked for them, and their signal.
        self.pending: collections.deque[Message] | None = None
        self.arrived: asyncio.Event | None = None
        self.status: int | None = None
        self.start = time.perf_counter()
        self.body_done = False  # the last body chunk came from the server
        self.in_receive = False  # the app is waiting in the server's receive() right now
        self.want_watch = False
        self.watch_queued = False  # start_watch is queued on the loop
        self.response_done = False
        self.disconnected = False
        self.cancelled = False
        self.finished = False
        self.closed = False

    # -- the session ------------------------------------------------------------------
    def open_session(self) -> AsyncEagerSession:
        """This request's session, made on first use as a child of the app session."""
        s = self.session
        if s is not None:
            return s
        if self.response_done or self.finished:
            raise RuntimeError(
                "request_session: the response was sent and the request session closed;"
                " work after the response (a background task) needs a session of its own"
            )
        sessions = self.sessions
        s = AsyncEagerSession(
            cleanup=sessions.request_cleanup, config=sessions.request_config, parent=sessions.app_session
        )
        s._engine.open_now()  # bound to this loop now: its first op need not open it
        self.session = s
        sessions._open.add(s)
        sessions._opened += 1
        if sessions.cancel_on_disconnect:
            self.want_watch = True
            if not self.in_receive:  # else when that receive returns: one reader at a time
                self._watch()
        return s

    def close(self) -> Awaitable[None] | None:
        """Close the session; what is left to await, if anything.

        A request session with no kernel in flight closes without suspending (no
        coroutine made): the usual request, whose ops ran inline or were awaited.
        """
        session = self.session
        if session is None or self.closed:
            return None
        self.closed = True
        try:
            done = False if session._owns_backend else session._engine.close_now()
        except BaseException:
            self.sessions._open.discard(session)
            raise
        if done is True:
            self.sessions._open.discard(session)
            return None
        return self._close_rest(session, done)

    async def _close_rest(self, session: AsyncEagerSession, stopping: asyncio.Task[None] | bool) -> None:
        # ``stopping``: False, close() has the work to do; else the cleanup task winding down.
        try:
            if stopping is False:
                await session.close()
            elif stopping is not True:
                await asyncio.wait([stopping])
        finally:
            self.sessions._open.discard(session)

    # -- the disconnect watcher -------------------------------------------------------
    def _watch(self) -> None:
        # The watcher task is made by a callback queued where its first step would have
        # been (a new task's first step is itself a call_soon): it starts reading at the
        # same point of the loop as a task made here, but a request that is answered
        # before then (no ``await`` suspended it) costs a place in a list, not a task
        # made, stepped and cancelled. One callback serves every request that asked in
        # the same pass of the loop (see _Watches).
        if self.watcher is None and not self.finished and not self.watch_queued:
            self.watch_queued = True
            self.sessions._watches.add(self)

    def start_watch(self) -> None:
        """Start the disconnect watcher, unless the request no longer needs one (queued by :meth:`_watch`)."""
        self.watch_queued = False
        # in_receive: the app reads the server's receive() itself right now; the watch
        # starts when that read returns (``receive``), one reader at a time.
        if self.watcher is None and not (self.finished or self.response_done or self.in_receive):
            self.watcher = asyncio.get_running_loop().create_task(self._wait_for_disconnect())

    async def _wait_for_disconnect(self) -> Message:
        # From here on the watcher is the only reader of the server's receive(). Usually
        # the body was read already and the next message is the disconnect; if not, the
        # body chunks are kept for the app (a handler that never reads a body, or asks
        # for its session first).
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                break
            if not self.body_done:
                self.body_done = not message.get("more_body", False)
                if self.pending is None:
                    self.pending = collections.deque()
                self.pending.append(message)
                if self.arrived is not None:
                    self.arrived.set()
        if self.arrived is not None:
            self.arrived.set()
        if not (self.response_done or self.finished) and self.task is not None:
            self.disconnected = True
            self.cancelled = True
            self.task.cancel()
        return message

    # -- the wrapped ASGI callables ---------------------------------------------------
    async def receive(self) -> Message:
        """The app's ``receive``: the server's, until the watcher owns it."""
        watcher = self.watcher
        if watcher is None:
            self.in_receive = True
            try:
                message = await self._receive()
            finally:
                self.in_receive = False
            if message["type"] == "http.request" and not message.get("more_body", False):
                self.body_done = True
            if self.want_watch:
                self._watch()
            return message
        while not self.pending:
            if self.body_done or watcher.done():
                return await asyncio.shield(watcher)  # the disconnect, when it comes
            if self.arrived is None:
                self.arrived = asyncio.Event()
            await self.arrived.wait()
            self.arrived.clear()
        return self.pending.popleft()

    def send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``: notes the status, and closes the session before the last body chunk.

        Not a coroutine function: it returns the server's ``send(message)`` to await (a
        coroutine of ours only when the close has something to await first), one
        coroutine less for each message of every request.
        """
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
        elif kind == "http.response.body" and not message.get("more_body", False):
            self.response_done = True
            closing = self.close()
            if closing is not None:
                return self._send_after(closing, message)
        return self._send(message)

    async def _send_after(self, closing: Awaitable[None], message: Message) -> None:
        await closing
        await self._send(message)

    def finish(self, outcome: Outcome) -> Awaitable[None] | None:
        """The app returned or raised: stop watching, close the session, report; what is left to await, if anything."""
        self.finished = True
        if self.watch_queued:
            self.watch_queued = False
            self.sessions._watches.discard(self)
        watcher = self.watcher
        if watcher is not None:
            if not watcher.done():
                watcher.cancel()
            elif not watcher.cancelled():
                watcher.exception()  # a failed server receive() reached the app, if it asked; not logged again
        session = self.session
        if session is None:
            return None
        closing = self.close()
        if closing is not None:
            return self._report_after(closing, outcome)
        self._report(outcome)
        return None

    async def _report_after(self, closing: Awaitable[None], outcome: Outcome) -> None:
        await closing
        self._report(outcome)

    def _report(self, outcome: Outcome) -> None:
        hook = self.sessions.on_request
        session = self.session
        if hook is None or session is None:
            return
        stats = RequestStats(
            self.method,
            self.path,
            self.status,
            "disconnected" if self.disconnected else outcome,
            time.perf_counter() - self.start,
            session.stats(),
        )
        try:
            hook(stats)
        except Exception:  # a logging hook must not turn a served request into a failure
            logger.exception("on_request hook failed")

    def release(self) -> None:
        """Drop what ties this object to the server's request objects and tasks.

        The scope keeps this object (for :func:`request_session`) and this object kept
        the server's ``receive``/``send`` (which keep the scope), the watcher task (whose
        frame keeps this object) and the request task: cycles that only the garbage
        collector would free, taking the request's body with them, at a measurable
        cost per request. Nothing calls these after the request is finished.
        """
        self._receive = _receive_after_finish
        self._send = _send_after_finish
        self.watcher = None
        self.task = None


async def _receive_after_finish() -> Message:
    return {"type": "http.disconnect"}


async def _send_after_finish(message: Message) -> None:
    raise RuntimeError("the request is finished: nothing more can be sent")


class _Watches:
    """The requests whose disconnect watcher starts at the loop's next turn, and the one callback that starts them.

    A callback per request kept each request that finished before its callback ran
    (every request that never suspended) alive until then, with its closed session,
    engine and registry: when many requests finish in one turn of the loop, a burst of
    objects outliving their requests, which feeds the garbage collector (measured in
    process with requests run back to back before the loop turned: 58 young collections
    and a full one per 3,200 requests of the user-style service, none without
    sessions). Here a finished request leaves the queue at once (:meth:`discard`), and
    one callback per turn starts the watchers of those still running, at the same point
    of the loop as a callback of their own would.
    """

    __slots__ = ("_loop", "_queued")

    def __init__(self) -> None:
        # The requests the queued callback will start (a dict: a finished one leaves it
        # at once), and the loop that callback is queued on.
        self._queued: dict[_Request, None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, request: _Request) -> None:
        """Start ``request``'s watcher at the loop's next pass."""
        task = request.task
        # The request's task's loop: the running one (asking for it costs a system call on Python 3.11).
        loop = task.get_loop() if task is not None else asyncio.get_running_loop()
        queued = self._queued
        if queued is None or self._loop is not loop:  # (a list left by a loop that stopped is dropped)
            queued = self._queued = {}
            self._loop = loop
            loop.call_soon(self._start, queued)
        queued[request] = None

    def discard(self, request: _Request) -> None:
        """``request`` finished before its watcher started: it needs none, and is not kept until the callback runs."""
        if self._queued is not None:
            self._queued.pop(request, None)

    def _start(self, queued: dict[_Request, None]) -> None:
        if self._queued is queued:
            self._queued = self._loop = None
        for request in queued:
            request.start_watch()


class RequestSessionMiddleware:
    """Pure ASGI middleware: a request session per HTTP request, closed however the request ends.

    Usually added by :meth:`Sessions.install <aiotensor.web.Sessions.install>`; by hand:
    ``app.add_middleware(RequestSessionMiddleware, sessions=sessions)`` or
    ``RequestSessionMiddleware(app, sessions)`` around any ASGI app. Handlers get the
    session with :func:`request_session`.

    Args:
        app: The ASGI app to wrap.
        sessions: Where request sessions come from (their parent, strategy, config) and
            what to do when one closes (``on_request``).
        limits: With ``limits`` or ``route_limits``, it first does what
            :class:`~aiotensor.web.BodyLimitMiddleware` does with them, as if that were
            outside it (a body refused for its ``Content-Length`` opens no session):
            :meth:`~aiotensor.web.Sessions.install` adds one middleware, not two.
        route_limits: One path's limits (exact match), replacing ``limits`` there.
    """

    def __init__(
        self,
        app: ASGIApp,
        sessions: Sessions,
        *,
        limits: Limits | None = None,
        route_limits: Mapping[str, Limits] | None = None,
    ) -> None:
        self.app = app
        self.sessions = sessions
        self._guard: BodyGuard | None = None
        if limits is not None or route_limits:
            self._guard = BodyGuard(limits or Limits(), route_limits)
            # What a request whose body is counted runs inside the counting (the guard outside it).
            self._unguarded = RequestSessionMiddleware(app, sessions)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app for one connection scope; HTTP requests get the request-session state."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = self._guard
        if guard is not None:
            verdict = guard.admit(scope)
            if verdict is not None:  # refused, or a body to count: served as BodyLimitMiddleware would
                await guard.serve(verdict, self._unguarded, scope, receive, send)
                return
        task = asyncio.current_task()
        assert task is not None
        request = _Request(self.sessions, scope, receive, send, task)
        scope[SCOPE_KEY] = request
        outcome: Outcome = "failed"
        # A caller on this loop until it ends: busy-loop placement offloads only while
        # the loop has others to serve (requests in flight, or ready in the same turn).
        sensor = _loopload.sensor()
        sensor.enter(task)
        try:
            await self.app(scope, request.receive, request.send)
            outcome = "completed"
        except asyncio.CancelledError:
            # Our own cancellation (the client went away) ends here, quietly: there is
            # nobody to answer. Anyone else's (server shutdown) goes on.
            if not request.cancelled:
                raise
            request.cancelled = False
            if task.uncancel() > 0:
                raise
        finally:
            if request.cancelled:  # the app swallowed our cancellation: undo it
                request.cancelled = False
                task.uncancel()
            try:
                finishing = request.finish(outcome)
                if finishing is not None:
                    await finishing
            finally:
                request.release()
                sensor.leave(task)


def _request_of(connection: Any, api: str) -> _Request:
    scope = connection if isinstance(connection, dict) else getattr(connection, "scope", None)
    request = None if scope is None else scope.get(SCOPE_KEY)
    if request is None:
        raise RuntimeError(
            f"{api}: no aiotensor request state in this scope; add the middleware with"
            " sessions.install(app) (or RequestSessionMiddleware)"
        )
    assert isinstance(request, _Request)
    return request


def request_session(connection: Any) -> AsyncEagerSession:
    """The request session of ``connection`` (a Starlette ``Request``, or an ASGI scope dict).

    Made on the first call, as ``AsyncEagerSession(parent=app_session)``; later calls in
    the same request return the same session. It closes when the response has been
    produced (or the request failed or was abandoned), so return data, not tensors.
    """
    return _request_of(connection, "request_session").open_session()


def app_session(connection: Any) -> AsyncEagerSession:
    """The app session (the parent of request sessions) of the app serving ``connection``."""
    return _request_of(connection, "app_session").sessions.app_session
