"""FastAPI on top of :mod:`aiotensor.web`: the sessions as dependencies.

::

    from aiotensor.web.fastapi import RequestSession

    @app.post("/predict")
    async def predict(body: Body, s: RequestSession) -> Answer:
        ...

The middleware (``sessions.install(app)``) owns the session's lifetime; these only
hand it to the handler. They are ``async`` so that FastAPI calls them on the event
loop, not in its thread pool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .._session import AsyncEagerSession
from ._middleware import app_session, request_session

__all__ = ["AppSession", "RequestSession", "get_app_session", "get_request_session"]


async def get_request_session(request: Request) -> AsyncEagerSession:
    """FastAPI dependency: this request's session (:func:`aiotensor.web.request_session`)."""
    return request_session(request)


async def get_app_session(request: Request) -> AsyncEagerSession:
    """FastAPI dependency: the app session (:func:`aiotensor.web.app_session`)."""
    return app_session(request)


#: A handler parameter annotated with this receives the request session.
RequestSession = Annotated[AsyncEagerSession, Depends(get_request_session)]
#: A handler parameter annotated with this receives the app session.
AppSession = Annotated[AsyncEagerSession, Depends(get_app_session)]
