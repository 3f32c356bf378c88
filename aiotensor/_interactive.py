"""InteractiveSession: the process-wide default session for notebooks and REPLs.

A REPL (``python -m asyncio``) or a kernel may end without closing its sessions, and
without closing its event loop either: the sessions' background cleanup tasks would be
destroyed pending at interpreter exit ("Task was destroyed but it is pending!"), and
their finalizers would warn. So every InteractiveSession still open at exit is closed
then, on its own loop when that loop can still run, else synchronously.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import warnings
import weakref

from . import _defaults
from ._backends._base import Backend
from ._config import ResourceCleanupStrategy, SessionConfig
from ._session import AsyncEagerSession

__all__ = ["InteractiveSession"]

_open: weakref.WeakSet[InteractiveSession] = weakref.WeakSet()


def _close_at_exit() -> None:
    for session in list(_open):
        if session.closed:
            continue
        loop = session._engine._loop
        if loop is not None and not loop.is_closed() and not loop.is_running():
            with contextlib.suppress(Exception):
                loop.run_until_complete(session.close())
                continue
        session._engine.finalize_unclosed()  # no loop to run on: free synchronously


atexit.register(_close_at_exit)


class InteractiveSession(AsyncEagerSession):
    """A session that makes itself the process-wide default when created.

    For notebooks and REPLs with top-level ``await``: create it, then call
    module-level ops (``await at.add(...)``) or ``await t.eval()`` without passing a
    session. ``await s.close()`` frees everything and removes it as the default. A
    second one created while another is open warns and takes over as the default.
    """

    def __init__(
        self,
        *,
        cleanup: ResourceCleanupStrategy = ResourceCleanupStrategy.IN_BACKGROUND,
        config: SessionConfig | None = None,
        executor: concurrent.futures.Executor | None = None,
        backend: Backend | None = None,
    ) -> None:
        super().__init__(cleanup=cleanup, config=config, executor=executor, backend=backend)
        _open.add(self)
        previous = _defaults.replace_interactive(None, self)
        if isinstance(previous, AsyncEagerSession) and not previous.closed:
            warnings.warn(
                f"another InteractiveSession is open ({previous!r}); the new one replaces it as the"
                " default session. Close the old one with `await s.close()` to free its buffers.",
                RuntimeWarning,
                stacklevel=2,
            )
