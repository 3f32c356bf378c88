"""Type aliases for what the public API accepts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

#: Anything :func:`numpy.asarray` turns into a numeric array.
ArrayLike: TypeAlias = npt.ArrayLike
#: A tensor, an expression, or anything accepted where a tensor is (python scalars,
#: ndarrays, nested lists). ``Any`` to the type checker: this module sits below the
#: tensor in the layers (see docs/architecture.md), so it cannot name it.
TensorLike: TypeAlias = Any
#: Anything :class:`numpy.dtype` accepts.
DTypeLike: TypeAlias = npt.DTypeLike
#: A shape: one non-negative int or a sequence of them.
ShapeLike: TypeAlias = "int | Sequence[int]"
#: One axis, several axes, or ``None`` for all.
AxisLike: TypeAlias = "int | Sequence[int] | None"
#: What ``run`` accepts: a tensor or a nested list / tuple / dict of tensors.
Fetches: TypeAlias = Any
#: A read-only numpy array as kernels see it.
NDArray: TypeAlias = "np.ndarray[Any, np.dtype[Any]]"
