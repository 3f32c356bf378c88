"""Nested fetch structures for ``run``, and short descriptions of op inputs for error messages.

Both walk user data, so both are bounded: a structure deeper than :data:`MAX_DEPTH`,
or one that contains itself, is refused with :class:`InvalidArgumentError` instead of
ending in a ``RecursionError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._errors import InvalidArgumentError

__all__ = ["MAX_DEPTH", "describe", "flatten", "input_specs", "unflatten"]

#: How deeply ``run`` structures may nest (lists / tuples / dicts inside each other).
MAX_DEPTH = 64


def flatten(fetches: Any, is_leaf: Callable[[Any], bool], api: str = "run") -> list[Any]:
    """The leaves of a leaf / list / tuple / dict structure, depth first."""
    out: list[Any] = []
    _flatten(fetches, is_leaf, out, [], api)
    return out


def _flatten(node: Any, is_leaf: Callable[[Any], bool], out: list[Any], path: list[int], api: str) -> None:
    if is_leaf(node):
        out.append(node)
        return
    if isinstance(node, dict):
        items: Any = node.values()
    elif isinstance(node, list | tuple):
        items = node
    else:
        raise InvalidArgumentError(
            f"{api}: fetches must be Tensors, expressions, or lists/tuples/dicts of them;"
            f" found {type(node).__name__} {_short(node)}"
        )
    if id(node) in path:
        raise InvalidArgumentError(f"{api}: the fetch structure contains itself (a cycle)")
    if len(path) >= MAX_DEPTH:
        raise InvalidArgumentError(f"{api}: fetch structures may nest at most {MAX_DEPTH} levels deep")
    path.append(id(node))
    for item in items:
        _flatten(item, is_leaf, out, path, api)
    path.pop()


def unflatten(fetches: Any, is_leaf: Callable[[Any], bool], values: Iterator[Any]) -> Any:
    """Rebuild the structure of ``fetches`` (already checked by :func:`flatten`) with each leaf replaced."""
    if is_leaf(fetches):
        return next(values)
    if isinstance(fetches, list):
        return [unflatten(item, is_leaf, values) for item in fetches]
    if isinstance(fetches, tuple):
        items = [unflatten(item, is_leaf, values) for item in fetches]
        return type(fetches)(*items) if hasattr(fetches, "_fields") else tuple(items)
    return {key: unflatten(item, is_leaf, values) for key, item in fetches.items()}


def _short(x: Any) -> str:
    try:
        text = repr(x)
    except Exception:  # a user object whose __repr__ fails must not hide the op's own error
        return type(x).__name__
    return text if len(text) <= 40 else f"{text[:37]}..."


def _describe_one(x: Any, depth: int = 0) -> str:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if isinstance(shape, tuple) and dtype is not None and not isinstance(x, type):
        return f"{dtype}{list(shape)}"  # tensors, arrays, expressions with a known shape
    if isinstance(x, list | tuple):
        if len(x) <= 4 and depth < 4:  # bounded: a list nested 5,000 deep must not recurse 5,000 times
            inner = ", ".join(_describe_one(e, depth + 1) for e in x)
            if isinstance(x, list):
                return f"[{inner}]"
            return f"({inner},)" if len(x) == 1 else f"({inner})"
        return f"{type(x).__name__} of {len(x)}"
    text = _short(x)
    return text if not text.endswith("...") else type(x).__name__


def describe(args: tuple[Any, ...]) -> str:
    """A short description of op inputs: tensors and arrays as ``dtype[shape]``."""
    return ", ".join(_describe_one(a) for a in args)


def _spec_one(x: Any) -> dict[str, Any]:
    try:
        shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
        if isinstance(shape, tuple) and dtype is not None and not isinstance(x, type):
            return {"dtype": str(dtype), "shape": [int(n) for n in shape]}
        return {"value": _describe_one(x)}
    except Exception:  # a user object whose shape or repr fails must not hide the op's own error
        return {"value": type(x).__name__}


def input_specs(args: tuple[Any, ...]) -> tuple[dict[str, Any], ...]:
    """Op inputs as JSON-ready dicts (``InvalidArgumentError.inputs``): dtype and shape, or a description."""
    return tuple(_spec_one(a) for a in args)
