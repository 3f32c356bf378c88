"""What tensors and expressions share: :class:`Operand`, their common base class.

The operators and the methods with numpy's ndarray names are generated from the op
table (``_generated_operand``); what is written here is what they are not: ``T`` and
``mT``, ``ndim`` and ``size`` from the shape, numpy's protocols (a ufunc of tensors
builds an expression, ``__array_namespace__``), ``to_device``, and the refusals of
``__setitem__`` and ``__iter__``. Comparisons are element-wise (``x == 0`` is an
expression, as in every array library); ``hash`` stays by identity, so a tensor still
keys a dict.

Imported through ``_expr`` (which imports it first): ``Operand``'s methods build
``_expr``'s ``Expr``, which inherits ``Operand``, as the generated methods do.
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ._errors import InvalidDeviceError
from ._generated_operand import OperandMethods
from ._meta import Shape
from ._opdef import INTERNAL_OPS, OPS, OpDef

if TYPE_CHECKING:
    from ._expr import Expr

__all__ = ["Operand"]


class Operand(OperandMethods):
    """What tensors and expressions share: operators and ndarray-named methods returning :class:`Expr`.

    The operators and the methods of one op each are generated (``_generated_operand``);
    what is written here is what they are not.
    """

    __slots__ = ()

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Expr:
        """A numpy ufunc of tensors and expressions builds an expression, as operators do (``np.exp(t)``).

        ``array + t`` arrives here too (numpy's operators call ufuncs). A ufunc the op
        table does not have, or one called with ``out=`` and the like, or a method
        (``np.add.reduce``), raises a ``TypeError`` naming the ways that work.
        """
        d = _ufunc_op(ufunc) if method == "__call__" and not kwargs else None
        if d is None:
            what = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
            raise TypeError(
                f"np.{what}{' with ' + ', '.join(kwargs) if kwargs else ''} on a tensor or expression: use"
                " aiotensor.xp's functions (lazy, as operators are), or numpy on the value"
                " (np.asarray(t) of a tensor, await an expression first)"
            )
        return _expr.Expr(d, inputs, None, None)

    # ``==`` builds an expression; hashing stays by identity (as PyTorch's), so tensors key dicts.
    __hash__ = object.__hash__

    @property
    def T(self) -> Expr:
        """The transpose (dimensions reversed), as an expression."""
        return _expr.Expr(_permute_dims, (self, None), None, None)

    @property
    def mT(self) -> Expr:
        """The transpose of the last two dimensions (a stack of matrices), as an expression."""
        return _expr.Expr(_matrix_transpose, (self,), None, None)

    @property
    def ndim(self) -> int | None:
        """The number of dimensions (``None`` if unknown before it runs)."""
        shape = self.shape
        return None if shape is None else len(shape)

    @property
    def size(self) -> int | None:
        """The number of elements (``None`` where a size is known only at run time)."""
        shape = self.shape
        if shape is None or None in shape:
            return None
        return math.prod(cast("tuple[int, ...]", shape))

    @property
    def shape(self) -> Shape | None:  # overridden by Tensor and Expr
        """The shape."""
        raise NotImplementedError

    @property
    def device(self) -> str:  # overridden by Tensor and Expr
        """The device."""
        raise NotImplementedError

    def __array_namespace__(self, /, *, api_version: str | None = None) -> Any:
        """The Array API namespace of tensors and expressions: :mod:`aiotensor.xp`."""
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise ValueError(f"aiotensor.xp implements the Array API 2024.12, not {api_version!r}")
        return importlib.import_module("aiotensor.xp")  # a layer above: see docs/architecture.md

    def to_device(self, device: Any, /, *, stream: int | Any | None = None) -> Operand:
        """This array on ``device``: itself where it already is (a tensor's device is its session's)."""
        if stream is not None:
            raise ValueError("to_device: aiotensor has no streams")
        if device is not None and str(device) not in (self.device, "cpu"):
            raise InvalidDeviceError(
                f"to_device: {self.device!r} to {device!r}: a tensor lives on its session's device;"
                " place ops with `with session.device(...)`"
            )
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError(
            "tensors and expressions are immutable: build the updated array instead, e.g."
            " xp.where(mask, value, x) (aiotensor.xp), or x = expression"
        )

    def __iter__(self) -> Any:
        # Without this, Python would iterate through __getitem__(0), (1), ... forever.
        raise TypeError("an expression is not iterable: await it, or use xp.unstack / session.split")


_UFUNC_OPS: dict[np.ufunc, OpDef] = {}


def _ufunc_op(ufunc: np.ufunc) -> OpDef | None:
    # The op of a numpy ufunc: the element-wise op whose kernel it is, else the op of its
    # name (floor_divide, matmul: ops with kernels of their own and numpy's semantics).
    if not _UFUNC_OPS:
        for op in OPS.values():
            if op.returns == "one" and op.ufunc and isinstance(op.kernel, str):
                u = getattr(np, op.kernel, None)
                if isinstance(u, np.ufunc):
                    _UFUNC_OPS.setdefault(u, op)
    d = _UFUNC_OPS.get(ufunc) or OPS.get(ufunc.__name__)
    return d if d is not None and d.returns == "one" else None


_permute_dims = OPS["permute_dims"]
_matrix_transpose = OPS.get("matrix_transpose") or INTERNAL_OPS["swap_matrix_axes"]


# Last, as in _generated_operand: Operand's methods build _expr's Expr, which inherits
# Operand (_expr imports this module first, so its Expr exists by the time one runs).
from . import _expr  # noqa: E402
