"""The ``ops`` of a fused function: every op of the library, synchronous, over the one interpreter.

Inside a fused function (:mod:`aiotensor._fusion._function`), ``ops`` is the op table made
synchronous (``ops.add(x, y)`` returns at once, running the op's own spec and kernel, as
a node of an expression program does). :class:`FusedOps` is the driver of the one step
executor of multi-op kernels, ``_interpreter.Interpreter``: it wraps the arguments as
:class:`~aiotensor._fusion._fused_value.FusedValue` objects, applies each op's spec,
unwraps its arguments, and the interpreter applies the step (checks, kernel, errors, the
run's budget, recycled outputs for batched kernels). Its ``_kernel`` is the kernel of
one fused call: the function's Python, run on the pool or inline.

The ops are methods made at import from the op table (``OPS``): plain numpy ops called
on values and numbers take the interpreter's hot path (``_plain``; ``_kept`` in a
batch's kernel) without a spec to apply.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._kernels import SEQUENCES
from .._opdef import ALIASES, OPS, OpDef
from .._programs._interpreter import RECYCLER, Budget, Interpreter
from .._tensor import Tensor
from ._fused_value import FusedValue, _MadeValue, _plain_numpy, _result, _wrap_arg

if TYPE_CHECKING:
    from .._engine._core import Engine

__all__ = ["FusedOps", "unknown_op"]

_ndarray = np.ndarray
_new = object.__new__
_clock = time.perf_counter


class FusedOps(Interpreter):
    """The ``ops`` argument of a fused function: every op of the library, synchronous.

    ``ops.add(x, 1)``, ``ops.matmul(x, w)``, ``ops.split(x, 2)`` ... take and return
    :class:`FusedValue` objects (and numbers, arrays, and tensors of the session).
    """

    # The driver of the interpreter for a function's Python: arguments wrapped as values,
    # each op's spec applied, its arguments unwrapped, the step applied by the interpreter.
    __slots__ = ("_elapsed", "_engine", "_fn")

    def __init__(
        self,
        engine: Engine,
        budget: Budget,
        measure: bool = True,
        fn: Callable[..., Any] | None = None,
        recycle: bool = False,
    ) -> None:
        # Interpreter.__init__, written out: a fused call makes one of these, and the
        # call through super() doubled what making it costs (~150 ns more a call).
        xp = engine._xp
        self._budget = budget
        self._xp = xp
        self._estimate = 0.0 if measure else None
        self._free = 0.0
        self._releases = 0
        self._recycle = RECYCLER if recycle else None
        self._fast = not measure and not recycle and xp is np
        self._keeps = not measure and recycle and xp is np
        self._blas = self._big = False
        self._engine = engine
        self._fn = fn  # the fused function whose call this is (see _kernel)
        self._elapsed = math.inf

    if TYPE_CHECKING:  # (for type checkers only: see unknown_op)

        def __getattr__(self, name: str) -> Callable[..., Any]: ...

    def _kernel(self, *args: Any, **kwargs: Any) -> Any:
        # The kernel of one call of ``_fn`` (the engine runs this bound method): wrap the
        # arguments, call the function, unwrap its results, time it all.
        start = _clock()
        wrapped = []
        for a in args:
            if type(a) is _ndarray:  # a tensor's buffer: FusedValue(a, self), without the call
                v = _new(FusedValue)
                v._arr = a
                v._ops = self
                wrapped.append(v)
            else:
                wrapped.append(_wrap_arg(a, self))
        try:
            if kwargs:
                out = self._fn(self, *wrapped, **{k: _wrap_arg(v, self) for k, v in kwargs.items()})  # type: ignore[misc]
            else:
                out = self._fn(self, *wrapped)  # type: ignore[misc]
        except AttributeError as exc:
            error = unknown_op(exc, self)
            if error is exc:
                raise
            raise error from None
        if type(out) is _MadeValue and not out._arr.flags.writeable:
            # The common result, one value made in this run: _result's first case, inline.
            arr = out._arr
            arr.setflags(True)  # type: ignore[call-arg]
            self._budget.escaped += 1
            out = arr
        elif isinstance(out, SEQUENCES):
            out = [_result(o, self._budget) for o in out]
        else:
            out = _result(out, self._budget)
        self._elapsed = (_clock() - start) * 1e6
        return out

    def _arg(self, x: Any, op: str) -> Any:
        tx = type(x)
        if tx is _MadeValue or tx is FusedValue:
            return x._arr
        if tx is Tensor:  # e.g. weights captured by the function: read in place
            return self._engine.buffer(x, op)
        if tx is list or tx is tuple:
            return tx(self._arg(e, op) for e in x)
        return x

    def _run(self, d: OpDef, /, *args: Any, **kwargs: Any) -> Any:
        # The same spec and kernel as the op outside, on this thread, at once.
        if kwargs and "name" in kwargs and d not in _TAKES_NAME:
            del kwargs["name"]
        if d.plain:
            kw: dict[str, Any] | None = kwargs or None
        else:
            args, kw, _ = d.spec(*args, **kwargs)
        label = d.name
        vals = tuple([a._arr if isinstance(a, FusedValue) else self._arg(a, label) for a in args])
        if kw:
            kw = {k: self._arg(v, label) for k, v in kw.items()}
        out = self._step(d, label, vals, kw, args)
        if type(out) is _ndarray:
            return self._made(out, label, args)
        if isinstance(out, SEQUENCES):
            outs = [self._made(np.asarray(o), label, args) for o in out]
            return outs if d.result is None else d.result(outs)
        return self._made(np.asarray(out), label)


FusedOps._made_type = _MadeValue
FusedOps._view_type = FusedValue


def _fused_op(d: OpDef) -> Callable[..., Any]:
    if _plain_numpy(d):

        def run(self: FusedOps, *args: Any, **kwargs: Any) -> Any:
            if (self._fast or self._keeps) and not kwargs:
                vals = []
                for a in args:
                    ta = type(a)
                    if ta is _MadeValue or ta is FusedValue:
                        vals.append(a._arr)
                    elif ta is float or ta is int or ta is _ndarray:
                        vals.append(a)
                    else:
                        break
                else:
                    return self._plain(d, tuple(vals)) if self._fast else self._kept(d, tuple(vals), args)
            return self._run(d, *args, **kwargs)

    else:

        def run(self: FusedOps, *args: Any, **kwargs: Any) -> Any:
            return self._run(d, *args, **kwargs)

    run.__name__ = run.__qualname__ = d.name
    run.__doc__ = d.doc
    return run


for _d in OPS.values():
    setattr(FusedOps, _d.name, _fused_op(_d))
for _alias, _target in ALIASES.items():  # ops.asarray, as s.asarray and at.asarray
    setattr(FusedOps, _alias, getattr(FusedOps, _target))

# Ops whose spec takes ``name=`` (the others drop it: a fused value has no name).
_TAKES_NAME = frozenset(d for d in OPS.values() if not d.plain and "name" in d.spec.__code__.co_varnames)


def unknown_op(exc: AttributeError, ops: FusedOps) -> AttributeError:
    """``exc`` as it should read: "fused functions have no op 'name'" if it is ``ops.name`` that failed.

    FusedOps has no ``__getattr__`` to say so itself: CPython cannot specialize attribute
    reads on a class that has one (each costs ~3x), and the hot path of a fused function
    reads the ops object's attributes several times per op. Other errors come back as
    they are.
    """
    if exc.obj is not ops or exc.name is None:
        return exc
    error = AttributeError(f"fused functions have no op {exc.name!r}", name=exc.name, obj=ops)
    return error.with_traceback(exc.__traceback__)
