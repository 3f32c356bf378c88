"""A run of correctly rounded float ops as one compiled loop (numba, optional).

numpy runs a chain of ten ufuncs as ten passes over memory, and the blocked
interpreter as ten ufunc calls per block. When every op of a run is one IEEE 754
operation that is correctly rounded (``+ - * /``, negation, ``abs``, ``sqrt``,
``square`` as ``x * x``), the same ops on the same operands in the same order give the
same bits whatever the loop: so the run can be one loop over the elements, compiled
by numba (``fastmath=False``: no reassociation, no fused multiply-add; numpy's error
model: a division by zero is inf, as numpy's). :func:`plan` decides once per layout
whether a run is eligible: one float dtype (float32 or float64) for every input, value
and constant (no promotion), inputs of the result's shape (no broadcasting), no
reduction. :func:`kernel` compiles the loop the first time a plan runs, and keeps it
(per loop source and dtype, shared by runs of the same ops), releasing the GIL while
it runs; asked for on an event loop's thread, it compiles on a thread of its own, the
run taking the interpreter's path meanwhile. numba is imported then, not before; when it is missing or a compile fails
the run takes the interpreter's path, as without it.

**Floating-point warnings, NaN.** numpy's flags come from its own loops: the compiled
loop raises none numpy sees. So the loop also says whether any value it computed was
not finite (every overflow, invalid operation and division by zero makes one; the
loop checks its result and its divisors: every op of the list keeps a value that is
not finite so, but a divisor, ``x / inf`` being 0); when
one was, its result is dropped and the run computed again by the interpreter (op by
op, with numpy's own warnings, when the caller does not ignore all three:
``_blocked_layout.Layout._compiled``). Always, not only for warnings: where two NaNs
meet, the NaN an IEEE operation returns (its sign, its payload) depends on the
operands' order, which LLVM may swap for ``+`` and ``*`` (float32's ``-(NaN + -NaN)
* NaN`` differed from numpy's in its sign). Underflow leaves finite values: the loop
runs only when the caller ignores it (numpy's default); the loop keeps subnormals
(no flush to zero), as numpy does.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Plan", "available", "kernel", "plan"]

#: Per ufunc, the loop's expression of its operands (each one IEEE operation, correctly rounded).
_EXPRESSIONS: dict[Any, str] = {
    np.add: "{0} + {1}",
    np.subtract: "{0} - {1}",
    np.multiply: "{0} * {1}",
    np.true_divide: "{0} / {1}",
    np.negative: "-{0}",
    np.positive: "+{0}",
    np.absolute: "abs({0})",
    np.sqrt: "math.sqrt({0})",
    np.square: "{0} * {0}",
}
_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
#: Per float dtype, the largest Python int every smaller one of which it holds exactly.
_EXACT_INTS = {np.dtype(np.float32): 1 << 24, np.dtype(np.float64): 1 << 53}


class Plan:
    """An eligible run's loop: its source, dtype, and the template slots of its constants."""

    __slots__ = ("const_slots", "dtype", "nin", "source", "values")

    def __init__(self, source: str, dtype: np.dtype[Any], nin: int, const_slots: list[int], values: list[Any]) -> None:
        self.source = source
        self.dtype = dtype
        self.nin = nin
        #: The slots (in the layout's template) of the constants the loop takes, in order.
        self.const_slots = const_slots
        #: Their values, as scalars of the dtype (the loop's arguments after its inputs).
        self.values = values


def plan(
    ufuncs: list[Any],
    typed: list[tuple[int, ...]],
    nin: int,
    nconst: int,
    all_dtypes: list[np.dtype[Any]],
    template: list[Any],
    same_shape: bool,
) -> Plan | None:
    """The loop of a run (its ufuncs, its ops' arguments with constants typed), or None if not eligible.

    ``all_dtypes``: the inputs' then the ops' values' dtypes; ``template``: the run's
    constants after its inputs, the typed constants after its ops' slots;
    ``same_shape``: every input has the result's shape.
    """
    dtype = all_dtypes[-1]
    if not same_shape or dtype not in _FLOATS or any(d != dtype for d in all_dtypes):
        return None
    nbase = nin + nconst
    first_typed = nbase + len(ufuncs)
    consts: dict[int, str] = {}
    values: list[Any] = []
    names: list[str] = []
    checked: set[str] = set()
    lines = []
    for k, (f, args) in enumerate(zip(ufuncs, typed, strict=True)):
        pattern = _EXPRESSIONS.get(f)
        if pattern is None or f.nin != len(args):
            return None
        operands = []
        for i in args:
            if i < nin:
                operands.append(f"a{i}")
            elif nbase <= i < first_typed:
                operands.append(f"t{i - nbase}")
            else:
                value = template[i]
                if type(value) is int and abs(value) <= _EXACT_INTS[dtype]:
                    # (NEP 50: a Python int meets a float array as its dtype; exactly, up to here)
                    value = dtype.type(value)
                # (not ``getattr(value, "dtype", None) != dtype``: a dtype equals None, float64)
                if not isinstance(value, (np.ndarray, np.generic)) or value.dtype != dtype or value.ndim != 0:
                    return None  # (a Python scalar numpy's loop casts: not typed once here)
                if i not in consts:
                    consts[i] = f"c{len(consts)}"
                    values.append(dtype.type(value))  # (a scalar: numba takes no 0-d array for it)
                operands.append(consts[i])
        if f is np.true_divide:  # (a divisor not finite may give a finite quotient: x / inf is 0)
            if args[1] >= nin and not (nbase <= args[1] < first_typed):
                if not np.isfinite(template[args[1]]):
                    return None  # (a constant divisor: finite, or not eligible)
            else:
                checked.add(operands[1])
        lines.append(f"        t{k} = {pattern.format(*operands)}")
        names.append(f"t{k}")
    # Not finite: a value every op of the list keeps not finite (inf + x is inf, inf * 0
    # and inf - inf are NaN, NaN stays NaN, sqrt(-inf) is NaN), but a divisor's: so the
    # result and the divisors are checked, and an overflow, invalid operation or division
    # by zero anywhere (each makes an inf or a NaN, rounding to nearest) shows there.
    checks = [f"        bad |= not (abs({name}) <= FMAX)" for name in sorted(checked | {names[-1]})]
    loads = [f"        a{i} = x{i}[j]" for i in range(nin)]
    params = [*(f"x{i}" for i in range(nin)), *consts.values(), "out"]
    source = "\n".join(
        [
            f"def loop({', '.join(params)}):",
            "    bad = False",
            "    for j in range(out.shape[0]):",
            *loads,  # (every input read before the result's element is written: it may be one of them)
            *lines,
            *checks,
            f"        out[j] = {names[-1]}",
            "    return bad",
        ]
    )
    return Plan(source, dtype, nin, list(consts), values)


def kernel(p: Plan) -> Callable[..., bool] | None:
    """The compiled loop of ``p`` (compiled at its first call, then kept), or None when there is none yet.

    None when numba cannot make it; and, on an event loop's thread (an inline run) with
    :data:`BACKGROUND`, while it compiles on a thread of its own: importing numba and
    compiling took ~0.37 s for the first loop, ~0.1 s for another, which would hold the
    loop; meanwhile the run takes the interpreter's path. A worker compiles it itself.
    """
    key = (p.source, p.dtype)
    found = _KERNELS.get(key, _UNSEEN)
    if found is not _UNSEEN:
        return found  # type: ignore[no-any-return]
    if key in _PENDING:
        return None  # (compiling on its thread: not waited for)
    if BACKGROUND and asyncio._get_running_loop() is not None:
        with _LOCK:
            if key not in _PENDING and key not in _KERNELS:
                # (not a daemon: the interpreter waits for it at exit rather than leave LLVM mid-compile)
                thread = threading.Thread(target=_compile_into, args=(p, key), name="aiotensor-jit-compile")
                _PENDING[key] = thread
                thread.start()
        return None
    with _COMPILING:  # (two threads asking at once compile once)
        found = _KERNELS.get(key, _UNSEEN)
        if found is _UNSEEN:
            found = _KERNELS[key] = _compile(p)
    return found  # type: ignore[no-any-return]


def _compile_into(p: Plan, key: tuple[str, np.dtype[Any]]) -> None:
    # The background compile of :func:`kernel`.
    try:
        with _COMPILING:
            if key not in _KERNELS:
                _KERNELS[key] = _compile(p)
    finally:
        with _LOCK:
            _PENDING.pop(key, None)


def _compile(p: Plan) -> Callable[..., bool] | None:
    global _numba
    if _numba is None:
        try:
            _numba = importlib.import_module("numba")
        except Exception:  # (ImportError, or a numba that fails to load with this numpy)
            _numba = False
    if _numba is False:
        return None
    try:
        nb = _numba
        scalar = nb.from_dtype(p.dtype)
        reads = nb.types.Array(scalar, 1, "C", readonly=True)  # (also takes writable arrays)
        writes = nb.types.Array(scalar, 1, "C")
        signature = nb.types.boolean(*[reads] * p.nin, *[scalar] * len(p.const_slots), writes)
        env: dict[str, Any] = {"math": math, "FMAX": p.dtype.type(np.finfo(p.dtype).max)}
        exec(compile(p.source, "<aiotensor compiled run>", "exec"), env)
        compiled: Callable[..., bool] = nb.njit(signature, nogil=True, fastmath=False, error_model="numpy")(env["loop"])
    except Exception:  # a compile error: the interpreter's path, as without numba
        return None
    return compiled


def available() -> str | None:
    """numba's version when it is installed (not imported: for ``aiotensor info``), else None."""
    try:
        return importlib.metadata.version("numba")
    except importlib.metadata.PackageNotFoundError:
        return None


#: numba once imported; None before the first compile, False when it could not be imported.
_numba: Any = None
_KERNELS: dict[tuple[str, np.dtype[Any]], Callable[..., bool] | None] = {}
#: Loops compiling on a thread of their own (``kernel`` on an event loop's thread), and the thread.
_PENDING: dict[tuple[str, np.dtype[Any]], threading.Thread] = {}
_LOCK = threading.Lock()  # (_PENDING's, held briefly: the event loop takes it)
_COMPILING = threading.Lock()  # (one compile at a time)
#: Whether a loop first asked for on an event loop's thread compiles on a thread of its own
#: (off: there and then, holding the loop: for tests).
BACKGROUND = True
_UNSEEN: Any = object()
