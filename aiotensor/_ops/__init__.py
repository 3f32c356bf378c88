"""The op library, one mixin per family; the session inherits them all."""

from ._apply import ApplyOps
from ._creation import CreationOps
from ._elementwise import ElementwiseOps
from ._reduction import ReductionOps
from ._shape import ShapeOps

__all__ = ["AllOps"]


class AllOps(CreationOps, ElementwiseOps, ShapeOps, ReductionOps, ApplyOps):
    """Every op of the library, as coroutine methods."""
