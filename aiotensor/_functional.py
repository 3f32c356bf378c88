"""Module-level ops: ``await at.add(a, b)`` runs in the session of its tensor arguments.

With no tensor argument (``at.zeros(3)``) an op uses the default session
(``with s.as_default():`` or the open ``InteractiveSession``); with neither it raises
:class:`NoSessionError`. When the default session is a child (``parent=``) of the
tensors' session, the child runs the op and owns the result. Each function is the
session method of the same name.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from ._defaults import get_default_session
from ._errors import NoSessionError
from ._session import AsyncEagerSession
from ._tensor import Tensor

P = ParamSpec("P")
R = TypeVar("R")


def _session_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncEagerSession:
    found: AsyncEagerSession | None = None
    for arg in (*args, *kwargs.values()):
        for item in arg if type(arg) in (list, tuple) else (arg,):
            if isinstance(item, Tensor):
                owner = item.session
                # A child session may read its parent's tensors: prefer the child.
                if found is None or (owner is not found and found in owner._ancestors):
                    found = owner
    default = get_default_session()
    if found is None or (default is not None and found in default._ancestors):
        # No tensor argument, or the default is a child of the tensors' session (a
        # request session reading app weights): the child may read them, and owning
        # the result there keeps it from living as long as the parent.
        found = default
    if found is None:
        raise NoSessionError(
            "no session for this op: pass a tensor argument, use `with session.as_default():`,"
            " or create an InteractiveSession"
        )
    return found


def _module_op(
    method: Callable[Concatenate[AsyncEagerSession, P], Coroutine[Any, Any, R]], name: str
) -> Callable[P, Coroutine[Any, Any, R]]:
    async def op(*args: P.args, **kwargs: P.kwargs) -> R:
        return await method(_session_of(args, kwargs), *args, **kwargs)

    functools.update_wrapper(op, method)
    op.__name__ = op.__qualname__ = name
    op.__module__ = "aiotensor"
    params = list(inspect.signature(method).parameters.values())[1:]
    op.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    del op.__wrapped__  # type: ignore[attr-defined]
    return op


_S = AsyncEagerSession

constant = _module_op(_S.constant, "constant")
asarray = _module_op(_S.asarray, "asarray")
zeros = _module_op(_S.zeros, "zeros")
ones = _module_op(_S.ones, "ones")
full = _module_op(_S.full, "full")
zeros_like = _module_op(_S.zeros_like, "zeros_like")
ones_like = _module_op(_S.ones_like, "ones_like")
arange = _module_op(_S.arange, "arange")
linspace = _module_op(_S.linspace, "linspace")
eye = _module_op(_S.eye, "eye")
random_uniform = _module_op(_S.random_uniform, "random_uniform")
random_normal = _module_op(_S.random_normal, "random_normal")
add = _module_op(_S.add, "add")
subtract = _module_op(_S.subtract, "subtract")
multiply = _module_op(_S.multiply, "multiply")
divide = _module_op(_S.divide, "divide")
floor_divide = _module_op(_S.floor_divide, "floor_divide")
remainder = _module_op(_S.remainder, "remainder")
pow = _module_op(_S.pow, "pow")
maximum = _module_op(_S.maximum, "maximum")
minimum = _module_op(_S.minimum, "minimum")
equal = _module_op(_S.equal, "equal")
not_equal = _module_op(_S.not_equal, "not_equal")
less = _module_op(_S.less, "less")
less_equal = _module_op(_S.less_equal, "less_equal")
greater = _module_op(_S.greater, "greater")
greater_equal = _module_op(_S.greater_equal, "greater_equal")
logical_and = _module_op(_S.logical_and, "logical_and")
logical_or = _module_op(_S.logical_or, "logical_or")
negative = _module_op(_S.negative, "negative")
abs = _module_op(_S.abs, "abs")
sign = _module_op(_S.sign, "sign")
exp = _module_op(_S.exp, "exp")
log = _module_op(_S.log, "log")
log1p = _module_op(_S.log1p, "log1p")
sqrt = _module_op(_S.sqrt, "sqrt")
square = _module_op(_S.square, "square")
sin = _module_op(_S.sin, "sin")
cos = _module_op(_S.cos, "cos")
tanh = _module_op(_S.tanh, "tanh")
sigmoid = _module_op(_S.sigmoid, "sigmoid")
relu = _module_op(_S.relu, "relu")
floor = _module_op(_S.floor, "floor")
ceil = _module_op(_S.ceil, "ceil")
logical_not = _module_op(_S.logical_not, "logical_not")
isnan = _module_op(_S.isnan, "isnan")
isfinite = _module_op(_S.isfinite, "isfinite")
round = _module_op(_S.round, "round")
clip = _module_op(_S.clip, "clip")
where = _module_op(_S.where, "where")
matmul = _module_op(_S.matmul, "matmul")
tensordot = _module_op(_S.tensordot, "tensordot")
einsum = _module_op(_S.einsum, "einsum")
reshape = _module_op(_S.reshape, "reshape")
permute_dims = _module_op(_S.permute_dims, "permute_dims")
expand_dims = _module_op(_S.expand_dims, "expand_dims")
squeeze = _module_op(_S.squeeze, "squeeze")
concat = _module_op(_S.concat, "concat")
stack = _module_op(_S.stack, "stack")
split = _module_op(_S.split, "split")
broadcast_to = _module_op(_S.broadcast_to, "broadcast_to")
astype = _module_op(_S.astype, "astype")
take = _module_op(_S.take, "take")
getitem = _module_op(_S.getitem, "getitem")
sum = _module_op(_S.sum, "sum")
prod = _module_op(_S.prod, "prod")
mean = _module_op(_S.mean, "mean")
max = _module_op(_S.max, "max")
min = _module_op(_S.min, "min")
std = _module_op(_S.std, "std")
var = _module_op(_S.var, "var")
argmax = _module_op(_S.argmax, "argmax")
argmin = _module_op(_S.argmin, "argmin")
softmax = _module_op(_S.softmax, "softmax")
log_softmax = _module_op(_S.log_softmax, "log_softmax")
apply = _module_op(_S.apply, "apply")

__all__ = [
    "abs",
    "add",
    "apply",
    "arange",
    "argmax",
    "argmin",
    "asarray",
    "astype",
    "broadcast_to",
    "ceil",
    "clip",
    "concat",
    "constant",
    "cos",
    "divide",
    "einsum",
    "equal",
    "exp",
    "expand_dims",
    "eye",
    "floor",
    "floor_divide",
    "full",
    "getitem",
    "greater",
    "greater_equal",
    "isfinite",
    "isnan",
    "less",
    "less_equal",
    "linspace",
    "log",
    "log1p",
    "log_softmax",
    "logical_and",
    "logical_not",
    "logical_or",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "multiply",
    "negative",
    "not_equal",
    "ones",
    "ones_like",
    "permute_dims",
    "pow",
    "prod",
    "random_normal",
    "random_uniform",
    "relu",
    "remainder",
    "reshape",
    "round",
    "sigmoid",
    "sign",
    "sin",
    "softmax",
    "split",
    "sqrt",
    "square",
    "squeeze",
    "stack",
    "std",
    "subtract",
    "sum",
    "take",
    "tanh",
    "tensordot",
    "var",
    "where",
    "zeros",
    "zeros_like",
]
