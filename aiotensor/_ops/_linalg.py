"""The Array API standard's ``linalg`` extension (2024.12), as ops.

Semantics and dtype rules follow the standard and its reference implementation
(``array_api_strict.linalg``): the decompositions and solvers take floating-point input
only (numpy would upcast integers), matrices are the last two axes of a stack, and
``solve`` treats ``x2`` as a vector only when it is 1-d. ``matmul``, ``tensordot``,
``matrix_transpose`` and ``vecdot`` are the main namespace's ops (the namespace maps
``linalg.X`` to them).

Ops returning several arrays (``eigh``, ``qr``, ``slogdet``, ``svd``) return a list of
tensors in the order of the standard's named tuple; :data:`RESULTS` names that tuple for
each, so a namespace can return ``RESULTS[name](*tensors)``.

Errors: a bad dtype or shape raises in the kernel (TypeError, ValueError), which the
engine turns into InvalidArgumentError naming the op and its inputs; numpy's
``LinAlgError`` (a singular matrix to ``inv``/``solve``, a matrix that is not positive
definite to ``cholesky``, no convergence) becomes a ValueError saying what was wrong
with the data, so it too is an InvalidArgumentError.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import numpy as np

from .._errors import InvalidArgumentError
from .._opdef import Cost, Prepared, op
from ._checks import check_dtype, integer, ints, real

if TYPE_CHECKING:
    from .._types import DTypeLike, TensorLike

__all__ = ["RESULTS", "EighResult", "QRResult", "SVDResult", "SlogdetResult"]

#: What the named tuples hold: tensors from ops, fused values inside fused functions.
T = TypeVar("T")

P, M = Cost.PRODUCT, Cost.MEMORY


class EighResult(NamedTuple, Generic[T]):
    """``eigh``'s result: eigenvalues (ascending) and eigenvectors (columns)."""

    eigenvalues: T
    eigenvectors: T


class QRResult(NamedTuple, Generic[T]):
    """``qr``'s result: ``Q`` with orthonormal columns and upper-triangular ``R``."""

    Q: T
    R: T


class SlogdetResult(NamedTuple, Generic[T]):
    """``slogdet``'s result: the sign (or phase) of the determinant and the log of its absolute value."""

    sign: T
    logabsdet: T


class SVDResult(NamedTuple, Generic[T]):
    """``svd``'s result: ``U``, the singular values ``S`` (descending) and ``Vh``."""

    U: T
    S: T
    Vh: T


#: The standard's named tuple of each multi-output op, its fields in the op's list order.
RESULTS: dict[str, type[tuple[Any, ...]]] = {
    "eigh": EighResult,
    "qr": QRResult,
    "slogdet": SlogdetResult,
    "svd": SVDResult,
}

# What a LinAlgError of numpy means, by op.
_LINALG_ERRORS = {
    "inv": "singular matrix: it has no inverse",
    "solve": "singular matrix: the system has no unique solution",
    "cholesky": "not positive definite: no Cholesky factor exists",
    "matrix_power": "singular matrix: a negative power needs its inverse",
}


@contextlib.contextmanager
def _linalg_errors(opname: str) -> Iterator[None]:
    try:
        yield
    except np.linalg.LinAlgError as exc:
        what = _LINALG_ERRORS.get(opname, "the decomposition failed")
        raise ValueError(f"{what} (numpy.linalg: {exc})") from exc


def _array(xp: Any, x: Any, *, floating: bool = False, numeric: bool = False) -> Any:
    a = xp.asarray(x)
    if floating and a.dtype.kind not in "fc":
        raise TypeError(f"needs a floating-point input (float32, float64, complex64, complex128), got {a.dtype}")
    if numeric and a.dtype.kind not in "iufc":
        raise TypeError(f"needs a numeric (not bool) input, got {a.dtype}")
    return a


def _matrices(xp: Any, x: Any, *, square: bool, floating: bool = True) -> Any:
    a = _array(xp, x, floating=floating)
    if a.ndim < 2:
        raise ValueError(f"needs a matrix or a stack of matrices (at least 2 dimensions), got shape {a.shape}")
    if square and a.shape[-1] != a.shape[-2]:
        raise ValueError(f"needs square matrices (..., M, M), got shape {a.shape}")
    return a


def _k_cholesky(xp: Any, x: Any, upper: bool) -> Any:
    a = _matrices(xp, x, square=True)
    with _linalg_errors("cholesky"):
        low = xp.linalg.cholesky(a)
    if not upper:
        return low
    u = xp.swapaxes(low, -1, -2)
    return xp.conj(u) if u.dtype.kind == "c" else u


def _k_det(xp: Any, x: Any) -> Any:
    return xp.linalg.det(_matrices(xp, x, square=True))


def _k_slogdet(xp: Any, x: Any) -> list[Any]:
    sign, logabs = xp.linalg.slogdet(_matrices(xp, x, square=True))
    return [sign, logabs]


def _k_inv(xp: Any, x: Any) -> Any:
    a = _matrices(xp, x, square=True)
    with _linalg_errors("inv"):
        return xp.linalg.inv(a)


def _k_eigh(xp: Any, x: Any) -> list[Any]:
    a = _matrices(xp, x, square=True)
    with _linalg_errors("eigh"):
        w, v = xp.linalg.eigh(a)
    return [w, v]


def _k_eigvalsh(xp: Any, x: Any) -> Any:
    a = _matrices(xp, x, square=True)
    with _linalg_errors("eigvalsh"):
        return xp.linalg.eigvalsh(a)


def _k_qr(xp: Any, x: Any, mode: str) -> list[Any]:
    a = _matrices(xp, x, square=False)
    with _linalg_errors("qr"):
        q, r = xp.linalg.qr(a, mode=mode)
    return [q, r]


def _k_svd(xp: Any, x: Any, full_matrices: bool) -> list[Any]:
    a = _matrices(xp, x, square=False)
    with _linalg_errors("svd"):
        u, s, vh = xp.linalg.svd(a, full_matrices=full_matrices)
    return [u, s, vh]


def _k_svdvals(xp: Any, x: Any) -> Any:
    a = _matrices(xp, x, square=False)
    with _linalg_errors("svdvals"):
        return xp.linalg.svd(a, compute_uv=False)


def _k_solve(xp: Any, x1: Any, x2: Any) -> Any:
    a = _matrices(xp, x1, square=True)
    b = _array(xp, x2, floating=True)
    if b.ndim == 0:
        raise ValueError("x2 must be a vector (M,) or a stack of matrices (..., M, K), got a 0-d array")
    if b.ndim == 1:  # the standard's rule (numpy 2's too): only a 1-d x2 is a vector
        if b.shape[0] != a.shape[-1]:
            raise ValueError(f"x2 of shape {b.shape} does not match matrices of shape {a.shape}")
    elif b.shape[-2] != a.shape[-1]:
        raise ValueError(f"x2 of shape {b.shape} does not match matrices of shape {a.shape}")
    with _linalg_errors("solve"):
        return xp.linalg.solve(a, b)


def _rtol(xp: Any, shape: tuple[int, ...], dtype: Any, rtol: Any) -> Any:
    """The standard's relative tolerance for matrices of ``shape``: ``max(M, N) * eps`` unless given."""
    if rtol is None:
        return max(shape[-2:]) * xp.finfo(dtype).eps
    r = xp.asarray(rtol)
    if r.dtype.kind not in "iuf":
        raise TypeError(f"rtol must be a real number or array, got {r.dtype}")
    return r


def _k_matrix_rank(xp: Any, x: Any, rtol: Any) -> Any:
    a = _matrices(xp, x, square=False, floating=False)
    if a.dtype.kind not in "iufc":
        raise TypeError(f"needs a numeric (not bool) input, got {a.dtype}")
    if 0 in a.shape[-2:]:
        return xp.zeros(a.shape[:-2], dtype=xp.int64)
    with _linalg_errors("matrix_rank"):
        s = xp.linalg.svd(a, compute_uv=False)
    tol = s.max(axis=-1, keepdims=True) * xp.asarray(_rtol(xp, a.shape, s.dtype, rtol))[..., None]
    return xp.count_nonzero(s > tol, axis=-1).astype(xp.int64)


def _k_pinv(xp: Any, x: Any, rtol: Any) -> Any:
    a = _matrices(xp, x, square=False)
    with _linalg_errors("pinv"):
        return xp.linalg.pinv(a, rcond=_rtol(xp, a.shape, a.dtype, rtol))


def _k_matrix_power(xp: Any, x: Any, n: int) -> Any:
    a = _matrices(xp, x, square=True)
    with _linalg_errors("matrix_power"):
        return xp.linalg.matrix_power(a, n)


def _k_matrix_norm(xp: Any, x: Any, keepdims: bool, ord: Any) -> Any:
    a = _matrices(xp, x, square=False)
    real = a.real.dtype if a.dtype.kind == "c" else a.dtype
    if a.size == 0:  # numpy's norm refuses empty matrices; the norm of nothing is 0
        shape = (*a.shape[:-2], 1, 1) if keepdims else a.shape[:-2]
        return xp.zeros(shape, dtype=real)
    with _linalg_errors("matrix_norm"):
        return xp.asarray(xp.linalg.norm(a, ord=ord, axis=(-2, -1), keepdims=keepdims)).astype(real, copy=False)


def _k_vector_norm(xp: Any, x: Any, axis: Any, keepdims: bool, ord: float) -> Any:
    a = _array(xp, x, floating=True)
    real = a.real.dtype if a.dtype.kind == "c" else a.dtype
    ndim = a.ndim
    # numpy's norm takes one axis for a vector norm: move the reduced axes first and flatten them.
    axes = tuple(range(ndim)) if axis is None else np.lib.array_utils.normalize_axis_tuple(axis, ndim)
    rest = [i for i in range(ndim) if i not in axes]
    flat = xp.transpose(a, (*axes, *rest)).reshape((-1, *[a.shape[i] for i in rest]))
    out = xp.asarray(xp.linalg.norm(flat, ord=ord, axis=0)).astype(real, copy=False)
    if keepdims:
        out = out.reshape([1 if i in axes else a.shape[i] for i in range(ndim)])
    return out


def _k_trace(xp: Any, x: Any, offset: int, dtype: Any) -> Any:
    a = _matrices(xp, x, square=False, floating=False)
    if a.dtype.kind not in "iufc":
        raise TypeError(f"needs a numeric (not bool) input, got {a.dtype}")
    return xp.asarray(xp.trace(a, offset=offset, axis1=-2, axis2=-1, dtype=dtype))


def _k_diagonal(xp: Any, x: Any, offset: int) -> Any:
    a = _matrices(xp, x, square=False, floating=False)
    return xp.diagonal(a, offset=offset, axis1=-2, axis2=-1)


def _k_cross(xp: Any, x1: Any, x2: Any, axis: int) -> Any:
    a, b = _array(xp, x1, numeric=True), _array(xp, x2, numeric=True)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("needs arrays of at least 1 dimension")
    if not min(-1, -a.ndim, -b.ndim) <= axis <= -1:
        raise ValueError(f"axis must be negative and within both inputs (-{min(a.ndim, b.ndim)} to -1), got {axis}")
    if a.shape[axis] != 3 or b.shape[axis] != 3:
        raise ValueError(f"the vectors along axis {axis} must have 3 elements, got shapes {a.shape} and {b.shape}")
    return xp.cross(a, b, axis=axis)


def _k_outer(xp: Any, x1: Any, x2: Any) -> Any:
    a, b = _array(xp, x1, numeric=True), _array(xp, x2, numeric=True)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"needs two 1-d arrays, got shapes {a.shape} and {b.shape}")
    return xp.multiply.outer(a, b)


@op(_k_cholesky, data=1, cost=P, blas=True)
def cholesky(x: TensorLike, /, *, upper: bool = False) -> Prepared:
    """Cholesky factor of Hermitian positive-definite matrices: ``L`` with ``x = L @ L^H`` (``U = L^H`` if ``upper``).

    As ``array_api_strict.linalg.cholesky`` (``numpy.linalg.cholesky`` plus ``upper``).
    """
    return (x, bool(upper)), None, None


@op(_k_det, data=1, cost=P, blas=True)
def det(x: TensorLike, /) -> Prepared:
    """Determinant of each square matrix of the stack (``numpy.linalg.det``)."""
    return (x,), None, None


@op(_k_slogdet, data=1, cost=P, blas=True, returns="list", result=SlogdetResult._make)
def slogdet(x: TensorLike, /) -> Prepared:
    """``[sign, logabsdet]`` of each square matrix's determinant (``numpy.linalg.slogdet``).

    The fields of the standard's ``SlogdetResult``, in that order.
    """
    return (x,), None, None


@op(_k_inv, data=1, cost=P, blas=True)
def inv(x: TensorLike, /) -> Prepared:
    """Inverse of each square matrix of the stack (``numpy.linalg.inv``); a singular one is an InvalidArgumentError."""
    return (x,), None, None


@op(_k_eigh, data=1, cost=P, blas=True, returns="list", result=EighResult._make)
def eigh(x: TensorLike, /) -> Prepared:
    """``[eigenvalues, eigenvectors]`` of Hermitian (symmetric) matrices (``numpy.linalg.eigh``).

    The fields of the standard's ``EighResult``, in that order: eigenvalues ascending,
    eigenvectors as columns. Only the lower triangle is read.
    """
    return (x,), None, None


@op(_k_eigvalsh, data=1, cost=P, blas=True)
def eigvalsh(x: TensorLike, /) -> Prepared:
    """Eigenvalues (ascending) of Hermitian (symmetric) matrices (``numpy.linalg.eigvalsh``)."""
    return (x,), None, None


@op(_k_qr, data=1, cost=P, blas=True, returns="list", result=QRResult._make)
def qr(x: TensorLike, /, *, mode: str = "reduced") -> Prepared:
    """``[Q, R]``, the QR decomposition of each matrix (``numpy.linalg.qr``); the standard's ``QRResult`` fields."""
    if mode not in ("reduced", "complete"):
        raise InvalidArgumentError(f"qr: mode must be 'reduced' or 'complete', got {mode!r}")
    return (x, mode), None, None


@op(_k_svd, data=1, cost=P, blas=True, returns="list", result=SVDResult._make)
def svd(x: TensorLike, /, *, full_matrices: bool = True) -> Prepared:
    """``[U, S, Vh]`` with ``x = U @ diag(S) @ Vh`` (``numpy.linalg.svd``); the standard's ``SVDResult`` fields."""
    return (x, bool(full_matrices)), None, None


@op(_k_svdvals, data=1, cost=P, blas=True)
def svdvals(x: TensorLike, /) -> Prepared:
    """Singular values of each matrix, descending (``numpy.linalg.svd(x, compute_uv=False)``)."""
    return (x,), None, None


@op(_k_solve, data=2, cost=P, blas=True)
def solve(x1: TensorLike, x2: TensorLike, /) -> Prepared:
    """The solution ``x`` of ``x1 @ x = x2`` for square ``x1`` (``numpy.linalg.solve``).

    ``x2`` is a vector only when it is 1-d (shape ``(M,)``); otherwise it is a stack of
    ``(M, K)`` matrices, broadcast against ``x1``'s stack. A singular ``x1`` is an
    InvalidArgumentError.
    """
    return (x1, x2), None, None


@op(_k_matrix_rank, data=1, cost=P, blas=True)
def matrix_rank(x: TensorLike, /, *, rtol: TensorLike | None = None) -> Prepared:
    """Rank of each matrix: its singular values above ``rtol`` times the largest (default ``max(M, N) * eps``).

    As ``array_api_strict.linalg.matrix_rank`` (numpy's ``tol`` is absolute).
    """
    return (x, rtol), None, None


@op(_k_pinv, data=1, cost=P, blas=True)
def pinv(x: TensorLike, /, *, rtol: TensorLike | None = None) -> Prepared:
    """Moore-Penrose pseudo-inverse of each matrix (``numpy.linalg.pinv``).

    Singular values at most ``rtol`` times the largest are treated as zero (default
    ``max(M, N) * eps``, the standard's).
    """
    return (x, rtol), None, None


@op(_k_matrix_power, data=1, cost=P, blas=True)
def matrix_power(x: TensorLike, n: int, /) -> Prepared:
    """Each square matrix raised to the integer power ``n`` (``numpy.linalg.matrix_power``; ``n < 0`` inverts)."""
    return (x, integer(n, "n", "matrix_power")), None, None


def _matrix_ord(ord: Any) -> Any:
    if ord is None:
        return "fro"
    if isinstance(ord, str):
        if ord in ("fro", "nuc"):
            return ord
    elif (
        isinstance(ord, int | float | np.integer | np.floating)
        and not isinstance(ord, bool)
        and float(ord) in (1.0, -1.0, 2.0, -2.0, np.inf, -np.inf)
    ):
        return float(ord) if abs(float(ord)) == np.inf else int(ord)
    raise InvalidArgumentError(
        f"matrix_norm: ord must be one of 'fro', 'nuc', 1, -1, 2, -2, inf, -inf; got {ord!r:.40}"
    )


@op(_k_matrix_norm, data=1, cost=P, blas=True)
def matrix_norm(x: TensorLike, /, *, keepdims: bool = False, ord: float | str | None = "fro") -> Prepared:
    """Norm of each matrix (the last two axes): ``'fro'``, ``'nuc'``, ``1``, ``-1``, ``2``, ``-2``, ``inf``, ``-inf``.

    As ``numpy.linalg.norm(x, ord, axis=(-2, -1))``; the result is real.
    """
    return (x, bool(keepdims), _matrix_ord(ord)), None, None


@op(_k_vector_norm, data=1, cost=Cost.MATH)
def vector_norm(
    x: TensorLike, /, *, axis: int | tuple[int, ...] | None = None, keepdims: bool = False, ord: float = 2
) -> Prepared:
    """The ``ord``-norm of the vectors along ``axis`` (all axes as one vector if ``None``); the result is real.

    ``ord``: any real, ``inf`` (max abs), ``-inf`` (min abs), ``0`` (count of non-zeros).
    As ``array_api_strict.linalg.vector_norm``.
    """
    order = real(ord, "ord", "vector_norm")
    return (x, None if axis is None else ints(axis, "axis", "vector_norm"), bool(keepdims), order), None, None


@op(_k_trace, data=1, cost=M)
def trace(x: TensorLike, /, *, offset: int = 0, dtype: DTypeLike | None = None) -> Prepared:
    """Sum of diagonal ``offset`` of each matrix (the last two axes), as ``numpy.trace(x, offset, -2, -1)``."""
    return (x, integer(offset, "offset", "trace"), check_dtype(dtype, "trace")), None, None


@op(_k_diagonal, data=1, cost=M)
def diagonal(x: TensorLike, /, *, offset: int = 0) -> Prepared:
    """Diagonal ``offset`` of each matrix (the last two axes), as ``numpy.diagonal(x, offset, -2, -1)``."""
    return (x, integer(offset, "offset", "diagonal")), None, None


@op(_k_cross, data=2, cost=M)
def cross(x1: TensorLike, x2: TensorLike, /, *, axis: int = -1) -> Prepared:
    """Cross product of 3-element vectors along ``axis`` (negative, as the standard asks), as ``numpy.cross``."""
    return (x1, x2, integer(axis, "axis", "cross")), None, None


@op(_k_outer, data=2, cost=P)
def outer(x1: TensorLike, x2: TensorLike, /) -> Prepared:
    """Outer product of two 1-d tensors, ``x1[:, None] * x2[None, :]`` (``numpy.outer``)."""
    return (x1, x2), None, None
