"""``aiotensor.xp.linalg``: the Array API's linear algebra extension, lazy as the main namespace.

Every function returns an expression (several, as a named tuple, for ``svd``, ``eigh``,
``qr`` and ``slogdet``); ``matmul``, ``tensordot``, ``vecdot`` and ``matrix_transpose``
are the main namespace's functions. A function whose op the table does not have yet
(``svd``, ``eigh``, ``qr`` and ``slogdet`` need the ops of those names) is absent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .._opdef import OPS
from . import _generated_main, _hand
from ._generated_linalg import *  # noqa: F403 -- the one-op functions, listed in its __all__
from ._generated_linalg import __all__ as _generated
from ._node import several

if TYPE_CHECKING:
    from .._expr import Expr
    from .._types import TensorLike


class SVDResult(NamedTuple):
    """``svd``'s results: ``U @ diag(S) @ Vh`` is ``x``."""

    U: Expr
    S: Expr
    Vh: Expr


class EighResult(NamedTuple):
    """``eigh``'s results."""

    eigenvalues: Expr
    eigenvectors: Expr


class QRResult(NamedTuple):
    """``qr``'s results."""

    Q: Expr
    R: Expr


class SlogdetResult(NamedTuple):
    """``slogdet``'s results: ``sign * exp(logabsdet)`` is the determinant."""

    sign: Expr
    logabsdet: Expr


def svd(x: TensorLike, /, *, full_matrices: bool = True) -> SVDResult:
    """The singular value decomposition of (a stack of) matrices ``x``."""
    kwargs = None if full_matrices else {"full_matrices": False}
    return SVDResult(*several(OPS["svd"], (x,), kwargs, 3))


def eigh(x: TensorLike, /) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors of (a stack of) symmetric or Hermitian matrices."""
    return EighResult(*several(OPS["eigh"], (x,), None, 2))


def qr(x: TensorLike, /, *, mode: str = "reduced") -> QRResult:
    """The QR decomposition of (a stack of) matrices ``x``."""
    kwargs = None if mode == "reduced" else {"mode": mode}
    return QRResult(*several(OPS["qr"], (x,), kwargs, 2))


def slogdet(x: TensorLike, /) -> SlogdetResult:
    """The sign and the natural log of the absolute value of the determinant."""
    return SlogdetResult(*several(OPS["slogdet"], (x,), None, 2))


matrix_transpose = _hand.matrix_transpose
_SHARED = [n for n in ("matmul", "tensordot", "vecdot") if n in _generated_main.__all__]
for _shared in _SHARED:
    globals()[_shared] = getattr(_generated_main, _shared)

__all__ = sorted(
    [
        *_generated,
        *_SHARED,
        "matrix_transpose",
        *[n for n in ("svd", "eigh", "qr", "slogdet") if n in OPS],
    ]
)
for _name in ("svd", "eigh", "qr", "slogdet"):
    if _name not in OPS:
        del globals()[_name]  # absent until the op table has the op
