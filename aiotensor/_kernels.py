"""What runs where a kernel runs: input checks, output normalization and error mapping.

This runs on a pool thread locally, or on a worker process on Dask, so that shape,
dtype and size are known without moving data back to the caller.
"""

from __future__ import annotations

import collections
import ctypes
import re
import sys
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

import numpy as np

from ._errors import AioTensorError, IndexOutOfRangeError, InvalidArgumentError, KernelError, ResourceExhaustedError
from ._structure import describe, input_specs
from ._types import NDArray

__all__ = [
    "ALIGN_FROM",
    "ALIGN_TRIES",
    "ARG_NAMES",
    "NUMERIC_KINDS",
    "PARKED",
    "PARK_MAX_BYTES",
    "SEQUENCES",
    "BadOutputError",
    "BufferInfo",
    "KernelResult",
    "aligned_fresh",
    "as_numeric",
    "finalize",
    "forgotten_await",
    "info",
    "kernel_error",
    "normalize",
    "numeric_array",
    "parked",
    "read_only_view",
    "run_kernel",
    "unshared",
]

#: dtype kinds a tensor may hold: bool, signed and unsigned ints, floats, complex.
NUMERIC_KINDS = frozenset("biufc")
_PY_NUMBERS = (bool, int, float, complex)
# isinstance against tuples: ``a | b`` would build a union object on every call.
_ARRAYS = (np.ndarray, np.generic)
#: ``isinstance(x, SEQUENCES)``: a list or tuple (a tuple of types, not a union built per call).
SEQUENCES = (tuple, list)

# Errors a kernel raises because of its arguments. ArithmeticError covers numpy's
# FloatingPointError under np.errstate(all="raise"). (A RuntimeWarning, numpy's warning
# turned into an error by the caller's warning filters, is not mapped: kernel_error.)
_ARG_ERRORS = (ValueError, TypeError, IndexError, ArithmeticError)


class BadOutputError(TypeError):
    """A kernel returned something that cannot be a tensor (mapped to InvalidArgumentError)."""


class BufferInfo(NamedTuple):
    """A buffer a backend produced, with the metadata a handle needs."""

    handle: Any
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    nbytes: int


class KernelResult(NamedTuple):
    """The buffers one kernel produced; ``multi`` if it returned a tuple or list."""

    buffers: list[BufferInfo]
    multi: bool


def _not_numeric(what: str, dtype: Any) -> TypeError:
    return TypeError(f"{what} gives dtype {dtype}, not numeric; tensors hold bool, integer, float or complex data")


def as_numeric(x: Any) -> Any:
    """``x`` as a kernel input: numbers and numeric arrays as they are, array-likes as arrays.

    Python and numpy scalars pass unchanged so that numpy's promotion rules (NEP 50:
    python scalars are "weak") still apply. ``None``, strings, objects and ragged lists
    raise, so that no op turns them into a result silently.
    """
    if isinstance(x, _ARRAYS):
        if x.dtype.kind not in NUMERIC_KINDS:
            raise _not_numeric("input", x.dtype)
        return x
    if isinstance(x, _PY_NUMBERS):
        return x
    if x is None or isinstance(x, str | bytes):
        raise TypeError(f"{x!r:.40} is not a tensor value; expected a Tensor, a number or a numeric array")
    arr = np.asarray(x)  # a nested list; raises ValueError when ragged
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise _not_numeric(f"input of type {type(x).__name__}", arr.dtype)
    return arr


def numeric_array(value: Any, dtype: np.dtype[Any] | None) -> NDArray:
    """A new array holding ``value``, refusing data that is not numbers.

    ``np.array(["1"], dtype="float32")`` parses strings and ``np.array(None, dtype=float)``
    gives NaN: the data is checked for its own dtype first, and only numeric data is
    then converted to ``dtype`` (numpy's casting rules, as ``np.array(value, dtype)``).
    """
    own = value if isinstance(value, np.ndarray | np.generic) else np.asarray(value)  # ragged: ValueError
    if own.dtype.kind not in NUMERIC_KINDS:
        raise TypeError(
            f"could not convert {type(value).__name__} {value!r:.40} to a tensor: it gives dtype {own.dtype},"
            " not numeric; tensors hold bool, integer, float or complex data"
        )
    if (
        type(value) is np.ndarray
        and value.nbytes >= ALIGN_FROM
        and value.flags.c_contiguous
        and (dtype is None or dtype == value.dtype)
    ):
        # The same copy (C order, its dtype) into a buffer on a 32-byte boundary when
        # malloc offers one: a 256x256 float32 input 16 bytes off made the 10-op chain's
        # one-block kernel ~2.5 µs (8%) dearer, in every call of a process that got it.
        out = aligned_fresh(value.shape, value.dtype)
        np.copyto(out, value)
        return out
    return np.array(value, dtype=dtype)  # a copy: later changes to the caller's array don't leak in


#: Arrays of this many bytes or more that :func:`numeric_array` copies start on a
#: 32-byte boundary when malloc offers one (smaller ones: few stores, no difference).
ALIGN_FROM = 1 << 16
#: Chunks :func:`aligned_fresh` asks malloc for at most, by default.
ALIGN_TRIES = 4
_char_at: Any = ctypes.c_char.from_buffer
_address = ctypes.addressof


def aligned_fresh(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    empty: Callable[..., Any] = np.empty,
    tries: int = ALIGN_TRIES,
    park: bool = False,
) -> NDArray:
    """A new C-ordered array owning its memory (``base`` None), on a 32-byte boundary if malloc gives one.

    malloc's chunks are 16-byte aligned; chunks carved one after another from the heap
    alternate between the two 16-byte offsets for these sizes, so asking again while
    the misaligned ones are held finds an aligned one within a few (at most ``tries``
    chunks; malloc's bins may hold several misaligned ones of the size). The chunks
    not taken are freed on return; if none was aligned, the first is returned (chunks
    glibc maps on their own, over its mmap threshold, are all 16 bytes off a page).
    With ``park``, misaligned chunks of at most :data:`PARK_MAX_BYTES` are kept instead
    (the last :data:`PARKED` of them, :func:`parked`): freed, malloc would hand the same
    ones back first at the next call of the size, which would ask again each time.
    (``empty``: for tests.)
    """
    out: NDArray = empty(shape, dtype)
    if not _address(_char_at(out)) & 31:
        return out
    held = [out]
    while len(held) < tries:
        again: NDArray = empty(shape, dtype)
        if not _address(_char_at(again)) & 31:
            break
        held.append(again)
    else:
        again = held.pop(0)  # none aligned: the first
    if park and again.nbytes <= PARK_MAX_BYTES:
        _parked.extend(held)  # (a deque with a maxlen: the oldest go, at once, thread-safe)
    return again


#: The misaligned chunks :func:`aligned_fresh` keeps out of malloc's hands at most ...
PARKED = 3
#: ... each of at most this many bytes (~1.5 MiB held at most).
PARK_MAX_BYTES = 1 << 19
_parked: collections.deque[NDArray] = collections.deque(maxlen=PARKED)


def parked() -> int:
    """Bytes of misaligned chunks :func:`aligned_fresh` keeps parked now."""
    return sum(x.nbytes for x in list(_parked))


def finalize(value: Any) -> NDArray:
    """Turn a kernel output into a buffer the registry can own.

    The buffer must own its memory (a view would keep another, maybe much larger,
    buffer alive behind the registry's back, and an input returned as-is would be
    owned twice) and is made read-only so no holder can change a tensor.
    """
    if type(value) is np.ndarray:
        arr = value
    elif isinstance(value, np.ma.MaskedArray):
        # Its data under the mask is arbitrary: keeping it would show (or compute on)
        # values the kernel meant to hide, and a MaskedArray buffer breaks later ops.
        raise BadOutputError("kernel returned a MaskedArray; return a plain ndarray (e.g. .filled(value))")
    elif isinstance(value, np.ndarray):
        # A subclass (matrix, memmap, ...) would change how later kernels treat the
        # buffer (np.matrix.sum has no keepdims), or keep a file mapped: a plain copy.
        arr = value.view(np.ndarray).copy()
    elif isinstance(value, np.generic | int | float | complex | bool):
        arr = np.asarray(value)
    else:
        raise BadOutputError(f"kernel returned {type(value).__name__}; expected an ndarray or a tuple of ndarrays")
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise BadOutputError(f"kernel returned dtype {arr.dtype}; tensors hold bool, integer, float or complex data")
    if arr.base is not None or not arr.flags.writeable:
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def unshared(value: Any, refs: int | None = None) -> Any:
    """A kernel's output with nobody else able to write it: the one ownership rule before :func:`finalize`.

    An ndarray that owns its memory and is writeable would be kept as the tensor's buffer
    as it is (and made read-only). If someone still holds it (a global, a cache, a
    closure, the caller's own argument) they could set WRITEABLE back and change the
    tensor, and their array would turn read-only under them: it is copied, once. With
    ``refs`` (the reference count of a fresh result where the caller checks it: CPython
    only, tests cover both cases) an array is copied only when more references exist;
    without, every such array is foreign and copied. A writeable view is copied here too;
    read-only arrays are left to :func:`finalize`, which copies them.
    """
    if (
        type(value) is np.ndarray
        and value.flags.writeable
        and (value.base is not None or refs is None or sys.getrefcount(value) > refs + 2)  # (+2: ``value``, the call)
    ):
        return value.copy()
    return value


def read_only_view(x: NDArray) -> NDArray:
    """A read-only view of ``x``: what every user kernel is given of a buffer or an intermediate.

    A view of a writeable array can be made writeable again only through its base, which
    user code never sees; a buffer that owns its memory would let anyone set WRITEABLE back.
    """
    v = x.view()
    v.flags.writeable = False
    return v


def info(arr: NDArray) -> BufferInfo:
    """The :class:`BufferInfo` of a local array."""
    return BufferInfo(arr, arr.shape, arr.dtype, arr.nbytes)


def run_kernel(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelResult:
    """Call ``fn`` and normalize what it returns (on the thread or worker that runs it)."""
    return normalize(fn(*args, **kwargs))


def normalize(out: Any) -> KernelResult:
    """A kernel's return value as owned, read-only buffers."""
    if type(out) is KernelResult:  # made so by the kernel itself (a batch's split rows)
        return out
    if isinstance(out, SEQUENCES):
        if not out:
            raise BadOutputError("kernel returned an empty sequence; expected at least one ndarray")
        return KernelResult([info(finalize(o)) for o in out], True)
    return KernelResult([info(finalize(out))], False)


#: numpy's words for an index or axis out of range, or too many indices (a bad key type is no range error).
_OUT_OF_RANGE = re.compile("out of bounds|out of range|too many indices|did not match")

#: An op's parameter names by op name (set by ``_opdef``, a layer above), for messages.
ARG_NAMES: dict[str, Callable[[], list[str]]] = {}


def forgotten_await(op: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> TypeError | None:
    """The error for a coroutine given as an op's argument (a forgotten ``await``), naming it; else None.

    The coroutine is closed, so that Python does not add "was never awaited" to the error.
    """
    names = ARG_NAMES.get(op, list)()
    found = [(names[i] if i < len(names) else f"#{i + 1}", a) for i, a in enumerate(args)]
    found += list((kwargs or {}).items())
    for name, value in found:
        items = value if isinstance(value, list | tuple) else (value,)
        for v in items:
            if isinstance(v, Coroutine):
                what = getattr(v, "__qualname__", "a coroutine")
                v.close()
                return TypeError(
                    f"{op}: argument {name!r} is a coroutine ({what}), not a value: a forgotten `await`?"
                    f" Use `await {what.split('.')[-1]}(...)`, or the lazy expression (operators, aiotensor.xp)"
                )
    return None


def kernel_error(op: str, args: tuple[Any, ...], exc: BaseException, user: bool) -> AioTensorError | RuntimeWarning:
    """The error an op raises for an exception of its kernel, naming the op and its inputs (cause: ``exc``).

    A ``RuntimeWarning`` is numpy's floating-point warning made an exception by the
    caller's warning filters (``warnings.simplefilter("error")``): it is raised as it is,
    as numpy raises it, on every path (``_fpwarn`` reissues it at the caller's line).
    """
    if isinstance(exc, (AioTensorError, RuntimeWarning)):
        return exc
    awaited = forgotten_await(op, args)
    if awaited is not None:
        exc = awaited
    exc = _readable(exc)
    error = _map(op, args, exc, user)
    error.__cause__ = error.__cause__ or _original(exc)
    return error


def _original(exc: BaseException) -> BaseException:
    if isinstance(exc, RuntimeError) and type(exc.__cause__) is StopIteration:
        return exc.__cause__
    return exc


def _map(op: str, args: tuple[Any, ...], exc: BaseException, user: bool) -> AioTensorError:
    if isinstance(exc, RuntimeError) and type(exc.__cause__) is StopIteration:
        # A StopIteration cannot travel through an await (PEP 479 turns it into this
        # RuntimeError): name the kernel's own exception.
        exc = exc.__cause__
    where = f"{op}({describe(args)})"
    text = _text(exc)
    if isinstance(exc, MemoryError):
        return ResourceExhaustedError(f"{where}: out of memory ({text})")
    if not user and isinstance(exc, IndexError) and _OUT_OF_RANGE.search(text):  # AxisError is one too
        return IndexOutOfRangeError(f"{where}: {text}", op=op, inputs=input_specs(args))
    if isinstance(exc, BadOutputError) or (not user and isinstance(exc, _ARG_ERRORS)):
        return InvalidArgumentError(f"{where}: {text}", op=op, inputs=input_specs(args))
    return KernelError(f"{where} failed: {type(exc).__name__}: {text}")


def _readable(exc: BaseException) -> BaseException:
    # An exception rebuilt by another process's deserializer may lack what its __str__
    # reads: Dask's copy of numpy's AxisError has its args (5, 2, None) but no .axis, so
    # it neither reads as "out of bounds" (the IndexOutOfRangeError a local run raises)
    # nor prints in a traceback. Made again from its args, it is the original.
    try:
        str(exc)
        return exc
    except Exception:
        pass
    try:
        again = type(exc)(*exc.args)
        str(again)
    except Exception:
        return exc
    return again.with_traceback(exc.__traceback__)


def _text(exc: BaseException) -> str:
    # An exception rebuilt by another process's deserializer may lack what its __str__
    # reads (Dask's copy of numpy's AxisError has no .axis): its args then, never a
    # second error in place of the mapping.
    try:
        return str(exc)
    except Exception:
        return ", ".join(map(repr, exc.args))
