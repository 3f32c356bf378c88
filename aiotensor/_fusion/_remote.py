"""A fused function's call on a backend out of this process (Dask): one task on a worker.

``FusedFunction._call_remote`` sends the whole call as one kernel, :class:`_OnWorker`,
picklable with the function by value: it runs where the inputs are, with ops of its own
there (:class:`_WorkerEngine`: numpy, no tensors). A tensor the function captures from
its closure or module cannot travel (:func:`_captured_tensor` finds it, and the call
fails before it is sent).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._errors import InvalidArgumentError
from .._programs._interpreter import Budget
from .._tensor import Tensor
from ._fused_ops import FusedOps

if TYPE_CHECKING:
    from .._engine._core import Engine

# (names of the package's other modules: private to it)
__all__ = ["_OnWorker", "_WorkerEngine", "_captured_tensor"]


class _WorkerEngine:
    """What a fused function's ops see of the session on a remote worker: numpy, no tensors."""

    _xp = np

    def buffer(self, x: Tensor, op: str) -> Any:
        raise InvalidArgumentError(
            f"{op}: tensor {x.name!r} is not an argument of the call: on a remote backend a fused"
            " function reads only the tensors it is given (pass it as an argument)"
        )


def _captured_tensor(fn: Callable[..., Any]) -> Tensor | None:
    # A tensor the function reads from its closure or module (weights, typically).
    try:
        found = inspect.getclosurevars(fn)
    except TypeError:  # not a Python function (a callable object): the worker tells
        return None
    for value in (*found.nonlocals.values(), *found.globals.values()):
        if type(value) is Tensor:
            return value
    return None


class _OnWorker:
    """A fused function's call as one kernel a remote backend runs (picklable: the function by value)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn  # (backends name the task after ``fn``)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ops = FusedOps(cast("Engine", _WorkerEngine()), Budget("a fused function"), False, self.fn)
        return ops._kernel(*args, **kwargs)
