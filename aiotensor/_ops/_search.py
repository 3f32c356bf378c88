"""Sorting, searching and set functions of the Array API standard.

``nonzero`` and the ``unique_*`` functions have output shapes that depend on the data:
their cost class is ``UNKNOWN`` (never estimated, so never inlined), and in an
expression they are one step of the program like any other. The ``unique_*`` functions
give the standard's named tuples (:class:`UniqueAllResult` ...), ``nonzero`` a tuple
of index tensors, one per dimension.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from .._errors import InvalidArgumentError
from .._opdef import Cost, Prepared, op

if TYPE_CHECKING:
    from .._types import TensorLike

__all__ = ["UniqueAllResult", "UniqueCountsResult", "UniqueInverseResult"]

#: A sort costs more per byte than a pass over memory: about what floor division does
#: per element at the sizes that run inline (n log n comparisons).
SORT = Cost.DIVMOD
#: What the named tuples hold: tensors from ops, fused values inside fused functions.
T = TypeVar("T")


class UniqueAllResult(NamedTuple, Generic[T]):
    """What ``unique_all`` gives: the unique values, first indices, inverse indices and counts."""

    values: T
    indices: T
    inverse_indices: T
    counts: T


class UniqueCountsResult(NamedTuple, Generic[T]):
    """What ``unique_counts`` gives: the unique values and how often each occurs."""

    values: T
    counts: T


class UniqueInverseResult(NamedTuple, Generic[T]):
    """What ``unique_inverse`` gives: the unique values and, for each element, its value's index."""

    values: T
    inverse_indices: T


def _k_sort(xp: Any, x: Any, axis: int, descending: bool, stable: bool) -> Any:
    out = xp.sort(x, axis=axis, kind="stable" if stable else "quicksort")
    return xp.flip(out, axis=axis) if descending else out


def _k_argsort(xp: Any, x: Any, axis: int, descending: bool, stable: bool) -> Any:
    kind = "stable" if stable else "quicksort"
    x = xp.asarray(x)
    if not descending:
        return xp.argsort(x, axis=axis, kind=kind)
    # Equal elements keep their order in a stable descending sort: sort the reversed
    # input ascending, then reverse back and map the indices (as array_api_strict does).
    out = xp.flip(xp.argsort(xp.flip(x, axis=axis), axis=axis, kind=kind), axis=axis)
    return (x.shape[axis] - 1) - out


def _k_searchsorted(xp: Any, x1: Any, x2: Any, side: str, sorter: Any) -> Any:
    x1 = xp.asarray(x1)
    if x1.ndim != 1:
        raise ValueError(f"x1 must be 1-d, got {x1.ndim}-d")
    return xp.asarray(xp.searchsorted(x1, x2, side=side, sorter=sorter))


def _k_nonzero(xp: Any, x: Any) -> tuple[Any, ...]:
    return tuple(xp.nonzero(x))


#: What ``np.unique`` returns for each function (values first).
_UNIQUE_PARTS = {
    "unique_all": ("return_index", "return_inverse", "return_counts"),
    "unique_counts": ("return_counts",),
    "unique_inverse": ("return_inverse",),
    "unique_values": (),
}


def _k_unique(xp: Any, x: Any, fn: str) -> Any:
    # np.unique sorts (numpy 2's unique_values may not, for integers), and equal_nan=False
    # keeps each NaN a value of its own, as the standard says (and array_api_strict does).
    x = xp.asarray(x)
    parts = _UNIQUE_PARTS[fn]
    out = xp.unique(x, equal_nan=False, **dict.fromkeys(parts, True))
    if not parts:
        return out
    out = list(out)
    if "return_inverse" in parts:
        i = parts.index("return_inverse") + 1
        out[i] = out[i].reshape(x.shape)
    return out


def _flag(value: Any, what: str, op: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{op}: {what} must be a bool, got {value!r:.60}")
    return value


@op(_k_sort, data=1, cost=SORT)
def sort(x: TensorLike, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Prepared:
    """``x`` sorted along ``axis`` (NaN last ascending, first descending; ``stable`` keeps ties in order)."""
    return (x, axis, _flag(descending, "descending", "sort"), _flag(stable, "stable", "sort")), None, None


@op(_k_argsort, data=1, cost=SORT)
def argsort(x: TensorLike, /, *, axis: int = -1, descending: bool = False, stable: bool = True) -> Prepared:
    """The indices that sort ``x`` along ``axis`` (equal elements in their order when ``stable``)."""
    return (x, axis, _flag(descending, "descending", "argsort"), _flag(stable, "stable", "argsort")), None, None


@op(_k_searchsorted, data=2, cost=Cost.MEMORY)
def searchsorted(
    x1: TensorLike, x2: TensorLike, /, *, side: str = "left", sorter: TensorLike | None = None
) -> Prepared:
    """Indices at which ``x2``'s elements would be inserted into the sorted 1-d ``x1`` to keep it sorted.

    ``side="left"`` gives the first such index, ``"right"`` the last; ``sorter`` is the
    ``argsort`` of an unsorted ``x1``.
    """
    if side not in ("left", "right"):
        raise InvalidArgumentError(f"searchsorted: side must be 'left' or 'right', got {side!r:.60}")
    return (x1, x2, side, sorter), None, None


@op(_k_nonzero, data=1, cost=Cost.UNKNOWN, returns="list", result=tuple)
def nonzero(x: TensorLike, /) -> Prepared:
    """The indices of the non-zero elements: a tuple of one int64 tensor per dimension (not for 0-d ``x``)."""
    return (x,), None, None


@op(_k_unique, data=1, cost=Cost.UNKNOWN, returns="list", result=UniqueAllResult._make)
def unique_all(x: TensorLike, /) -> Prepared:
    """The unique values of ``x``, sorted, with first indices, inverse indices (``x``'s shape) and counts.

    Each NaN is a value of its own, as the standard says. Gives a :class:`UniqueAllResult`.
    """
    return (x, "unique_all"), None, None


@op(_k_unique, data=1, cost=Cost.UNKNOWN, returns="list", result=UniqueCountsResult._make)
def unique_counts(x: TensorLike, /) -> Prepared:
    """The unique values of ``x``, sorted, and their counts: a :class:`UniqueCountsResult`."""
    return (x, "unique_counts"), None, None


@op(_k_unique, data=1, cost=Cost.UNKNOWN, returns="list", result=UniqueInverseResult._make)
def unique_inverse(x: TensorLike, /) -> Prepared:
    """The unique values of ``x``, sorted, and the inverse indices: a :class:`UniqueInverseResult`.

    ``values[inverse_indices]`` rebuilds ``x`` (``inverse_indices`` has ``x``'s shape).
    """
    return (x, "unique_inverse"), None, None


@op(_k_unique, data=1, cost=Cost.UNKNOWN)
def unique_values(x: TensorLike, /) -> Prepared:
    """The unique values of ``x``, sorted, as a 1-d tensor (each NaN its own value)."""
    return (x, "unique_values"), None, None


def _k_isin(xp: Any, x1: Any, x2: Any, invert: bool) -> Any:
    return xp.isin(x1, x2, invert=invert)


@op(_k_isin, data=2, cost=SORT)
def isin(x1: TensorLike, x2: TensorLike, /, *, invert: bool = False) -> Prepared:
    """Element-wise whether each element of ``x1`` is in ``x2`` (not in it with ``invert``; bool)."""
    return (x1, x2, _flag(invert, "invert", "isin")), None, None
