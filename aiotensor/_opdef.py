"""An op, defined once as data: :class:`OpDef`, and the table every surface is derived from.

Each op of the library is one ``@op(...)`` entry in ``_ops/``: a *spec* function whose
signature is the op's public signature and whose body checks the arguments on the
caller's side (the event loop thread) and says what the kernel gets, plus the kernel,
the op's cost class and how many of its leading arguments are tensor values. Session
methods, module-level functions, tensor operators and methods, expression nodes and the
ops of fused functions are all derived from :data:`OPS` (the first three by
``_codegen.py``, as real source with a staleness test, so that type checkers and IDEs
see them; the last two at run time).

Kernels are written against an *array namespace* ``xp`` given by the backend (numpy
for the local and Dask backends): a kernel is either the name of a function of the
namespace (``"add"``) or a function ``fn(xp, *args, **kwargs)``.
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, cast

from . import _kernels

__all__ = [
    "ALIASES",
    "BINARY_OPERATORS",
    "COMPARISON_OPERATORS",
    "INTERNAL_OPS",
    "OPS",
    "UNARY_OPERATORS",
    "Cost",
    "OpDef",
    "Prepared",
    "item_op",
    "namespace",
    "op",
    "op_named",
]

#: What a spec returns: the kernel's positional args, keyword args and the output's
#: size in bytes when it is known before the kernel runs (creation ops), else None.
Prepared = tuple[tuple[Any, ...], dict[str, Any] | None, int | None]


class Cost(enum.Enum):
    """How an op's kernel time grows, for the inline-or-pool estimate (see ``_cost.py``)."""

    MEMORY = "memory"  # bytes touched at memory speed: arithmetic, comparisons, copies
    MATH = "math"  # bytes touched at transcendental speed: exp, log, tanh, std
    DIVMOD = "divmod"  # bytes touched at the speed of float floor division and remainder (~11 ns an element)
    SPECIAL = "special"  # bytes touched at the speed of a special function built of numpy steps (erf: ~5 ns a byte)
    INDEX = "index"  # fancy indexing
    PRODUCT = "product"  # flops: matmul, tensordot, einsum
    CREATE = "create"  # creation ops: output bytes known before the kernel runs
    UNKNOWN = "unknown"  # never inlined (apply, anything new)

    # Members are singletons compared by identity: hash them so too. Enum's own hash is
    # a Python method (~100 ns), paid by every cost-table lookup of an op's estimate.
    __hash__ = object.__hash__


class OpDef:
    """One op: its spec (signature, checks, docstring), kernel and cost class."""

    __slots__ = (
        "_np_kernel",
        "blas",
        "cost",
        "data",
        "kernel",
        "label",
        "name",
        "plain",
        "result",
        "returns",
        "spec",
        "ufunc",
        "user",
    )

    def __init__(
        self,
        spec: Callable[..., Prepared],
        kernel: str | Callable[..., Any],
        *,
        data: int,
        cost: Cost,
        plain: bool,
        returns: Literal["one", "list", "any"],
        blas: bool,
        user: bool,
        ufunc: bool = False,
        result: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.name: str = spec.__name__.rstrip("_")
        #: What an unnamed result of the op is labelled with (its name is made from it when read).
        self.label = (self.name, -1)
        self.spec = spec
        self.kernel = kernel
        #: Leading positional args that are tensor values (non-tensors are checked numeric).
        self.data = data
        self.cost = cost
        #: The spec checks nothing: the public args go to the kernel as they are.
        self.plain = plain
        self.returns = returns
        #: The kernel calls BLAS (the local backend gates those; see ``_blas``).
        self.blas = blas
        #: The kernel is the user's (``apply``): its errors are KernelError, not InvalidArgumentError.
        self.user = user
        #: The kernel is one element-wise ufunc over the data args, called without keyword
        #: args: a backend may split a large one across workers (``_split``).
        self.ufunc = ufunc
        #: What a ``returns="list"`` op gives instead of the list of its results: ``tuple``,
        #: or a named tuple's ``_make`` (``unique_all`` gives ``UniqueAllResult``).
        self.result = result
        self._np_kernel: Callable[..., Any] | None = None

    @property
    def doc(self) -> str | None:
        """The op's docstring (its spec's)."""
        return self.spec.__doc__

    def prepare(self, *args: Any, **kwargs: Any) -> Prepared:
        """Check the public arguments; what the kernel gets (on the caller's thread)."""
        if self.plain:
            return args, kwargs or None, None
        return self.spec(*args, **kwargs)

    def kernel_for(self, xp: ModuleType) -> Callable[..., Any]:
        """The kernel as a plain callable computing with namespace ``xp``."""
        if xp.__name__ == "numpy":
            k = self._np_kernel
            if k is None:
                k = self._np_kernel = self._resolve(xp)
            return k
        return self._resolve(xp)

    def _resolve(self, xp: ModuleType) -> Callable[..., Any]:
        kernel = self.kernel
        if isinstance(kernel, str):
            fn: Callable[..., Any] = getattr(xp, kernel)
            return fn
        return functools.partial(kernel, xp)

    @property
    def elementwise(self) -> bool:
        """A plain element-wise op of one output whose args are all data (the engine's lean path)."""
        code = self.spec.__code__
        return (
            self.plain
            and not self.user
            and self.returns == "one"
            and self.cost in (Cost.MEMORY, Cost.MATH, Cost.DIVMOD)
            and code.co_argcount == self.data
            and not code.co_kwonlyargcount
        )

    @property
    def lean(self) -> bool:
        """An op the engine's lean path takes: element-wise, or a product of two data args (``matmul``).

        Plain (the spec checks nothing), one output, every arg data, no keyword args, and a
        cost the lean path estimates from its arguments' shapes alone: an element-wise one
        (``elementwise``'s, or a special function's, ``erf``: the cost model broadcasts
        both) or a product. What it checks is numpy's to check (shapes, dtypes), as on the
        general path.
        """
        code = self.spec.__code__
        return (
            self.plain
            and not self.user
            and self.returns == "one"
            and code.co_argcount == self.data
            and not code.co_kwonlyargcount
            and (
                self.cost in (Cost.MEMORY, Cost.MATH, Cost.DIVMOD, Cost.SPECIAL)
                or (self.cost is Cost.PRODUCT and self.data == 2)
            )
        )

    def __reduce__(self) -> tuple[Callable[[str], OpDef], tuple[str]]:
        # Pickled by name (backends that ship kernels to other processes find it there).
        return op_named, (self.name,)

    def __repr__(self) -> str:
        return f"<op {self.name}>"


#: Other names of an op: the same op under a numpy-familiar name (session methods, module
#: functions and the ``ops`` of fused functions all have them).
ALIASES = {"asarray": "constant"}
#: The binary operators of tensors, expressions and fused values: (dunder stem, op), each
#: with its reflected form. An operator exists where its op is in :data:`OPS` (the
#: surfaces skip the others), so a new op of the standard's name brings its operator.
BINARY_OPERATORS = (
    ("add", "add"),
    ("sub", "subtract"),
    ("mul", "multiply"),
    ("truediv", "divide"),
    ("floordiv", "floor_divide"),
    ("mod", "remainder"),
    ("pow", "pow"),
    ("matmul", "matmul"),
    ("and", "bitwise_and"),
    ("or", "bitwise_or"),
    ("xor", "bitwise_xor"),
    ("lshift", "bitwise_left_shift"),
    ("rshift", "bitwise_right_shift"),
)
#: The element-wise comparisons (no reflected forms: Python swaps ``<`` and ``>`` itself).
#: ``==`` compares element-wise as every array library does; ``hash`` stays by identity.
COMPARISON_OPERATORS = (
    ("eq", "equal"),
    ("ne", "not_equal"),
    ("lt", "less"),
    ("le", "less_equal"),
    ("gt", "greater"),
    ("ge", "greater_equal"),
)
#: The unary operators: (dunder stem, op).
UNARY_OPERATORS = (("neg", "negative"), ("abs", "abs"), ("invert", "bitwise_invert"), ("pos", "positive"))

#: Every op of the library, by name, in definition order.
OPS: dict[str, OpDef] = {}
#: Ops the engine runs that are no public surface (no session method, no function):
#: e.g. :data:`item_op`, which picks one result of a multi-output node.
INTERNAL_OPS: dict[str, OpDef] = {}


def op_named(name: str) -> OpDef:
    """The op called ``name`` (how an :class:`OpDef` unpickles)."""
    if not OPS:  # in a fresh worker process: the families register on import
        importlib.import_module("aiotensor._ops")
    d = OPS.get(name)
    return INTERNAL_OPS[name] if d is None else d


def op(
    kernel: str | Callable[..., Any],
    *,
    data: int = 0,
    cost: Cost = Cost.UNKNOWN,
    plain: bool = False,
    returns: Literal["one", "list", "any"] = "one",
    blas: bool = False,
    user: bool = False,
    ufunc: bool = False,
    result: Callable[[list[Any]], Any] | None = None,
    internal: bool = False,
) -> Callable[[Callable[..., Prepared | None]], OpDef]:
    """Define an op from its spec function (see the module docstring); ``internal``: no public surface."""

    def define(spec: Callable[..., Prepared | None]) -> OpDef:
        # A plain op's spec only declares the signature (it returns None and is never called for args).
        d = OpDef(
            cast("Callable[..., Prepared]", spec),
            kernel,
            data=data,
            cost=cost,
            plain=plain,
            returns=returns,
            blas=blas,
            user=user,
            ufunc=ufunc,
            result=result,
        )
        _kernels.ARG_NAMES[d.name] = lambda: list(inspect.signature(d.spec).parameters)
        table = INTERNAL_OPS if internal else OPS
        if d.name in OPS or d.name in INTERNAL_OPS:
            raise RuntimeError(f"op {d.name!r} is defined twice")
        table[d.name] = d
        return d

    return define


_namespaces: dict[str, ModuleType] = {}


def namespace(name: str) -> ModuleType:
    """The array namespace module called ``name`` (``"numpy"``), imported once."""
    xp = _namespaces.get(name)
    if xp is None:
        xp = _namespaces[name] = importlib.import_module(name)
    return xp


def _k_item(xp: Any, results: Any, index: int) -> Any:
    return results[index]


@op(_k_item, cost=Cost.MEMORY, internal=True)
def pick(results: Any, index: int, /) -> Prepared:
    """Result ``index`` of a node with several results (``split``, ``unique_all``, ``linalg.svd``).

    One expression per result, all reading the one node: a program computes it once.
    """
    return (results, index), None, None


item_op = pick


def _k_swap(xp: Any, x: Any) -> Any:
    return xp.swapaxes(xp.asarray(x), -1, -2)


@op(_k_swap, data=1, cost=Cost.MEMORY, internal=True)
def swap_matrix_axes(x: Any, /) -> Prepared:
    """The last two dimensions swapped (``x.mT`` until the table has ``matrix_transpose``)."""
    return (x,), None, None
