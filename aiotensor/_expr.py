"""Awaitable, composable expressions: what tensor operators and methods return.

``a * 2.0 + 1.0`` builds an :class:`Expr` (TF1's graph node) and runs nothing;
``await e`` evaluates it in one dispatch and gives a :class:`~aiotensor.Tensor`,
``await e.eval()`` gives its numpy value, and ``s.run(...)`` takes expressions anywhere
in its structure. Only the results of an evaluation get handles: intermediates are
freed as soon as the evaluation no longer needs them (see ``_programs``).

``Expr`` inherits :class:`~aiotensor._operand.Operand` (what tensors and expressions
share: the operators and ndarray-named methods, generated into ``_generated_operand``,
and numpy's protocols), imported from here: this module imports ``_operand`` first.
An expression's ``shape`` and ``dtype`` are known before it runs, from its inputs'
metadata (``_meta``); its signature keys constants by value (``_value_keys``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Generator
from types import CoroutineType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import _defaults
from . import _ops as _ops  # fills OPS
from ._errors import NoSessionError
from ._generated_operand import OperandMethods
from ._kernels import forgotten_await
from ._meta import Shape, node_meta
from ._opdef import OPS, OpDef, item_op
from ._operand import Operand
from ._value_keys import HASHED_BY_VALUE, SCALARS, scalar_key

if TYPE_CHECKING:
    from ._protocols import EngineLike, SessionLike
    from ._types import NDArray

__all__ = ["Expr", "Operand", "numpy_method"]


class Expr(Operand):
    """An op applied to tensors, expressions and values, not run yet. Made by operators and tensor methods.

    Await it for a :class:`~aiotensor.Tensor` (each evaluation computes it anew), or
    ``await e.eval()`` for its numpy value. Session methods, module-level ops,
    operators and ``run`` accept expressions wherever they accept tensors. An
    expression garbage-collected without ever being evaluated warns, as a coroutine
    never awaited does.
    """

    __slots__ = ("__weakref__", "_args", "_d", "_kwargs", "_lv", "_meta", "_n", "_nbytes", "_sig", "_used")
    _used: bool
    _meta: Any  # (shape, dtype) or a list of them, computed on first read (see _metadata)
    #: The structure of the expression, by value (ops, constants, where tensors go), or
    #: None when it holds something only identity describes (an array) or is too large:
    #: the key of the compiled-program cache (``_programs/_compile``), so a formula evaluated in a
    #: loop compiles once.
    _sig: tuple[Any, ...] | None
    #: The tensors it reads, one entry per occurrence, in the order ``_sig`` meets them.
    _lv: tuple[Any, ...]
    #: The number of nodes, counting a shared subexpression once per use.
    _n: int

    def __init__(self, d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None, nbytes: int | None) -> None:
        self._nbytes = nbytes
        # The operators' common case (``y * 2.0``, ``y + v``): two tensors, expressions or
        # plain numbers, in one pass without the general loop's lists; the signature,
        # tensors read and node count are exactly the general loop's, which takes the rest.
        if kwargs is None and len(args) == 2:
            a, b = args
            ta = type(a)
            sa: Any
            sb: Any
            if ta is Expr:
                a._used = True  # evaluated as part of this one, or this one warns (the loop below marks it too)
                sa = a._sig
                la = a._lv
                n = a._n + 1
            elif ta is _Tensor:
                sa = _LEAF
                la = (a,)
                n = 1
            elif (ta is float and a == a and a != 0.0) or ta is int:
                sa = (ta, a)
                la = ()
                n = 1
            else:
                sa = _OTHER
            if sa is not _OTHER:
                tb = type(b)
                if tb is Expr:
                    b._used = True
                    sb = b._sig
                    lb = b._lv
                    n += b._n
                elif tb is _Tensor:
                    sb = _LEAF
                    lb = (b,)
                elif (tb is float and b == b and b != 0.0) or tb is int:
                    sb = (tb, b)
                    lb = ()
                else:
                    sb = _OTHER
                if sb is not _OTHER:
                    self._d = d
                    self._args = args
                    self._kwargs = None
                    self._used = False
                    self._n = n
                    if sa is not None and sb is not None and n <= _MAX_SIG_NODES:
                        self._sig = (d, sa, sb)
                        self._lv = la + lb
                    else:
                        self._sig = None
                        self._lv = ()
                    return
        sig: list[Any] | None = [d]
        lv: tuple[Any, ...] = ()
        n = 1
        for a in args:
            ta = type(a)
            if ta is Expr:
                a._used = True  # evaluated as part of this one (or this one warns)
                n += a._n
                if sig is not None:
                    s = a._sig
                    if s is None:
                        sig = None
                    else:
                        sig.append(s)
                        lv += a._lv
            elif ta is _Tensor:
                if sig is not None:
                    sig.append(_LEAF)
                    lv += (a,)
            elif sig is not None:
                if (ta is float and a == a and a != 0.0) or ta is int:
                    sig.append((ta, a))
                else:
                    k, more, m = _value_key(a)
                    n += m
                    if k is None:
                        sig = None
                    else:
                        sig.append(k)
                        lv += more
            elif ta is list or ta is tuple:
                n += _mark_used(a)
        if kwargs:
            for name, v in kwargs.items():
                k, more, m = _value_key(v)
                n += m
                if k is None or sig is None:
                    sig = None
                else:
                    sig.append((name, k))
                    lv += more
        if sig is None:  # (the rare path: arrays, user objects ... or a coroutine)
            awaited = forgotten_await(d.name, args, kwargs)
            if awaited is not None:
                raise awaited
        self._d = d
        self._args = args
        self._kwargs = kwargs
        self._used = False
        self._n = n
        if sig is not None and n <= _MAX_SIG_NODES:
            self._sig = tuple(sig)
            self._lv = lv
        else:
            self._sig = None
            self._lv = ()

    def __del__(self, _warn: Callable[..., None] = warnings.warn) -> None:
        # Called for every node: the common case (used) returns after one attribute read.
        try:
            if self._used:
                return
        except AttributeError:  # a construction that raised (a forgotten await): nothing to warn about
            return
        try:
            _warn(f"expression {self!r} was never evaluated (await it)", RuntimeWarning, source=self, stacklevel=1)
        except Exception:  # at interpreter shutdown, or a warning filter set to "error"
            pass

    @property
    def op(self) -> str:
        """The name of the op at the root of this expression."""
        return self._d.name

    def _metadata(self) -> Any:
        # Computed on first read, from the inputs' metadata (no kernel runs on data).
        try:
            return self._meta
        except AttributeError:
            m = self._meta = node_meta(self._d, self._args, self._kwargs, _meta_of, self._nbytes)
            return m

    @property
    def shape(self) -> Shape | None:
        """The shape, with ``None`` where a size is known only at run time (``None`` if unknown)."""
        self._used = True  # looked at (``x[mask].shape`` at a prompt): not "dropped unevaluated"
        m = self._metadata()
        return None if isinstance(m, list) else m[0]

    @property
    def dtype(self) -> np.dtype[Any] | None:
        """The dtype of the result (``None`` if unknown before it runs)."""
        self._used = True
        m = self._metadata()
        return None if isinstance(m, list) else m[1]

    @property
    def device(self) -> str:
        """The device of its tensors (``"/cpu:0"`` for an expression of no tensor)."""
        leaf = self._tensor()
        device: str = "/cpu:0" if leaf is None else leaf.device
        return device

    # Concrete values need the data: an expression has none until evaluated.
    def _needs_await(self, what: str) -> TypeError:
        # The refusal points at the expression: a later "never evaluated" warning would be noise.
        self._used = True
        return TypeError(f"{what} of an expression needs its value: await it first, e.g. {what}(await e)")

    def __int__(self) -> int:
        raise self._needs_await("int")

    def __float__(self) -> float:
        raise self._needs_await("float")

    def __complex__(self) -> complex:
        raise self._needs_await("complex")

    def __index__(self) -> int:
        raise self._needs_await("operator.index")

    def item(self) -> Any:
        """Refused: an expression has no value until evaluated (``(await e).item()``)."""
        self._used = True
        raise TypeError("item() of an expression needs its value: await it first, (await e).item()")

    def tolist(self) -> Any:
        """Refused: an expression has no value until evaluated (``(await e).tolist()``)."""
        self._used = True
        raise TypeError("tolist() of an expression needs its value: await it first, (await e).tolist()")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> NDArray:
        # Without it numpy wraps the expression in a 0-d object array, and
        # assert_allclose(x + 1, ...) compares that instead of failing.
        self._used = True
        raise TypeError("numpy needs the value of an expression: await it first, np.asarray(await e)")

    def __len__(self) -> int:
        shape = self.shape
        if shape == ():
            raise TypeError("len() of a 0-d expression")
        if shape is None or shape[0] is None:
            raise TypeError("len() of an expression whose first size is known only when it runs: await it first")
        return shape[0]

    def __dlpack__(self, **kwargs: Any) -> Any:
        """Refused: an expression has no buffer to share; await it first."""
        self._used = True
        raise TypeError("an expression has no buffer to share: await it first, np.from_dlpack(await e)")

    def __dlpack_device__(self) -> tuple[int, int]:
        """Refused: an expression has no buffer; await it first."""
        self._used = True
        raise TypeError("an expression has no buffer to share: await it first, np.from_dlpack(await e)")

    def _tensor(self) -> Any:
        # The first tensor of the expression (its engine finds the one that evaluates), or
        # None: creation functions of aiotensor.xp read none.
        if self._lv:
            return self._lv[0]
        stack: list[Any] = [self]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            for a in (*node._args, *(node._kwargs or {}).values()):
                for x in a if type(a) in (list, tuple) else (a,):
                    if type(x) is Expr:
                        if id(x) not in seen:
                            seen.add(id(x))
                            stack.append(x)
                    elif isinstance(x, Operand):  # a Tensor: the only other Operand
                        return x
        return None  # no tensor at all (a creation op): the default session evaluates

    def _evaluator(self) -> EngineLike:
        # An engine to ask; it applies the one rule of which session evaluates
        # (_engine/_session_rule.evaluating_engine) to this expression's tensors and the default session.
        leaf = self._tensor()
        if leaf is not None:
            engine: EngineLike = leaf._engine
            return engine
        default = _defaults.get_default_session()
        if default is None:
            raise NoSessionError(
                f"no session to evaluate {self!r}: it reads no tensor. Use `with session.as_default():`,"
                " an InteractiveSession, `await session.run(e)` or `await e.eval(session=...)`"
            )
        return cast("SessionLike", default)._engine

    def __await__(self) -> Generator[Any, None, Any]:  # gives a Tensor
        self._used = True
        # A program that runs inline needs no coroutine: its result is there at once.
        lv = self._lv
        result = (lv[0]._engine if lv else self._evaluator()).evaluate_expr(self)
        if type(result) is CoroutineType:
            result = yield from result.__await__()
        return result

    async def eval(self, session: SessionLike | None = None) -> NDArray:
        """The numpy value, computed in ``session``, else in the session ``await e`` would use, like ``Tensor.eval``."""
        self._used = True
        if session is not None:
            (value,) = await session._engine.run_values([self], "eval")
        else:
            (value,) = await self._evaluator().run_values([self], "eval", explicit=False)
        out: NDArray = value
        return out

    def __bool__(self) -> bool:
        self._used = True  # (as _needs_await)
        raise TypeError(
            "the truth value of an expression needs its data: await it first, bool(await e);"
            " element-wise and/or are & and | (0 < x < 1 is (0 < x) & (x < 1)), as in numpy"
        )

    def __repr__(self) -> str:
        # Shown (echoed at a REPL, printed): the user saw it, so it is not "dropped unevaluated".
        self._used = True
        parts = [_short(a) for a in self._args]
        parts += [f"{k}={_short(v)}" for k, v in (self._kwargs or {}).items() if v is not None]
        m = self._metadata()
        if isinstance(m, list):
            meta = f"{len(m)} results"
        else:
            shape = "?" if m[0] is None else "(" + ", ".join(map(str, m[0])) + ("," if len(m[0]) == 1 else "") + ")"
            meta = f"shape={shape}, dtype={'?' if m[1] is None else m[1]}"
        return f"Expr({self._d.name}({', '.join(parts)}), {meta})"

    def results(self, n: int | None = None) -> list[Expr]:
        """One expression per result of a node with several (``split``): one program computes the node once.

        ``n``: how many (default: as its metadata says; a ``TypeError`` where only a run can tell).
        """
        if self._d.returns == "one":
            raise TypeError(f"{self._d.name} has one result")
        if n is None:
            m = self._metadata()
            if not isinstance(m, list):
                raise TypeError(f"how many results {self._d.name} has is known only when it runs: await it instead")
            n = len(m)
        self._used = True
        return [Expr(item_op, (self, i), None, None) for i in range(n)]


#: Larger expressions are compiled at each evaluation rather than cached: their keys
#: would cost more to build and compare than compiling does.
_MAX_SIG_NODES = 256
#: Where a tensor goes in a signature (which tensor is told apart at evaluation).
_LEAF = ("T",)
#: An argument the fast path of ``Expr.__init__`` leaves to the general loop.
_OTHER = object()
#: Set by ``_tensor`` (a layer above) to ``Tensor``.
_Tensor: type = type(None)


def _meta_of(x: Any) -> Any:
    tx = type(x)
    if tx is Expr:
        return x._metadata()
    if tx is _Tensor:
        return x._shape, x._dtype
    if isinstance(x, np.ndarray | np.generic):
        return x.shape, x.dtype
    return None


def _mark_used(seq: list[Any] | tuple[Any, ...]) -> int:
    n = 0
    for e in seq:
        if type(e) is Expr:
            e._used = True
            n += e._n
    return n


def _value_key(x: Any) -> tuple[Any, tuple[Any, ...], int]:
    """(key by value or None, tensors read, expression nodes) of an argument that is not a plain number."""
    tx = type(x)
    if tx is Expr:
        x._used = True
        return x._sig, x._lv, x._n
    if tx is _Tensor:
        return _LEAF, (x,), 0
    if tx in SCALARS:
        return scalar_key(x), (), 0
    if tx in HASHED_BY_VALUE:
        return (tx, x), (), 0
    if tx is list or tx is tuple:
        keys: list[Any] = [tx]
        lv: tuple[Any, ...] = ()
        n = 0
        for e in x:
            k, more, m = _value_key(e)
            n += m
            if k is None:
                n += _mark_used(x)
                return None, (), n
            keys.append(k)
            lv += more
        return tuple(keys), lv, n
    if tx is slice:
        parts = [_value_key(p)[0] for p in (x.start, x.stop, x.step)]
        return (None if None in parts else (slice, *parts)), (), 0
    if isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)):
        return (type, x), (), 0
    if isinstance(x, np.generic):
        return scalar_key(x), (), 0
    return None, (), 0  # arrays, user objects: told apart only by identity


def _spec_keywords(d: OpDef) -> frozenset[str]:
    # The keyword parameters of an op's spec (``correction`` of std, ``dtype`` of sum).
    found = _KEYWORDS.get(d)
    if found is None:
        found = _KEYWORDS[d] = frozenset(inspect.signature(d.spec).parameters)
    return found


_KEYWORDS: dict[OpDef, frozenset[str]] = {}


def numpy_method(x: OperandMethods, method: str, args: Any, numpy_kwargs: dict[str, Any]) -> Expr:
    """An ndarray-named method (``t.sum(...)``) called with keywords beyond its own: an expression, or numpy's answer.

    Keywords the op itself takes (``t.std(correction=1)``, ``t.sum(dtype=...)``) build the
    expression, as the session method does with them. Others: ``np.mean(t)`` and friends
    call ``t.mean(..., out=None)``: numpy's answer on the buffer (a local tensor is
    readable without suspending, as ``np.asarray(t)`` is).
    """
    d = OPS["permute_dims" if method == "transpose" else method]
    if _spec_keywords(d).issuperset(numpy_kwargs):
        if isinstance(args, dict):
            return Expr(d, *d.spec(x, **args, **numpy_kwargs))
        return Expr(d, *d.spec(x, *args, **numpy_kwargs))
    if type(x) is Expr:
        raise TypeError(f"numpy's {method}() needs data: await the expression first (await e).{method}(...)")
    if isinstance(args, dict):
        result = getattr(np.asarray(x), method)(**args, **numpy_kwargs)
    else:
        result = getattr(np.asarray(x), method)(*args, **numpy_kwargs)
    return cast("Expr", result)  # an ndarray or a numpy scalar: numpy's own result


def _short(x: Any) -> str:
    if type(x) is Expr:
        return f"<{x._d.name}>"
    if isinstance(x, Operand):
        return repr(getattr(x, "name", "?"))
    text = repr(x)
    return text if len(text) <= 30 else f"{type(x).__name__}"
