"""Nested fetch structures for ``run`` and short descriptions of op inputs for error messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ._errors import InvalidArgumentError
from ._tensor import Tensor

__all__ = ["describe", "flatten", "unflatten"]


def flatten(fetches: Any, out: list[Tensor]) -> None:
    """Append the tensors of a tensor / list / tuple / dict structure to ``out``, depth first."""
    if isinstance(fetches, Tensor):
        out.append(fetches)
    elif isinstance(fetches, list | tuple):
        for item in fetches:
            flatten(item, out)
    elif isinstance(fetches, dict):
        for item in fetches.values():
            flatten(item, out)
    else:
        raise InvalidArgumentError(
            "run: fetches must be Tensors or lists/tuples/dicts of them;"
            f" found {type(fetches).__name__} {fetches!r:.60}"
        )


def unflatten(fetches: Any, values: Iterator[Any]) -> Any:
    """Rebuild the structure of ``fetches`` with each tensor replaced by the next value."""
    if isinstance(fetches, Tensor):
        return next(values)
    if isinstance(fetches, list):
        return [unflatten(item, values) for item in fetches]
    if isinstance(fetches, tuple):
        items = [unflatten(item, values) for item in fetches]
        return type(fetches)(*items) if hasattr(fetches, "_fields") else tuple(items)
    return {key: unflatten(item, values) for key, item in fetches.items()}


def _describe_one(x: Any, depth: int = 0) -> str:
    if isinstance(x, Tensor | np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    if isinstance(x, list | tuple):
        if len(x) <= 4 and depth < 4:  # bounded: a list nested 5,000 deep must not recurse 5,000 times
            inner = ", ".join(_describe_one(e, depth + 1) for e in x)
            if isinstance(x, list):
                return f"[{inner}]"
            return f"({inner},)" if len(x) == 1 else f"({inner})"
        return f"{type(x).__name__} of {len(x)}"
    try:
        text = repr(x)
    except Exception:  # a user object whose __repr__ fails must not hide the op's own error
        return type(x).__name__
    return text if len(text) <= 40 else f"{type(x).__name__}"


def describe(args: tuple[Any, ...]) -> str:
    """A short description of op inputs: tensors and arrays as ``dtype[shape]``."""
    return ", ".join(_describe_one(a) for a in args)
