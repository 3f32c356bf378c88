"""An expression's shape and dtype, known before it runs, from its inputs' metadata only.

No kernel ever runs on the data: element-wise ops follow NumPy's broadcasting and
promotion (:mod:`_ufuncs`), reductions a shape rule, indexing a run on a zero-stride
stand-in of the input, and the other ops a run of their kernel on small zero-filled
stand-ins of the inputs' shapes and dtypes (exact, because every op of the table gives
its output's shape and dtype from its inputs' shapes and dtypes alone). Where a size
depends on the values (``unique_values``, ``nonzero``, a boolean mask) it is ``None``;
where nothing exact is cheap (a large input to an op without a rule of
:mod:`_shape_rules`, a user kernel), the shape or dtype is ``None``: unknown, never wrong.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ._opdef import Cost, OpDef, item_op
from ._shape_rules import PRESERVING, SHAPE_RULES, Shape, broadcast
from ._ufuncs import ufunc_result

__all__ = ["DATA_DEPENDENT", "Meta", "Shape", "broadcast", "node_meta"]

#: (shape or None if unknown, dtype or None if unknown); a list of them for several results.
Meta = tuple[Shape | None, np.dtype[Any] | None]
#: Ops whose output sizes depend on the input values.
DATA_DEPENDENT = frozenset(
    {"nonzero", "argwhere", "unique", "unique_values", "unique_counts", "unique_inverse", "unique_all", "repeat"}
)
#: Ops whose kernels run on stand-ins only up to this many input elements.
_SMALL = 4096
_UNKNOWN: Meta = (None, None)
_PY_SCALARS = (bool, int, float, complex)


def _stand_in(shape: Shape, dtype: np.dtype[Any]) -> Any:
    # Square float matrices are identities, so that inv/solve/cholesky of a stand-in succeed.
    arr = np.zeros(cast("tuple[int, ...]", shape), dtype)
    if len(shape) >= 2 and shape[-1] == shape[-2] and dtype.kind in "fc":
        arr[...] = np.eye(shape[-1], dtype=dtype)  # type: ignore[arg-type]
    return arr


def _run(fn: Callable[[], Any]) -> Any:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def _out_meta(out: Any, dynamic: bool) -> Any:
    if isinstance(out, list | tuple):
        return [_out_meta(o, dynamic) for o in out]
    arr = np.asarray(out)
    shape: Shape = tuple(None for _ in arr.shape) if dynamic else arr.shape
    return shape, arr.dtype


def node_meta(
    d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None, meta_of: Callable[[Any], Any], nbytes: int | None
) -> Any:
    """The metadata of op ``d`` applied to ``args``; ``meta_of`` gives an argument's (or None if it is a value).

    ``nbytes``: the output's size when known before running (creation ops): a large one
    is not made to learn its shape.
    """
    try:
        if d.cost is Cost.CREATE:
            if getattr(d.kernel, "__name__", None) == "_k_full":
                return tuple(args[0]), args[2]  # zeros, ones, full: (shape, fill, dtype)
            value = args[0] if d.name == "constant" else None  # asarray of a short list: cheap to look at
            small = isinstance(value, _PY_SCALARS) or (isinstance(value, list | tuple) and len(value) <= 64)
            if (nbytes is None or nbytes > _SMALL * 8) and not small:
                return _UNKNOWN
        return _node_meta(d, args, kwargs or {}, meta_of)
    except Exception:
        return _UNKNOWN


def _node_meta(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any], meta_of: Callable[[Any], Any]) -> Any:
    if d is item_op:
        parent = meta_of(args[0])
        return parent[args[1]] if isinstance(parent, list) else _UNKNOWN
    if d.user:
        return _UNKNOWN  # never run a user's kernel for metadata
    metas = [meta_of(a) for a in args]
    if d.ufunc and isinstance(d.kernel, str) and not kwargs:
        return _elementwise(getattr(np, d.kernel), args, metas)
    if d.name == "getitem":
        return _getitem(metas[0], args[1], meta_of)
    if d.data == 1 and "axis" in kwargs and "keepdims" in kwargs and metas[0] is not None:
        return _reduction(d, args, kwargs, metas[0])
    return _by_stand_ins(d, args, kwargs, metas, meta_of)


def _elementwise(ufunc: np.ufunc, args: tuple[Any, ...], metas: list[Any]) -> Meta:
    shapes: list[Shape] = []
    trial: list[Any] = []
    for a, m in zip(args, metas, strict=True):
        if m is None:
            if not isinstance(a, _PY_SCALARS):
                a = np.asarray(a)
                m = (a.shape, a.dtype)
            else:
                trial.append(a)
                continue
        if isinstance(m, list) or m[1] is None:
            return _UNKNOWN
        trial.append(np.zeros((), m[1]))
        if m[0] is None:
            shapes = []
            break
        shapes.append(m[0])
    known = ufunc_result(ufunc, trial)
    dtype = None if known is None else known[1]
    if len(shapes) != len([m for m in metas if m is not None]):
        return None, dtype
    return broadcast(shapes), dtype


def _reduction(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any], m: Meta) -> Meta:
    shape, dtype = m
    if shape is None or dtype is None:
        return _UNKNOWN
    axis, keepdims = kwargs["axis"], kwargs["keepdims"]
    ndim = len(shape)
    one = np.ones((1,) * ndim, dtype)
    out = _run(lambda: d.kernel_for(np)(one, *args[1:], **kwargs))
    axes = range(ndim) if axis is None else [a % ndim for a in ((axis,) if isinstance(axis, int) else axis)]
    dims: list[int | None] = []
    for i, n in enumerate(shape):
        if i in axes:
            if keepdims:
                dims.append(1)
        else:
            dims.append(n)
    return tuple(dims), np.asarray(out).dtype


def _getitem(m: Any, key: Any, meta_of: Callable[[Any], Any]) -> Meta:
    if m is None or isinstance(m, list) or m[0] is None or None in m[0] or m[1] is None:
        return _UNKNOWN
    shape, dtype = m
    x = np.broadcast_to(np.zeros((), dtype), shape)  # no memory, whatever the shape
    parts = key if type(key) is tuple else (key,)
    masks = False
    empty: list[Any] = []
    one: list[Any] = []
    for p in parts:
        km = meta_of(p) if not isinstance(p, np.ndarray) else (p.shape, p.dtype)
        if km is None:
            empty.append(p)
            one.append(p)
            continue
        if isinstance(km, list) or km[0] is None or None in km[0] or km[1] is None:
            return None, dtype
        kshape, kdtype = km
        if kdtype == np.bool_:
            masks = True
            empty.append(np.zeros(kshape, bool))
            first = np.zeros(kshape, bool)
            first.reshape(-1)[:1] = True
            one.append(first)
        elif kdtype.kind not in "iu":
            return _UNKNOWN  # (a float index: the kernel refuses it)
        else:
            index = np.zeros(kshape, np.intp)
            empty.append(index)
            one.append(index)
    got = _run(lambda: x[tuple(empty)]).shape
    if not masks:
        return got, dtype
    other = _run(lambda: x[tuple(one)]).shape
    return tuple(a if a == b else None for a, b in zip(got, other, strict=True)), dtype


def _by_stand_ins(
    d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any], metas: list[Any], meta_of: Callable[[Any], Any]
) -> Any:
    shapes: list[tuple[int, ...]] = []  # every array input's shape, nested lists' included
    sized = True  # every size known (else: the rule path, sizes unknown until run time)

    def known(a: Any, m: Any) -> None:
        nonlocal sized
        if m is None:
            if isinstance(a, list | tuple):
                for e in a:
                    known(e, meta_of(e))
            return
        if isinstance(m, list) or m[0] is None or m[1] is None:
            raise LookupError  # an input of unknown shape: the output's is unknown too
        if None in m[0]:
            sized = False  # (a boolean mask's result, unique values ...)
            return
        shapes.append(m[0])

    try:
        for a, m in zip(args, metas, strict=True):
            known(a, m)
        for v in kwargs.values():
            known(v, meta_of(v))
    except LookupError:
        return _UNKNOWN
    if not sized or sum(math.prod(sh) for sh in shapes) > _SMALL:  # (before any stand-in is made)
        if d.returns != "one":
            return _several_large(d, args, kwargs, metas)
        return _large(d, args, kwargs, metas, meta_of)
    out = _run(
        lambda: d.kernel_for(np)(
            *_stand_ins(args, meta_of), **dict(zip(kwargs, _stand_ins(tuple(kwargs.values()), meta_of), strict=True))
        )
    )
    return _out_meta(out, _data_dependent(d, args))


def _data_dependent(d: OpDef, args: tuple[Any, ...]) -> bool:
    # repeat's sizes depend on the values only when the repeats are an array.
    return d.name in DATA_DEPENDENT and not (d.name == "repeat" and isinstance(args[1], int))


def _stand_ins(args: tuple[Any, ...], meta_of: Callable[[Any], Any], tiny: bool = False) -> list[Any]:
    """Zero-filled stand-ins of the array arguments (of one element a dimension with ``tiny``)."""
    out: list[Any] = []
    for a in args:
        m = meta_of(a)
        if m is None:
            out.append(type(a)(_stand_ins(tuple(a), meta_of, tiny)) if isinstance(a, list | tuple) else a)
        else:
            shape = tuple(1 if n is None else min(n, 1) for n in m[0]) if tiny else m[0]
            out.append(_stand_in(shape, m[1]))
    return out


def _several_large(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any], metas: list[Any]) -> Any:
    # Several results of large inputs: split by its rule; other ops run on stand-ins of
    # one element a dimension, which tells how many results and their dtypes (not sizes).
    m = metas[0]
    if d.name == "split" and m is not None and not isinstance(m, list) and m[0] is not None:
        shape, dtype = m
        axis = args[2] % len(shape)
        n = shape[axis]
        if n is None:
            return _UNKNOWN
        sections = args[1]
        if isinstance(sections, int):
            if not sections or n % sections:
                return _UNKNOWN  # (the kernel raises: no equal division)
            cuts = [n * i // sections for i in range(sections + 1)]
        elif any(i < 0 for i in sections):
            return _UNKNOWN
        else:
            cuts = [0, *sections, n]
        sizes = [max(0, min(b, n) - min(a, n)) for a, b in itertools.pairwise(cuts)]
        return [((*shape[:axis], k, *shape[axis + 1 :]), dtype) for k in sizes]
    tiny = [
        _stand_in(tuple(1 if n is None else min(n, 1) for n in mi[0]), mi[1])
        if mi is not None and not isinstance(mi, list)
        else a
        for a, mi in zip(args, metas, strict=True)
    ]
    out = _run(lambda: d.kernel_for(np)(*tiny, **kwargs))
    return _out_meta(out, True)


def _large(
    d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any], metas: list[Any], meta_of: Callable[[Any], Any]
) -> Meta:
    # Large inputs: the dtype from a run on stand-ins of one element a dimension (the
    # dtype depends on the inputs' dtypes only), the shape by the op's rule where it has one.
    try:
        tiny = _stand_ins(args, meta_of, tiny=True)
        tiny_kw = dict(zip(kwargs, _stand_ins(tuple(kwargs.values()), meta_of, tiny=True), strict=True))
        dtype: np.dtype[Any] | None = np.asarray(_run(lambda: d.kernel_for(np)(*tiny, **tiny_kw))).dtype
    except Exception:
        dtype = None
    m = metas[0] if metas else None
    if d.name in PRESERVING and m is not None and not isinstance(m, list):
        dtype = m[1]  # (a tiny stand-in may not reshape: these ops keep the dtype anyway)
    rule = SHAPE_RULES.get(d.name)
    try:
        shape = None if rule is None else rule(args, kwargs, meta_of)
    except Exception:
        shape = None
    return shape, dtype
