"""The parity matrix's cases: every op of the table on a sample of dtypes and shapes.

One entry per case, as a plain tuple ``(op_name, args, kwargs, numpy_reference)``:
``args`` hold ndarrays where the op takes tensors (the matrix turns them into tensors,
expressions, fused values ...), ``numpy_reference(*args, **kwargs)`` is what numpy
gives on the same inputs. A reference that raises (``TypeError``, ``ValueError``,
``IndexError``) makes the case a bad-input case: every path must then raise
``InvalidArgumentError``. Other branches' test modules export ``PARITY_CASES`` lists
in this format; they are appended to :data:`PARITY_CASES` here at merge time.

The sample: bool, int32, int64, float32, float64; 0-d, broadcasting pairs, and inputs
that are not C-contiguous (``.T`` of a matrix: the tensor's buffer is Fortran-ordered).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

Case = tuple[str, tuple[Any, ...], dict[str, Any], Callable[..., Any]]

_rng = np.random.default_rng(27)


def arr(shape: tuple[int, ...], dtype: str, *, low: float = -3.0, high: float = 3.0, nc: bool = False) -> Any:
    """A sample array; ``nc``: a transposed (Fortran-ordered, not C-contiguous) one of that shape."""
    full = shape[::-1] if nc else shape
    dt = np.dtype(dtype)
    if dt.kind == "b":
        a = _rng.random(full) > 0.5
    elif dt.kind in "iu":
        a = _rng.integers(int(low), int(high) + 1, full).astype(dt)
    else:
        a = _rng.uniform(low, high, full).astype(dt)
    out = a.T if nc else a
    return np.asarray(out) if not shape else out


def _binary(
    name: str, ref: Callable[..., Any], *, positive_rhs: bool = False, positive: bool = False, logical: bool = False
) -> list[Case]:
    low = 1.0 if positive_rhs or positive else -3.0
    lhs = 0.5 if positive else -3.0  # (a negative base to a fractional power is NaN, and warns)
    cases: list[Case] = [
        (name, (arr((3, 4), "float64", low=lhs), arr((4,), "float32", low=low)), {}, ref),  # broadcasting pair
        (name, (arr((4, 3), "int32", nc=True), np.asarray(np.int64(2))), {}, ref),  # not contiguous, 0-d
        (name, (arr((2, 3), "int64"), arr((2, 3), "int32", low=low, high=4)), {}, ref),
        (name, (arr((), "float32"), 2.5 if not positive_rhs else 1.5), {}, ref),  # 0-d and a python number
        (name, (arr((3, 4), "float64"), arr((5,), "float64")), {}, ref),  # bad: shapes do not broadcast
    ]
    if logical:
        cases.append((name, (arr((3, 4), "bool"), arr((4,), "bool")), {}, ref))
    return cases


def _unary(name: str, ref: Callable[..., Any], *, positive: bool = False, ints: bool = True) -> list[Case]:
    low = 0.5 if positive else -3.0
    cases: list[Case] = [
        (name, (arr((3, 4), "float64", low=low, nc=True),), {}, ref),
        (name, (arr((), "float32", low=low),), {}, ref),
        (name, (arr((5,), "float32", low=low),), {}, ref),
    ]
    if ints:
        cases.append((name, (arr((2, 3), "int32", low=max(low, 1.0) if positive else low),), {}, ref))
    cases.append((name, ("text",), {}, ref))  # bad: not numeric
    return cases


def _sigmoid(x: Any) -> Any:
    x = np.asarray(x)
    if x.dtype.kind not in "fc":
        x = x.astype(np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _relu(x: Any) -> Any:
    x = np.asarray(x)
    return np.maximum(x, np.zeros((), x.dtype))


def _softmax(x: Any, axis: int = -1) -> Any:
    shifted = np.asarray(x) - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _log_softmax(x: Any, axis: int = -1) -> Any:
    shifted = np.asarray(x) - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _std(x: Any, axis: Any = None, correction: float = 0.0, keepdims: bool = False) -> Any:
    return np.std(x, axis=axis, ddof=correction, keepdims=keepdims)


def _var(x: Any, axis: Any = None, correction: float = 0.0, keepdims: bool = False) -> Any:
    return np.var(x, axis=axis, ddof=correction, keepdims=keepdims)


def _reduction(name: str, ref: Callable[..., Any], *, tuple_axes: bool = True, bools: bool = True) -> list[Case]:
    cases: list[Case] = [
        (name, (arr((3, 4), "float64", nc=True),), {"axis": 0}, ref),
        (name, (arr((2, 3, 4), "float32"),), {"axis": (0, 2) if tuple_axes else 1, "keepdims": True}, ref),
        (name, (arr((5,), "int32"),), {}, ref),
        (name, (arr((2, 3), "int64"),), {"axis": -1}, ref),
        (name, (arr((2, 3), "float64"),), {"axis": 5}, ref),  # bad: no such axis
    ]
    if bools:
        cases.append((name, (arr((3, 4), "bool"),), {"axis": 1}, ref))
    return cases


def _random(seed: int, kind: str) -> Callable[..., Any]:
    def ref(shape: Any, a: float = 0.0, b: float = 1.0, dtype: Any = None, seed: int | None = seed) -> Any:
        rng = np.random.default_rng(seed)
        dt = np.dtype(dtype or "float64")
        base = (
            rng.random(shape, dtype=np.float32 if dt == np.float32 else np.float64)
            if kind == "uniform"
            else rng.standard_normal(shape, dtype=np.float32 if dt == np.float32 else np.float64)
        )
        scale = (b - a) if kind == "uniform" else b
        return np.asarray(a + scale * base).astype(dt, copy=False)

    return ref


def _split(x: Any, indices_or_sections: Any, axis: int = 0) -> list[Any]:
    return list(np.split(x, indices_or_sections, axis=axis))


def _astype(x: Any, dtype: Any) -> Any:
    if np.dtype(dtype).kind not in "biufc":
        raise TypeError(f"{dtype} is not numeric: tensors hold numbers")  # numpy would make strings
    return np.asarray(x).astype(dtype)


def _getitem(x: Any, key: Any) -> Any:
    return np.asarray(x)[key]


def _constant(value: Any, dtype: Any = None) -> Any:
    own = np.asarray(value)
    if own.dtype.kind not in "biufc":
        raise TypeError(f"not numeric: {own.dtype}")
    return np.array(value, dtype=dtype)


_BINARY: list[tuple[str, Callable[..., Any], dict[str, bool]]] = [
    ("add", np.add, {}),
    ("subtract", np.subtract, {}),
    ("multiply", np.multiply, {}),
    ("divide", np.divide, {"positive_rhs": True}),
    ("floor_divide", np.floor_divide, {"positive_rhs": True}),
    ("remainder", np.remainder, {"positive_rhs": True}),
    ("pow", np.power, {"positive": True}),
    ("maximum", np.maximum, {}),
    ("minimum", np.minimum, {}),
    ("equal", np.equal, {"logical": True}),
    ("not_equal", np.not_equal, {"logical": True}),
    ("less", np.less, {}),
    ("less_equal", np.less_equal, {}),
    ("greater", np.greater, {}),
    ("greater_equal", np.greater_equal, {}),
    ("logical_and", np.logical_and, {"logical": True}),
    ("logical_or", np.logical_or, {"logical": True}),
]
_UNARY: list[tuple[str, Callable[..., Any], dict[str, bool]]] = [
    ("negative", np.negative, {}),
    ("abs", np.absolute, {}),
    ("sign", np.sign, {}),
    ("exp", np.exp, {}),
    ("log", np.log, {"positive": True}),
    ("log1p", np.log1p, {"positive": True}),
    ("sqrt", np.sqrt, {"positive": True}),
    ("square", np.square, {}),
    ("sin", np.sin, {}),
    ("cos", np.cos, {}),
    ("tanh", np.tanh, {}),
    ("sigmoid", _sigmoid, {}),
    ("relu", _relu, {}),
    ("floor", np.floor, {}),
    ("ceil", np.ceil, {}),
    ("logical_not", np.logical_not, {}),
    ("isnan", np.isnan, {}),
    ("isfinite", np.isfinite, {}),
]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for name, ref, opts in _BINARY:
        cases += _binary(name, ref, **opts)
    for name, ref, opts in _UNARY:
        cases += _unary(name, ref, **opts)
    cases += [
        ("logical_not", (arr((3, 4), "bool"),), {}, np.logical_not),
        ("negative", (arr((2, 2), "bool"),), {}, np.negative),  # bad: numpy refuses bool negation
        ("round", (arr((3, 4), "float64", nc=True),), {"decimals": 1}, np.round),
        ("round", (arr((5,), "int32"),), {}, np.round),
        ("round", ("x",), {}, np.round),
        ("clip", (arr((3, 4), "float64", nc=True), -1.0, 1.0), {}, np.clip),
        ("clip", (arr((5,), "int32"), None, arr((5,), "int32")), {}, np.clip),
        ("clip", (arr((3, 4), "float32"), arr((5,), "float32"), None), {}, np.clip),
        ("where", (arr((3, 4), "bool"), arr((3, 4), "float64"), arr((4,), "float32")), {}, np.where),
        ("where", (arr((4, 3), "bool", nc=True), arr((), "int32"), 2), {}, np.where),
        ("where", (arr((3, 4), "bool"), arr((3,), "float64"), 1.0), {}, np.where),
    ]
    reductions: list[tuple[str, Callable[..., Any]]] = [
        ("sum", np.sum),
        ("prod", np.prod),
        ("mean", np.mean),
        ("max", np.max),
        ("min", np.min),
    ]
    for name, ref in reductions:
        cases += _reduction(name, ref)
    cases += _reduction("std", _std, bools=False) + _reduction("var", _var, bools=False)
    cases += [
        ("std", (arr((3, 4), "float64"),), {"axis": 0, "correction": 1}, _std),
        ("var", (arr((3, 4), "float32"),), {"axis": 1, "correction": 1, "keepdims": True}, _var),
        ("sum", (arr((3, 4), "int32"),), {"axis": 0, "dtype": "int64"}, np.sum),
        ("prod", (arr((3, 4), "float32"),), {"dtype": "float64"}, np.prod),
        ("max", (np.zeros((0, 3)),), {"axis": 0}, np.max),  # bad: empty reduction
    ]
    for name, ref in [("argmax", np.argmax), ("argmin", np.argmin)]:
        cases += _reduction(name, ref, tuple_axes=False)
    for name, ref in [("softmax", _softmax), ("log_softmax", _log_softmax)]:
        cases += [
            (name, (arr((3, 4), "float64", nc=True),), {"axis": -1}, ref),
            (name, (arr((2, 3), "float32"),), {"axis": 0}, ref),
            (name, (arr((2, 3), "float64"),), {"axis": 3}, ref),
        ]
    cases += [
        ("matmul", (arr((3, 4), "float64", nc=True), arr((4, 2), "float64")), {}, np.matmul),
        ("matmul", (arr((2, 3, 4), "float32"), arr((4,), "float32")), {}, np.matmul),
        ("matmul", (arr((2, 2), "int32"), arr((2, 2), "int64")), {}, np.matmul),
        ("matmul", (arr((3, 4), "float64"), arr((3, 4), "float64")), {}, np.matmul),
        ("tensordot", (arr((3, 4), "float64"), arr((4, 2), "float64")), {"axes": 1}, np.tensordot),
        ("tensordot", (arr((2, 3), "int32"), arr((2, 3), "int32")), {"axes": 2}, np.tensordot),
        ("tensordot", (arr((2, 3), "float64"), arr((4, 3), "float64")), {"axes": 1}, np.tensordot),
        ("einsum", ("ij,jk->ik", arr((3, 4), "float64", nc=True), arr((4, 2), "float64")), {}, _einsum),
        ("einsum", ("ii->i", arr((3, 3), "int64")), {}, _einsum),
        ("einsum", ("ij,jk->ik", arr((3, 4), "float64"), arr((3, 2), "float64")), {}, _einsum),
        ("reshape", (arr((3, 4), "float64", nc=True), (2, 6)), {}, np.reshape),
        ("reshape", (arr((2, 3), "bool"), (-1,)), {}, np.reshape),
        ("reshape", (arr((), "int32"), (1, 1)), {}, np.reshape),
        ("reshape", (arr((2, 3), "float64"), (5,)), {}, np.reshape),
        ("permute_dims", (arr((2, 3, 4), "float32"), (1, 0, 2)), {}, np.transpose),
        ("permute_dims", (arr((3, 4), "int64", nc=True), None), {}, np.transpose),
        ("permute_dims", (arr((2, 3), "float64"), (0, 5)), {}, np.transpose),
        ("expand_dims", (arr((3, 4), "float64"), 0), {}, np.expand_dims),
        ("expand_dims", (arr((3,), "int32"), (0, 2)), {}, np.expand_dims),
        ("expand_dims", (arr((3,), "float64"), 7), {}, np.expand_dims),
        ("squeeze", (arr((1, 3, 1), "float64"), None), {}, np.squeeze),
        ("squeeze", (arr((1, 3), "bool"), 0), {}, np.squeeze),
        ("squeeze", (arr((2, 3), "float64"), 1), {}, np.squeeze),
        ("concat", ([arr((2, 3), "float64"), arr((1, 3), "float32")],), {"axis": 0}, _concat),
        ("concat", ([arr((2, 3), "int32", nc=True), arr((2, 2), "int64")],), {"axis": 1}, _concat),
        ("concat", ([arr((2, 3), "float64"), arr((2, 2), "float64")],), {"axis": 0}, _concat),
        ("stack", ([arr((2, 3), "float64"), arr((2, 3), "float32")],), {"axis": 0}, _stack),
        ("stack", ([arr((3,), "bool"), arr((3,), "bool")],), {"axis": -1}, _stack),
        ("stack", ([arr((2, 3), "float64"), arr((3,), "float64")],), {}, _stack),
        ("split", (arr((4, 3), "float64"), 2), {}, _split),
        ("split", (arr((3, 4), "int32", nc=True), [1, 3]), {"axis": 1}, _split),
        ("split", (arr((3, 4), "float64"), 2), {}, _split),
        ("broadcast_to", (arr((4,), "float32"), (3, 4)), {}, np.broadcast_to),
        ("broadcast_to", (arr((), "bool"), (2, 2)), {}, np.broadcast_to),
        ("broadcast_to", (arr((3,), "float64"), (3, 4)), {}, np.broadcast_to),
        ("astype", (arr((3, 4), "float64", nc=True), "int32"), {}, _astype),
        ("astype", (arr((5,), "int64"), "float32"), {}, _astype),
        ("astype", (arr((2, 2), "float32"), "bool"), {}, _astype),
        ("astype", (arr((2, 2), "float32"), "U3"), {}, _astype),  # bad: not numeric
        ("take", (arr((3, 4), "float64"), np.array([2, 0])), {"axis": 0}, np.take),
        ("take", (arr((5,), "int32"), np.array([[1, 4], [0, 0]])), {}, np.take),
        ("take", (arr((3, 4), "float64"), np.array([7])), {"axis": 0}, np.take),
        ("getitem", (arr((3, 4), "float64", nc=True), (slice(None), slice(None, None, 2))), {}, _getitem),
        ("getitem", (arr((5,), "int64"), np.array([True, False, True, False, True])), {}, _getitem),
        ("getitem", (arr((3, 4), "float32"), (1, Ellipsis, None)), {}, _getitem),
        ("getitem", (arr((3, 4), "float64"), (5,)), {}, _getitem),
        ("zeros_like", (arr((3, 4), "float32", nc=True),), {}, np.zeros_like),
        ("zeros_like", (arr((2,), "int32"),), {"dtype": "bool"}, np.zeros_like),
        ("ones_like", (arr((), "int64"),), {}, np.ones_like),
        ("ones_like", (arr((2, 3), "bool"),), {"dtype": "float32"}, np.ones_like),
        ("constant", ([[1.0, 2.0], [3.0, 4.0]],), {}, _constant),
        ("constant", (arr((3, 2), "int32", nc=True),), {"dtype": "float32"}, _constant),
        ("constant", (7,), {"dtype": "int64"}, _constant),
        ("constant", ([[1.0], [2.0, 3.0]],), {}, _constant),  # bad: ragged
        ("zeros", ((2, 3),), {"dtype": "int32"}, np.zeros),
        ("zeros", ((),), {}, np.zeros),
        ("ones", ((3,),), {"dtype": "bool"}, np.ones),
        ("ones", ((2, 2),), {}, np.ones),
        ("full", ((2, 2), 7), {}, np.full),
        ("full", ((3,), 1.5), {"dtype": "float32"}, np.full),
        ("arange", (0, 5), {}, np.arange),
        ("arange", (1.0, 2.0, 0.25), {"dtype": "float32"}, np.arange),
        ("linspace", (0.0, 1.0, 5), {}, np.linspace),
        ("linspace", (0, 10, 4), {"endpoint": False, "dtype": "float32"}, np.linspace),
        ("acosh", (arr((3, 2), "float64", low=1.0, high=4.0),), {}, np.arccosh),  # (families' rows warn)
        ("log2", (arr((3, 2), "float64", low=0.5, high=4.0),), {}, np.log2),
        ("log10", (arr((2, 3), "float32", low=0.5, high=4.0, nc=True),), {}, np.log10),
        ("eye", (3,), {"k": 1}, np.eye),
        ("eye", (2, 3), {"dtype": "int32"}, np.eye),
        ("random_uniform", ((3, 4),), {"seed": 5}, _random(5, "uniform")),
        ("random_uniform", ((5,),), {"dtype": "float32", "seed": 6}, _random(6, "uniform")),
        ("random_normal", ((3, 4),), {"seed": 7}, _random(7, "normal")),
        ("random_normal", ((2,),), {"dtype": "float32", "seed": 8}, _random(8, "normal")),
    ]
    return cases


def _einsum(subscripts: str, *operands: Any) -> Any:
    return np.einsum(subscripts, *operands, optimize=True)


def _concat(arrays: list[Any], axis: int = 0) -> Any:
    return np.concatenate(arrays, axis=axis)


def _stack(arrays: list[Any], axis: int = 0) -> Any:
    return np.stack(arrays, axis=axis)


#: The op families whose test modules export ``PARITY_CASES`` (tests/test_ops_<family>.py).
_FAMILIES = ("creation", "fft", "linalg", "manip", "math", "nn", "reduction", "search", "shape")


def _family_cases() -> list[Case]:
    # The op families' own rows: each family's test module checks them on every surface
    # and exports them in this format, so the matrix runs them through every path too.
    modules = [importlib.import_module(f".test_ops_{family}", __package__) for family in _FAMILIES]
    return [case for module in modules for case in module.PARITY_CASES if not _warns(case)]


def _warns(case: Case) -> bool:
    # A row whose numpy reference warns (NaN from a domain edge) stays in its family's
    # module, which checks the warning itself: here (warnings are errors in this suite)
    # every path would fail alike, and the matrix would compare errors, not values.
    _, args, kwargs, ref = case
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            ref(*args, **kwargs)
        except Exception:
            return False  # a bad-input row: kept
    return any(issubclass(w.category, RuntimeWarning) for w in seen)


_FAMILY = _family_cases()
#: Every case of the matrix: the table's own rows, then the op families'.
PARITY_CASES: list[Case] = _cases() + _FAMILY
#: The op families' rows (by identity). Their references are often another formula than
#: the kernel's (``x * sigmoid(x)`` for silu, array-api-strict for linalg): for ops of a
#: transcendental or product cost the matrix holds them to a few ulp of the reference,
#: and every path bit for bit to the session method's result.
FAMILY_ROWS: frozenset[int] = frozenset(map(id, _FAMILY))

#: Ops of the table with no case, and why.
EXCLUDED: dict[str, str] = {
    "apply": "the reference path itself: every case runs through apply with its numpy reference",
}
