"""numpy's floating-point warnings from kernels, reported at the user's line that called the op.

numpy warns with ``stacklevel=1``: a warning raised by a kernel names the innermost
Python frame, the engine's line that called the ufunc, and the warnings registry then
shows it once for the whole program. Here the warning names the first frame outside
aiotensor instead (the ``await s.exp(x)`` of the user), every time a new line warns.

* Kernels on the pool run in a copy of the caller's context, numpy's ``errstate``
  included (see ``_backends/_base.py``): :func:`collecting` turns the categories that
  would warn into ``"call"`` with a collector, around the submission only; after the
  kernel, :func:`reissue` warns at the user's line. For a backend that says it runs
  kernels in that copy and nothing else (``Backend.runs_in_context``: the local one),
  :func:`submit_in_context` does the same with an error state made once per caller's state,
  whose ``call`` appends to a list in a context variable set beside it: a fresh error
  state per kernel cost ~2 µs of loop CPU per op on the pool (uvloop), not the 0.8 µs
  it takes on its own. A backend that keeps ``np.geterrcall()`` to call later (Dask)
  gets :func:`collecting`'s own collector.
* Kernels run inline by the engine's own lines: a filter, appended after any of the
  user's (:func:`install`), makes numpy's warning raised there an exception, which
  costs nothing when no warning happens. The engine then runs the kernel again,
  collecting (:func:`rerun`): kernels are pure functions of their inputs.

  A warning the user's own filter made an exception at another of aiotensor's lines
  (a program's step, run inline whole or in slices) is caught and rerun the same way.

A category the caller set to ``"raise"``, ``"ignore"``, ``"print"`` or ``"log"`` is left
alone, and a user's own warning filters still decide whether a reissued warning shows:
under ``warnings.simplefilter("error")`` the reissued warning is raised at the user's
line, as numpy raises it, and ``_kernels.kernel_error`` passes a ``RuntimeWarning``
through unmapped, so every path raises that same exception.

:func:`collecting` runs on the loop for every kernel sent to the pool, so it is kept
cheap: numpy 2 keeps the error state in a context variable holding one immutable
object, and the categories that warn are computed once per such object (a one-entry
cache, keyed by identity: the object changes whenever an ``errstate`` is entered), then
each submission makes the collecting state from the current one with
``_make_extobj`` and sets the variable around the submission, as ``np.errstate`` does
(0.9 µs against 1.8 µs for ``np.geterr()``, a dict and an ``np.errstate`` entered and
left, in a loop of ``collecting()`` and its ``with``). Those two names are numpy's
private API: when they are missing (numpy 1.x, or a later numpy moving them) it falls
back to ``np.geterr()`` and ``np.errstate``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")

__all__ = ["Collector", "collecting", "install", "reissue", "rerun", "submit_in_context"]

#: The modules whose direct kernel calls the filter covers: the engine's inline paths
#: (one op in ``_core``, the lean path in ``_lean``, any kernel run inline in ``_call``).
ENGINE = r"aiotensor\._engine\._(core|lean|call)\Z"


def install() -> None:
    """Append the filter that turns numpy's RuntimeWarning at the engine's kernel calls into an exception."""
    # Appended: a filter of the user's ("ignore", "error") comes first and decides.
    warnings.filterwarnings("error", category=RuntimeWarning, module=ENGINE, append=True)


class Collector:
    """numpy's ``errcall``: the floating-point errors a kernel hit (called from any thread)."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, err: str, flag: int) -> None:
        """Record ``err`` ("overflow", "divide by zero", ...) once."""
        if err not in self.errors:
            self.errors.append(err)


class _Errstate:
    # np.errstate's enter and exit for an error state made already (numpy 2). Not the
    # Collector itself: the state holds the collector, and a collector holding the state
    # would be a cycle through a capsule, which the garbage collector cannot see.
    __slots__ = ("_extobj", "_token")

    def __init__(self, extobj: object) -> None:
        self._extobj = extobj
        self._token: Any = None

    def __enter__(self) -> None:
        assert _extobj_var is not None
        self._token = _extobj_var.set(self._extobj)

    def __exit__(self, *exc: object) -> None:
        assert _extobj_var is not None
        _extobj_var.reset(self._token)


def _numpy_error_state() -> tuple[contextvars.ContextVar[Any] | None, Callable[..., Any] | None]:
    # numpy 2's context variable of the error state and the maker of its values (private).
    try:
        ufunc_config = importlib.import_module("numpy._core._ufunc_config")
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # pragma: no cover - numpy 1.x
        return None, None
    var = getattr(ufunc_config, "_extobj_contextvar", None)
    make = getattr(umath, "_make_extobj", None)
    if isinstance(var, contextvars.ContextVar) and callable(make):
        return var, make
    return None, None  # pragma: no cover - a numpy that moved them


_extobj_var, _make_extobj = _numpy_error_state()

#: The last error state seen and its categories that warn, as ``_make_extobj`` keywords.
_last: tuple[Any, dict[str, str]] = (None, {})


def _warning_calls() -> dict[str, str]:
    # {"over": "call", ...} for the categories that warn in the current error state.
    global _last
    assert _extobj_var is not None
    extobj = _extobj_var.get()
    last = _last  # (one read: another thread may replace it)
    if last[0] is extobj:
        return last[1]
    calls = {k: "call" for k, v in np.geterr().items() if v == "warn"}
    _last = (extobj, calls)  # (keeps extobj alive: its identity is not reused while cached)
    return calls


def collecting() -> tuple[Any, Collector] | None:
    """A context manager collecting the categories that warn now, and its collector; ``None`` if none warns."""
    if _extobj_var is None or _make_extobj is None:  # pragma: no cover - numpy 1.x
        calls: dict[str, Any] = {k: "call" for k, v in np.geterr().items() if v == "warn"}
        if not calls:
            return None
        collector = Collector()
        return np.errstate(call=collector, **calls), collector
    calls = _warning_calls()
    if not calls:
        return None
    collector = Collector()
    return _Errstate(_make_extobj(call=collector, **calls)), collector


#: The errors of the kernel whose context this is (a copy of its submitter's), for :func:`_record`.
_errors_var: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("aiotensor_fp_errors", default=None)


def _record(err: str, flag: int) -> None:
    # numpy's errcall in :func:`submit_in_context`'s state (any thread): the list of the
    # kernel's own context, so one cached error state serves every submission.
    errors = _errors_var.get()
    if errors is not None and err not in errors:
        errors.append(err)


#: The last error state seen by :func:`submit_in_context` and its collecting state (``None``: nothing warns).
_last_in_context: tuple[Any, Any] = (None, None)


def submit_in_context(
    submit: Callable[..., T], fn: Any, args: Any, kwargs: Any, device: str, blas: bool
) -> tuple[T, list[str] | None]:
    """``submit(fn, args, kwargs, device=device[, blas=True])``, collecting (a backend using a copy of this context).

    What :func:`collecting` and its ``with`` do around a submission, and the list the
    kernel's errors go to (``None`` if nothing warns); but the error state is made once
    per caller's error state (its ``call`` appends to the list of a context variable set
    beside it), not once per submission, and in one Python frame. Nothing outside the
    copied context may call ``np.geterrcall()``'s function: it records nothing there.
    """
    global _last_in_context
    if _extobj_var is None or _make_extobj is None:  # pragma: no cover - numpy 1.x
        state = collecting()
        with state[0] if state is not None else contextlib.nullcontext():
            pending = (
                submit(fn, args, kwargs, device=device, blas=True) if blas else submit(fn, args, kwargs, device=device)
            )
        return pending, state[1].errors if state is not None else None
    extobj = _extobj_var.get()
    last = _last_in_context  # (one read: another thread may replace it)
    if last[0] is extobj:
        made = last[1]
    else:
        calls = _warning_calls()
        made = _make_extobj(call=_record, **calls) if calls else None
        _last_in_context = (extobj, made)  # (keeps extobj alive, as _last does)
    if made is None:
        return (
            submit(fn, args, kwargs, device=device, blas=True) if blas else submit(fn, args, kwargs, device=device)
        ), None
    errors: list[str] = []
    extobj_token = _extobj_var.set(made)
    errors_token = _errors_var.set(errors)
    try:
        # blas= only when set: a backend written before it existed still runs the rest.
        return (
            submit(fn, args, kwargs, device=device, blas=True) if blas else submit(fn, args, kwargs, device=device)
        ), errors
    finally:
        _errors_var.reset(errors_token)
        _extobj_var.reset(extobj_token)


def _user_stacklevel() -> int:
    # The stacklevel, for a warnings.warn made in reissue, of the first frame outside aiotensor.
    frame = sys._getframe(2)  # reissue's caller: stacklevel 2 of the warn in reissue
    level = 2
    while frame.f_back is not None and str(frame.f_globals.get("__name__", "")).startswith("aiotensor."):
        frame = frame.f_back
        level += 1
    return level


def reissue(op: str, errors: list[str]) -> None:
    """Warn ``"<error> encountered in <op>"`` for each error, at the line of the op's caller."""
    if not errors:
        return
    level = _user_stacklevel()
    for err in errors:
        warnings.warn(f"{err} encountered in {op}", RuntimeWarning, stacklevel=level)


def rerun(op: str, kernel: Any, bufs: Any, kw: dict[str, Any] | None) -> Any:
    """Run ``kernel`` again collecting its floating-point errors, reissue them at the user's line; its output."""
    state = collecting()
    if state is None:  # the caller's errstate changed in between: nothing warns now
        return kernel(*bufs, **kw) if kw else kernel(*bufs)
    errstate, collector = state
    with errstate:
        out = kernel(*bufs, **kw) if kw else kernel(*bufs)
    reissue(op, collector.errors)
    return out
