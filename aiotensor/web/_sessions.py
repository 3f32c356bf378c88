"""The app session's lifetime and the settings of request sessions: :class:`Sessions`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from .._config import ResourceCleanupStrategy, SessionConfig
from .._session import AsyncEagerSession
from ._errors import install_error_handlers
from ._limits import Limits
from ._middleware import RequestSessionMiddleware, _Watches
from ._stats import RequestStats

__all__ = ["Sessions"]


class Sessions:
    """A service's sessions: the app session for its lifetime, and one child session per request.

    ::

        sessions = web.Sessions(on_request=log_request)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            async with sessions.open() as s:      # the app session
                app.state.w = await s.constant(weights, name="w")  # your model's tensors
                yield

        app = FastAPI(lifespan=lifespan)          # or Starlette(...)
        sessions.install(app)                     # middleware + exception handlers

    With nothing to load, ``lifespan=sessions.lifespan`` does. Handlers get their
    request session with :func:`~aiotensor.web.request_session` (FastAPI:
    :data:`aiotensor.web.fastapi.RequestSession`).

    Args:
        cleanup: The app session's cleanup strategy.
        config: The app session's config (``memory_limit`` of the whole service, pool size).
        request_cleanup: Each request session's strategy. ``ON_SAFE_POINTS``, the
            default, frees an intermediate at the next op once its handle is dropped,
            without a task per request: a request holds about its live values, not
            everything it computed (measured: the same loop time per request as
            ``ON_SESSION_CLOSE``, a third of the peak for the example's 512-row requests).
        request_config: Each request session's config (e.g. a per-request ``memory_limit``).
        on_request: Called on the event loop with a :class:`RequestStats` after each
            request session closes; exceptions it raises are logged, not propagated.
        cancel_on_disconnect: Cancel a handler whose client disconnected before its
            response (only requests that opened a session are watched).
        retry_after: The ``Retry-After`` seconds of a 503 (``ResourceExhaustedError``).
        limits: Every route's :class:`~aiotensor.web.Limits` (``max_bytes`` of a body,
            ``max_rows`` for :func:`~aiotensor.web.read_rows`). ``None``: no limit.
        route_limits: One path's limits (exact match), replacing ``limits`` there:
            ``{"/predict": web.Limits(max_bytes=1 << 20, max_rows=512)}``.
    """

    def __init__(
        self,
        *,
        cleanup: ResourceCleanupStrategy = ResourceCleanupStrategy.IN_BACKGROUND,
        config: SessionConfig | None = None,
        request_cleanup: ResourceCleanupStrategy = ResourceCleanupStrategy.ON_SAFE_POINTS,
        request_config: SessionConfig | None = None,
        on_request: Callable[[RequestStats], object] | None = None,
        cancel_on_disconnect: bool = True,
        retry_after: int = 1,
        limits: Limits | None = None,
        route_limits: Mapping[str, Limits] | None = None,
    ) -> None:
        self.cleanup = cleanup
        self.config = config
        self.request_cleanup = request_cleanup
        self.request_config = request_config
        self.on_request = on_request
        self.cancel_on_disconnect = cancel_on_disconnect
        self.retry_after = retry_after
        self.limits = limits
        self.route_limits = dict(route_limits or {})
        self._app_session: AsyncEagerSession | None = None
        self._open: set[AsyncEagerSession] = set()
        self._opened = 0
        self._watches = _Watches()  # disconnect watchers to start at the loop's next pass

    @property
    def app_session(self) -> AsyncEagerSession:
        """The open app session (``RuntimeError`` outside :meth:`open` / :meth:`lifespan`)."""
        s = self._app_session
        if s is None:
            raise RuntimeError("the app session is not open: serve the app with lifespan=sessions.lifespan")
        return s

    @property
    def in_flight(self) -> int:
        """Request sessions open right now."""
        return len(self._open)

    @property
    def request_sessions(self) -> list[AsyncEagerSession]:
        """The request sessions open right now (for a stats endpoint: ``s.stats()`` of each)."""
        return list(self._open)

    @property
    def opened(self) -> int:
        """Request sessions opened since this object was made."""
        return self._opened

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[AsyncEagerSession]:
        """Open the app session for the block (a lifespan's body) and close it after, freeing the weights."""
        if self._app_session is not None:
            raise RuntimeError("the app session is already open")
        async with AsyncEagerSession(cleanup=self.cleanup, config=self.config) as s:
            self._app_session = s
            try:
                yield s
            finally:
                self._app_session = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """A Starlette/FastAPI ``lifespan``: the app session open while the server serves."""
        async with self.open():
            yield

    def install(self, app: Any) -> None:
        """Add :class:`RequestSessionMiddleware`, the body limits and the error handlers to a Starlette or FastAPI app.

        Call it before the app serves. The middleware sits outside the app's exception
        handlers (so a handled error still closes the session before its response goes
        out) and inside Starlette's last-resort 500 handler. With ``limits`` or
        ``route_limits``, it first does what :class:`~aiotensor.web.BodyLimitMiddleware`
        does, in the same layer (a body refused as too large opens no session). The error handlers are
        :func:`~aiotensor.web.install_error_handlers`'s: every 4xx and 5xx answers with
        one :data:`~aiotensor.web.ErrorBody`.
        """
        # One middleware: the body limits' guard is applied by the request-session
        # middleware itself, first, as BodyLimitMiddleware outside it would (a layer
        # less on every request).
        app.add_middleware(RequestSessionMiddleware, sessions=self, limits=self.limits, route_limits=self.route_limits)
        install_error_handlers(app, retry_after=self.retry_after)
