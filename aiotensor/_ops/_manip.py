"""The Array API standard's manipulation functions: flip, roll, repeat, tile, moveaxis, unstack ...

numpy returns views for several of these; the backend copies a view into a buffer of
its own, as for the shape ops. ``repeat`` with a tensor of repeats has an output shape
that depends on the data: one step of a program like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._opdef import Cost, Prepared, op
from ._checks import axes, ints, sequence

if TYPE_CHECKING:
    from .._types import AxisLike, TensorLike

M = Cost.MEMORY
#: Ops whose output may be far larger than their inputs (``tile(x, (1000, 1000))``): the
#: cost model sizes an output from the inputs, so these are never estimated (or inlined).
GROWS = Cost.UNKNOWN


def _k_repeat(xp: Any, x: Any, repeats: Any, axis: int | None) -> Any:
    r = xp.asarray(repeats)
    if r.dtype.kind == "u":
        # numpy casts repeats to intp safely, which refuses uint64 (the standard allows it).
        r = r.astype(xp.int64)
    elif r.dtype.kind not in "iu":
        raise TypeError(f"repeats must be integers, got {r.dtype}")
    return xp.repeat(x, r, axis=axis)


def _k_unstack(xp: Any, x: Any, axis: int) -> tuple[Any, ...]:
    x = xp.asarray(x)
    if x.ndim == 0:
        raise ValueError("a 0-d tensor has no axis to unstack")
    return tuple(xp.moveaxis(x, axis, 0))


def _k_broadcast_arrays(xp: Any, *arrays: Any) -> list[Any]:
    return list(xp.broadcast_arrays(*[xp.asarray(a) for a in arrays]))


def _k_take_along_axis(xp: Any, x: Any, indices: Any, axis: int) -> Any:
    return xp.take_along_axis(x, indices, axis=axis)


@op("flip", data=1, cost=M)
def flip(x: TensorLike, /, *, axis: AxisLike = None) -> Prepared:
    """``x`` with the order of elements reversed along ``axis`` (all axes if ``None``)."""
    return (x,), {"axis": axes(axis, "flip")}, None


@op("roll", data=1, cost=M)
def roll(x: TensorLike, /, shift: int | Sequence[int], *, axis: AxisLike = None) -> Prepared:
    """Elements shifted by ``shift`` along ``axis``, wrapping around (of the flattened ``x`` if ``None``)."""
    return (x, ints(shift, "shift", "roll")), {"axis": axes(axis, "roll")}, None


@op("moveaxis", data=1, cost=M)
def moveaxis(x: TensorLike, source: int | Sequence[int], destination: int | Sequence[int], /) -> Prepared:
    """``x`` with the axes ``source`` moved to the positions ``destination`` (the others keep their order)."""
    return (x, ints(source, "source", "moveaxis"), ints(destination, "destination", "moveaxis")), None, None


@op(_k_repeat, data=1, cost=GROWS)
def repeat(x: TensorLike, repeats: int | TensorLike, /, *, axis: int | None = None) -> Prepared:
    """Each element repeated ``repeats`` times (one count, or one per element along ``axis``).

    With ``axis=None`` the flattened ``x`` is repeated. A tensor of counts makes the
    output's size depend on the data.
    """
    return (x, repeats, axis), None, None


@op("tile", data=1, cost=GROWS)
def tile(x: TensorLike, repetitions: Sequence[int], /) -> Prepared:
    """``x`` repeated ``repetitions[i]`` times along each dimension (leading ones added as needed)."""
    reps = ints(repetitions, "repetitions", "tile")
    return (x, (reps,) if isinstance(reps, int) else reps), None, None


@op(_k_unstack, data=1, cost=M, returns="list", result=tuple)
def unstack(x: TensorLike, /, *, axis: int = 0) -> Prepared:
    """``x`` split along ``axis`` into a tuple of its slices (each without that axis): ``stack``'s inverse."""
    return (x, axis), None, None


@op(_k_broadcast_arrays, cost=M, returns="list")
def broadcast_arrays(*arrays: TensorLike) -> Prepared:
    """The tensors broadcast to their common shape, as a list (materialized: each owns its memory)."""
    return tuple(sequence(list(arrays), "broadcast_arrays")), None, None


@op(_k_take_along_axis, data=2, cost=Cost.INDEX)
def take_along_axis(x: TensorLike, indices: TensorLike, /, *, axis: int = -1) -> Prepared:
    """Elements of ``x`` at ``indices`` along ``axis`` (``indices`` as ``argsort`` gives them), as numpy's."""
    return (x, indices, axis), None, None
