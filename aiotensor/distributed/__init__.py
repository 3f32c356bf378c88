"""Scale-out: run a session's ops on a dask.distributed cluster.

``AsyncEagerSession(backend=DaskBackend(client))`` keeps the same code, the same three
cleanup strategies and the same guarantees, with buffers living in worker memory as
Dask futures. Needs the ``distributed`` extra: ``pip install 'aiotensor[distributed]'``.
"""

from __future__ import annotations

try:
    import distributed as _distributed  # noqa: F401 -- checked here to name the extra
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "aiotensor.distributed needs Dask's distributed scheduler: install it with pip install 'aiotensor[distributed]'"
    ) from exc

from ._backend import DaskBackend as DaskBackend

__all__ = ["DaskBackend"]
