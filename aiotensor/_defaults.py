"""The default session: a per-context one (``as_default``) and the process-wide interactive one.

Sessions are stored as plain objects here (this module sits below the session in the
layers); ``_session.get_default_session`` gives them their type back.
"""

from __future__ import annotations

import contextvars

__all__ = ["current", "get_default_session", "replace_interactive"]

#: The session made default by ``with s.as_default():`` in this context. A ContextVar,
#: so concurrent tasks (each with its own context) never see each other's default.
current: contextvars.ContextVar[object | None] = contextvars.ContextVar("aiotensor_default_session", default=None)

_interactive: list[object] = []  # at most one: the open InteractiveSession


def get_default_session() -> object | None:
    """The context's default session if set, else the open ``InteractiveSession``, else ``None``."""
    session = current.get()
    if session is not None:
        return session
    return _interactive[0] if _interactive else None


def replace_interactive(old: object | None, new: object | None) -> object | None:
    """Make ``new`` the interactive default if ``old`` still is; return the previous one."""
    previous = _interactive[0] if _interactive else None
    if old is None or previous is old:
        _interactive.clear()
        if new is not None:
            _interactive.append(new)
    return previous
