"""A session's caching allocator: freed buffers go back into kernels as ``out=``.

Why: a large element-wise op allocates a fresh output each time, and whether that
costs page faults depends on the C allocator's history. Above glibc's mmap threshold
(32 MiB at most on 64-bit; a 4096x4096 float32 array is 64 MiB) every allocation is a
fresh ``mmap`` and every page of the output faults (~300 minor faults per op); below
it, the dynamic threshold and the per-thread arenas of the pool workers decide, and
memory freed there is kept by glibc, not returned to the system. Writing into a
buffer the session just freed costs no fault and keeps the resident set flat.

**Keying.** The free list is keyed by the exact ``(shape, dtype)``, not by ``nbytes``
with a reshape on :meth:`BufferCache.take`: a reshaped or re-typed buffer is a *view*
(its ``base`` is the cached array), and a view cannot be owned by the registry
(``_kernels.finalize`` copies views, which would undo the saving), cannot be recycled
again (:func:`recyclable` needs an array that owns its data) and hides the real owner
from the accounting. Changing an owner's shape in place (``arr.shape = ...``) is
deprecated in NumPy. The loops this cache is for (the same op over same-shape
tensors) hit with exact keys.

**The safety rule.** A buffer is recycled only when nothing else can see it. The
check, :func:`recyclable`, refuses arrays that are not plain ndarrays, do not own
their data, are not C-contiguous, hold non-numeric data or were marked with
:func:`mark_exported`, and then compares ``sys.getrefcount`` with the references the
caller says it holds. Every other holder is a strong reference and shows in the
count: a view from ``np.asarray(t)`` / ``t.__array__`` (its ``base``, collapsed to the
owner by NumPy, is the buffer), a view of that view, a ``memoryview`` or DLPack
capsule, a kernel still reading it (its argument tuple), a traceback that kept a
kernel's frame, a user's reference. What no count can see is a raw address
(``arr.ctypes.data``, ``__array_interface__``): code that hands one out must call
:func:`mark_exported` first.

The CPython assumption: ``sys.getrefcount`` is the number of strong references, and a
plain Python call adds a fixed number of them for its arguments. That number is
measured once at import (:data:`_CALL_REFS`) instead of being hard-coded, so a newer
interpreter that borrows references for arguments (3.14 does for some stack
operands) recalibrates itself; the comparison is exact (``==``), so a miscount in
either direction refuses the buffer rather than recycling it, except for the one
case of a miscount exactly cancelling a real holder, which the integration tests
(a live view must always refuse) are there to catch. On other implementations (PyPy)
and on free-threaded builds (where counts may race) recycling is off.

**Sizing, and glibc.** The cache holds memory the C allocator would otherwise keep
or unmap: above the mmap threshold, freeing unmaps at once (so the cache is what
saves the faults, and its bytes are the only ones kept); below it, glibc keeps freed
chunks in the arena of the thread that freed them (the loop's, here) and hands them
to whichever allocation fits, so the cache mostly saves the faults of a threshold
that moved and of fragmentation. A service should set ``max_bytes`` to about two or
three outputs of its largest hot op (a loop needs the previous result and the new
one), count it against its memory limit (the cache gives way first:
:meth:`BufferCache.trim`), and may cap glibc itself with ``MALLOC_ARENA_MAX=2`` and
call :func:`malloc_trim` after a burst.

**Threads.** A :class:`BufferCache` is confined to the event loop's thread: the
registry gives buffers at free time and the engine takes them while preparing a
kernel, both on the loop; the taken array then travels to a worker as the kernel's
``out=``. No lock is needed or taken.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import functools
import sys
import sysconfig
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._types import NDArray
from .._ufuncs import ufunc_result

__all__ = [
    "BufferCache",
    "CacheStats",
    "bind_ufunc",
    "is_exported",
    "malloc_trim",
    "mark_exported",
    "out_for",
    "recyclable",
]

#: Buffers smaller than this are not cached by default: glibc serves them from its
#: free lists without page faults, so caching them would only cost a dict lookup.
DEFAULT_MIN_BYTES = 1 << 16

_NUMERIC_KINDS = frozenset("biufc")

Key = tuple[tuple[int, ...], np.dtype[Any]]

# id(arr) -> weak reference that removes the entry when arr dies (ids are reused).
_exported: dict[int, weakref.ref[NDArray]] = {}


def mark_exported(arr: NDArray) -> None:
    """Never recycle ``arr``: its raw address was handed out (``ctypes.data``, a C library).

    Only references the interpreter counts are seen by :func:`recyclable`; an integer
    address is not one.
    """
    key = id(arr)

    def forget(_ref: weakref.ref[NDArray]) -> None:
        # Only if the entry is still ours: a newer array may have reused the id.
        if _exported.get(key) is _ref:
            del _exported[key]

    _exported[key] = weakref.ref(arr, forget)


def is_exported(arr: NDArray) -> bool:
    """Whether :func:`mark_exported` was called on ``arr``."""
    return id(arr) in _exported


def _refs_in_call(arr: NDArray) -> int:
    # Same call shape as in recyclable: one positional parameter, then getrefcount.
    return sys.getrefcount(arr)


def _calibrate() -> int:
    """References a plain call adds to its argument (parameter + getrefcount's own), or -1 if unusable."""
    if sys.implementation.name != "cpython" or sysconfig.get_config_var("Py_GIL_DISABLED"):
        return -1
    probe = np.empty(1)  # one holder: this local
    alone = _refs_in_call(probe) - 1
    view = probe.view()  # a second holder must show as exactly one more
    seen = _refs_in_call(probe) - 1
    del view
    return alone if alone >= 1 and seen == alone + 1 else -1


#: References a call to :func:`recyclable` adds to its argument (-1: recycling is off).
_CALL_REFS = _calibrate()


def recyclable(arr: Any, refs_expected: int) -> bool:
    """Whether ``arr`` may be recycled: nothing but its ``refs_expected`` known holders can see it.

    Args:
        arr: The buffer being freed.
        refs_expected: Strong references the callers hold (their local variables,
            parameters and containers along the call chain), not counting the
            ones this call adds. A caller that passes its local ``buf`` straight in
            says 1; a method that received it as a parameter and passes it on adds
            one per Python frame on the way.
    """
    if _CALL_REFS < 0 or type(arr) is not np.ndarray:
        return False
    # Never keep ``arr.flags`` in a local: the flags object references the array.
    if arr.base is not None or not arr.flags.owndata or not arr.flags.c_contiguous:
        return False
    dtype = arr.dtype
    if dtype.kind not in _NUMERIC_KINDS or dtype.hasobject or id(arr) in _exported:
        return False
    return sys.getrefcount(arr) - _CALL_REFS == refs_expected


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of a :class:`BufferCache`, from :meth:`BufferCache.stats`.

    Attributes:
        max_bytes: The bound (0: the cache is off).
        cached_bytes: Bytes held in the free lists now.
        cached_buffers: Buffers held now.
        hits: ``take`` calls answered with a buffer.
        misses: ``take`` calls for a cacheable size answered with ``None``.
        kept: ``give`` calls that kept the buffer.
        refused: ``give`` calls that refused it (seen elsewhere, wrong kind, too big).
        evictions: Buffers dropped, least recently given first, to stay under ``max_bytes``.
        trimmed_bytes: Bytes let go by :meth:`BufferCache.trim` and :meth:`BufferCache.clear`.
    """

    max_bytes: int
    cached_bytes: int
    cached_buffers: int
    hits: int
    misses: int
    kept: int
    refused: int
    evictions: int
    trimmed_bytes: int


class BufferCache:
    """Free lists of buffers keyed by ``(shape, dtype)``, bounded in bytes, evicting the least recently given.

    Loop thread only (see the module docstring).

    Args:
        max_bytes: The most bytes held; 0 turns the cache off (``give`` keeps
            nothing, ``take`` returns ``None``).
        min_bytes: Smaller buffers are not cached (see :data:`DEFAULT_MIN_BYTES`).
        per_key: The most buffers kept of one shape and dtype (``None``: no bound
            but ``max_bytes``); the least recently given goes first.
    """

    __slots__ = (
        "_by_key",
        "_lru",
        "_next",
        "cached_bytes",
        "evictions",
        "hits",
        "kept",
        "max_bytes",
        "min_bytes",
        "misses",
        "per_key",
        "refused",
        "trimmed_bytes",
    )

    def __init__(self, max_bytes: int, *, min_bytes: int = DEFAULT_MIN_BYTES, per_key: int | None = None) -> None:
        if max_bytes < 0 or min_bytes < 0:
            raise ValueError(f"max_bytes and min_bytes must be >= 0, got {max_bytes} and {min_bytes}")
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        # Buffers kept per (shape, dtype) at most: a loop needs one or two; without a cap,
        # each allocation made while the list was empty would stay cached for good.
        self.per_key = per_key
        # token -> (key, array), oldest first: the eviction order.
        self._lru: collections.OrderedDict[int, tuple[Key, NDArray]] = collections.OrderedDict()
        # key -> {token: array}; take pops the newest (its pages are the most likely resident).
        self._by_key: dict[Key, dict[int, NDArray]] = {}
        self._next = 0
        self.cached_bytes = 0
        self.hits = 0
        self.misses = 0
        self.kept = 0
        self.refused = 0
        self.evictions = 0
        self.trimmed_bytes = 0

    def give(self, arr: NDArray, owners: int = 1) -> bool:
        """Offer a buffer the registry just freed; return whether it was kept.

        Args:
            arr: The buffer (read-only, as the registry holds it; it stays so while cached).
            owners: References the caller holds to ``arr`` when calling (its local
                variable: 1). Any reference beyond those, a view from
                ``np.asarray(t)`` included, makes this refuse.
        """
        nbytes = arr.nbytes
        # owners + 1: this method's own parameter is one more holder for recyclable.
        if not (self.min_bytes <= nbytes <= self.max_bytes and nbytes > 0) or not recyclable(arr, owners + 1):
            self.refused += 1
            return False
        key: Key = (arr.shape, arr.dtype)
        token = self._next
        self._next = token + 1
        self._lru[token] = (key, arr)
        entries = self._by_key.setdefault(key, {})
        entries[token] = arr
        self.cached_bytes += nbytes
        self.kept += 1
        if self.per_key is not None and len(entries) > self.per_key:
            oldest = next(iter(entries))  # the least recently given of this key
            self.cached_bytes -= entries.pop(oldest).nbytes
            del self._lru[oldest]
            self.evictions += 1
        if self.cached_bytes > self.max_bytes:
            self.evictions += self._drop_until(self.max_bytes)[0]
        return True

    def take(self, shape: Sequence[int], dtype: Any) -> NDArray | None:
        """A writable C-contiguous array of exactly ``shape`` and ``dtype`` from the cache, or ``None``.

        Its contents are stale: the kernel must overwrite every element (``out=``).
        """
        if not self.max_bytes:
            return None
        dt = np.dtype(dtype)
        key: Key = (tuple(shape), dt)
        entries = self._by_key.get(key)
        if not entries:
            if dt.itemsize * _prod(key[0]) >= self.min_bytes:
                self.misses += 1
            return None
        token, arr = entries.popitem()
        if not entries:
            del self._by_key[key]
        del self._lru[token]
        self.cached_bytes -= arr.nbytes
        self.hits += 1
        arr.flags.writeable = True  # it owns its data, so NumPy allows it
        return arr

    def trim(self, keep_bytes: int = 0) -> int:
        """Drop the least recently given buffers until at most ``keep_bytes`` are held; return bytes released.

        Memory above glibc's mmap threshold goes back to the system at once; smaller
        buffers go back to glibc's arenas (see :func:`malloc_trim`).
        """
        _, released = self._drop_until(max(keep_bytes, 0))
        self.trimmed_bytes += released
        return released

    def clear(self) -> int:
        """Drop every buffer (at session close); return bytes released."""
        return self.trim(0)

    def _drop_until(self, limit: int) -> tuple[int, int]:
        n = released = 0
        lru = self._lru
        while self.cached_bytes > limit and lru:
            token, (key, arr) = lru.popitem(last=False)
            entries = self._by_key[key]
            del entries[token]
            if not entries:
                del self._by_key[key]
            self.cached_bytes -= arr.nbytes
            released += arr.nbytes
            n += 1
        return n, released

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self) -> CacheStats:
        """An immutable snapshot of the counters."""
        return CacheStats(
            max_bytes=self.max_bytes,
            cached_bytes=self.cached_bytes,
            cached_buffers=len(self._lru),
            hits=self.hits,
            misses=self.misses,
            kept=self.kept,
            refused=self.refused,
            evictions=self.evictions,
            trimmed_bytes=self.trimmed_bytes,
        )


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# -- kernel side ----------------------------------------------------------------------


def out_for(cache: BufferCache | None, ufunc: np.ufunc, inputs: Sequence[Any]) -> NDArray | None:
    """A recycled output buffer for ``ufunc(*inputs)``, or ``None`` (no cache, unknown result, miss).

    Call on the loop thread while preparing the kernel.
    """
    if cache is None or not cache.max_bytes:
        return None
    spec = ufunc_result(ufunc, inputs)
    if spec is None:
        return None
    return cache.take(*spec)


def bind_ufunc(cache: BufferCache | None, ufunc: np.ufunc, *inputs: Any) -> Callable[[], NDArray]:
    """The kernel for ``ufunc(*inputs)``: it writes into a recycled buffer when there is one.

    Runs :func:`out_for` now (loop thread); the returned callable runs on a worker.
    With a buffer, it is ``ufunc(*inputs, out=buf)``, which returns ``buf`` (an
    array that owns its data, so the registry owns it without a copy); without one,
    NumPy allocates as usual. Results are identical either way: the buffer's dtype is
    the one NumPy would choose, and a ufunc's loop is chosen from its inputs.
    """
    buf = out_for(cache, ufunc, inputs)
    if buf is None:
        return functools.partial(ufunc, *inputs)
    return functools.partial(ufunc, *inputs, out=buf)


def malloc_trim() -> bool:
    """Ask glibc to return the free memory of all its arenas to the system; ``False`` if not glibc.

    Buffers below the mmap threshold, freed on pool threads, stay in glibc's
    per-thread arenas and count in RSS; this gives their free pages back. It walks
    every arena (milliseconds on a large heap): call it off the hot path, e.g. after
    :meth:`BufferCache.trim` or at session close.
    """
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None or not sys.platform.startswith("linux"):
        return None
    lib = ctypes.CDLL(name)
    return lib if hasattr(lib, "malloc_trim") else None
