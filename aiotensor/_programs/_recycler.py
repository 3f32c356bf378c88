"""The slots of a multi-op kernel's run, and the one recycler of their buffers.

A run's values sit in slots (a :class:`Ref` names one: a leaf buffer or a step's
output). An op's ``out=`` buffer is a dead intermediate of the output's shape and
dtype, death known statically in a program (:func:`into_slots`, :func:`writable_into`)
or dynamically in a fused or batched function (the :class:`Recycler`, whose one
instance the interpreter holds: ``_interpreter.RECYCLER``).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .._types import NDArray

__all__ = [
    "CAP",
    "INTO_MIN_BYTES",
    "MIN_BYTES",
    "PER_SPEC",
    "SPECS",
    "SPECS_MAX",
    "WANTED",
    "Recycler",
    "Ref",
    "into_slots",
    "writable_into",
    "writes_into",
]

_ndarray = np.ndarray
_getrefcount = sys.getrefcount


class Ref:
    """A reference to a value of a program's run: a leaf buffer or a step's output."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __reduce__(self) -> tuple[type[Ref], tuple[int]]:
        return Ref, (self.slot,)


#: Bytes of dead intermediates kept per thread at most (the loop's and each worker's:
#: a web service's resident set after a load grows by up to this much per thread).
CAP = 4 * 1024 * 1024
#: Outputs smaller than this are never kept for later runs (malloc's bins serve them at no cost).
MIN_BYTES = 64 * 1024
#: Intermediates smaller than this are not written into by a program: numpy allocates
#: small arrays from a cache, and the checks would cost more than they save.
INTO_MIN_BYTES = 1 << 15
SPECS_MAX = 4096
PER_SPEC = 2  # buffers kept per (shape, dtype) at most: a kernel needs one or two of each
#: (op, argument shapes and dtypes) -> the output's (shape, dtype), learned from a first call.
SPECS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
#: The (shape, dtype) of outputs kept buffers may serve: only those are kept.
WANTED: set[tuple[Any, ...]] = set()


class Recycler(threading.local):
    """Buffers of dead intermediates, served as ``out=`` to later ops of the same output shape and dtype.

    One recycler for both kinds of death. Known statically, in a program: a step that
    is the last use of an intermediate writes its output into it (:func:`into_slots`
    chooses such steps when the program is compiled, :func:`writable_into` checks the
    buffer when it runs); the buffer never leaves the run. Known dynamically, in a
    fused or batched function: a dropped value whose array nothing else refers to is
    :meth:`keep`-t on this thread's free lists and :meth:`take`-n by a later op of its
    shape and dtype, in this run or a later one (a batched function's kernels reuse
    them batch after batch), at most :data:`CAP` bytes per thread.

    Why keep them: glibc's malloc serves large sizes with fresh pages and gives them back
    when freed, so every run page-faults on all of them again (measured: a (512, 64) ->
    512 -> 10 MLP's batch took 2 ms instead of 0.9 ms).
    """

    def __init__(self, alone: int) -> None:
        # (threading.local: run again with the same ``alone`` on each thread's first use)
        #: The reference count :meth:`keep` sees for an array nothing but the dying value holds.
        self.alone = alone
        self.free: dict[tuple[Any, ...], list[NDArray]] = {}
        self.nbytes = 0

    def take(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray | None:
        """A kept buffer of this shape and dtype (writeable, garbage inside), or None; marks the pair as wanted."""
        spec = (shape, dtype)
        free = self.free.get(spec)
        if not free:
            if len(WANTED) >= SPECS_MAX:
                WANTED.clear()
            WANTED.add(spec)
            return None
        buf = free.pop()
        self.nbytes -= buf.nbytes
        buf.flags.writeable = True
        return buf

    def keep(self, arr: NDArray) -> None:
        """Keep the array of a value just dropped, if nothing but that value refers to it (no view, not a result)."""
        nbytes = arr.nbytes
        if nbytes < MIN_BYTES or self.nbytes + nbytes > CAP or _getrefcount(arr) > self.alone:
            return
        spec = (arr.shape, arr.dtype)
        if spec in WANTED:
            free = self.free.setdefault(spec, [])
            if len(free) < PER_SPEC:
                free.append(arr)
                self.nbytes += nbytes

    def clear(self) -> None:
        """Forget what this thread keeps."""
        self.free.clear()
        self.nbytes = 0


def into_slots(steps: list[Any], nleaves: int) -> list[int]:
    """Per step of a program, the slot of a statically dying intermediate it may write its output into, or -1.

    A step may reuse an input's buffer when it is an element-wise ufunc of
    :data:`_SAME_DTYPE`, called on slots alone, and that input is an intermediate whose
    last use is this step, which a ufunc step made (so it is a fresh array of the run's
    own, never a leaf or an object an ``apply`` returned as is) and which only ufunc
    steps read (so no view of it exists: no reshape, index or split took one). Whether
    the buffer really fits (owned, float, the output's dtype and shape) is checked when
    the program runs (:func:`writable_into`).
    Writing into it saves an allocation and keeps the data in cache: a 10-op chain on
    256x256 float32 runs in ~0.8x the time of numpy's own chain.
    """
    only_ufuncs: dict[int, bool] = {}
    for d, templates, kwargs, _, _ in steps:
        ok = d.ufunc and not kwargs
        for t in (*templates, *(kwargs or {}).values()):
            for e in t if type(t) in (list, tuple) else (t,):
                if type(e) is Ref:
                    only_ufuncs[e.slot] = only_ufuncs.get(e.slot, True) and ok and type(t) is Ref
    found: list[int] = []
    for d, templates, kwargs, checks, drop in steps:
        slot = -1
        if d.ufunc and d.kernel in _SAME_DTYPE and not kwargs and not checks and len(templates) in (1, 2):
            for t in templates:
                if (
                    type(t) is Ref
                    and t.slot >= nleaves
                    and t.slot in drop
                    and steps[t.slot - nleaves][0].ufunc
                    and only_ufuncs.get(t.slot)
                ):
                    slot = t.slot
                    break
        found.append(slot)
    return found


#: ufuncs (by kernel name) whose output has the dtype of a float input, against a python number or an
#: array of that dtype: they may write into a dying intermediate (see into_slots).
_SAME_DTYPE = frozenset(
    {
        *("add", "subtract", "multiply", "true_divide", "floor_divide", "remainder", "power", "maximum", "minimum"),
        *("negative", "absolute", "sign", "exp", "log", "log1p", "sqrt", "square", "sin", "cos", "tanh", "floor"),
        "ceil",
    }
)
_PY_NUMBERS = (float, int, bool)
_NEP50 = int(np.__version__.split(".")[0]) >= 2


def writes_into(leaves: tuple[Any, ...]) -> bool:
    """Whether a program's run writes into its dying intermediates: only on leaves large enough to gain."""
    for x in leaves:  # noqa: SIM110  (a loop, not any() of a generator: asked at every run of a program)
        if type(x) is _ndarray and x.nbytes >= INTO_MIN_BYTES:
            return True
    return False


def writable_into(y: Any, other: Any) -> bool:
    """Whether a ufunc of ``y`` and ``other`` may write into ``y`` (see :func:`into_slots`)."""
    if type(y) is not _ndarray or y.base is not None or y.dtype.kind != "f":
        return False
    if other is y:
        return True
    if type(other) in _PY_NUMBERS:
        # numpy 2 keeps y's dtype against any python number (NEP 50); numpy 1 widens
        # for a value the dtype cannot hold.
        return _NEP50 or np.result_type(y, other) == y.dtype
    return type(other) is _ndarray and other.dtype == y.dtype and other.shape == y.shape
