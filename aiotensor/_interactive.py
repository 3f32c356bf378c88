"""InteractiveSession: the process-wide default session for notebooks and REPLs."""

from __future__ import annotations

import concurrent.futures
import warnings

from . import _defaults
from ._backend import Backend
from ._config import ResourceCleanupStrategy, SessionConfig
from ._session import AsyncEagerSession

__all__ = ["InteractiveSession"]


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
        previous = _defaults.replace_interactive(None, self)
        if isinstance(previous, AsyncEagerSession) and not previous.closed:
            warnings.warn(
                f"another InteractiveSession is open ({previous!r}); the new one replaces it as the"
                " default session. Close the old one with `await s.close()` to free its buffers.",
                RuntimeWarning,
                stacklevel=2,
            )
