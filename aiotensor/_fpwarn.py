"""numpy's floating-point warnings from kernels, reported at the user's line that called the op.

numpy warns with ``stacklevel=1``: a warning raised by a kernel names the innermost
Python frame, the engine's line that called the ufunc, and the warnings registry then
shows it once for the whole program. Here the warning names the first frame outside
aiotensor instead (the ``await s.exp(x)`` of the user), every time a new line warns.

* Kernels on the pool run in a copy of the caller's context, numpy's ``errstate``
  included (see ``_backend.py``): :func:`collecting` turns the categories that would
  warn into ``"call"`` with a collector, around the submission only; after the kernel,
  :func:`reissue` warns at the user's line.
* Kernels run inline by the engine's own lines: a filter, appended after any of the
  user's (:func:`install`), makes numpy's warning raised there an exception, which
  costs nothing when no warning happens. The engine then runs the kernel again,
  collecting (:func:`rerun`): kernels are pure functions of their inputs.

A category the caller set to ``"raise"``, ``"ignore"``, ``"print"`` or ``"log"`` is left
alone, and a user's own warning filters still decide whether a reissued warning shows.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np

__all__ = ["Collector", "collecting", "install", "reissue", "rerun"]

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


def collecting() -> tuple[Any, Collector] | None:
    """An ``np.errstate`` collecting the categories that warn now, and its collector; ``None`` if none warns."""
    calls: dict[str, Any] = {k: "call" for k, v in np.geterr().items() if v == "warn"}
    if not calls:
        return None
    collector = Collector()
    return np.errstate(call=collector, **calls), collector


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
