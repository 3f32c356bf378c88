"""The default session: a per-context one (``as_default``) and the process-wide interactive one."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._session import AsyncEagerSession

__all__ = ["current", "get_default_session", "replace_interactive"]

#: The session made default by ``with s.as_default():`` in this context. A ContextVar,
#: so concurrent tasks (each with its own context) never see each other's default.
current: contextvars.ContextVar[AsyncEagerSession | None] = contextvars.ContextVar(
    "aiotensor_default_session", default=None
)

_interactive: list[AsyncEagerSession] = []  # at most one: the open InteractiveSession


def get_default_session() -> AsyncEagerSession | None:
    """The session module-level ops use when no tensor argument names one.

    The context's default (``with s.as_default():``) if set, else the open
    ``InteractiveSession``, else ``None``.
    """
    session = current.get()
    if session is not None:
        return session
    return _interactive[0] if _interactive else None


def replace_interactive(old: AsyncEagerSession | None, new: AsyncEagerSession | None) -> AsyncEagerSession | None:
    """Make ``new`` the interactive default if ``old`` still is; return the previous one."""
    previous = _interactive[0] if _interactive else None
    if old is None or previous is old:
        _interactive.clear()
        if new is not None:
            _interactive.append(new)
    return previous
