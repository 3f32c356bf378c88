"""Where kernels run: the backend interface and the local backend's parts.

``_base`` holds the interface (:class:`~aiotensor.Backend`, :class:`~aiotensor.PendingKernel`)
and :class:`~aiotensor.LocalBackend`; the rest is the local backend: its worker pool
(``_pool``, its jobs ``_jobs``, their priority ``_priority``), the BLAS gate (``_blas``),
large element-wise ops split across workers (``_split``, ``_chunked``) and the buffer
cache (``_allocator``). The Dask backend lives in :mod:`aiotensor.distributed`.
Importing this package imports none of them: callers import the module they use.
"""
