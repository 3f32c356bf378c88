"""The served model: a small MLP whose weights come from a fixed seed (nothing is downloaded).

Two forward passes live here: :func:`numpy_forward`, plain NumPy (the reference the
tests compare against, and what the baseline apps run), and :class:`Model`, the same
math as aiotensor ops on a request session reading weights owned by the app session.

Everything is float32 (:data:`DTYPE`), as inference services compute: float64 would
double the bytes every kernel reads and writes, for precision the model does not have.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

import aiotensor as at

__all__ = [
    "CLASSES",
    "DTYPE",
    "HIDDEN",
    "IN_FEATURES",
    "SEED",
    "Model",
    "Rows",
    "as_inputs",
    "batched_forward",
    "make_weights",
    "numpy_forward",
]

#: Features per input row.
IN_FEATURES = 64
#: Widths of the hidden layers.
HIDDEN = (512, 512)
#: Output classes.
CLASSES = 10
#: The seed the served weights are drawn from.
SEED = 1234
#: The dtype of weights, inputs and every intermediate.
DTYPE = np.float32

Array = np.ndarray[Any, np.dtype[np.float32]]
Layer = tuple[Array, Array]


def make_weights(seed: int = SEED) -> list[Layer]:
    """``(weight, bias)`` per layer, He-initialised from ``seed``: the same seed gives the same model."""
    rng = np.random.default_rng(seed)
    sizes = (IN_FEATURES, *HIDDEN, CLASSES)
    layers: list[Layer] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(fan_out) * 0.01
        layers.append((w.astype(DTYPE), b.astype(DTYPE)))
    return layers


def numpy_forward(layers: list[Layer], x: Array) -> Array:
    """Class probabilities for the rows of ``x``: ReLU hidden layers, then a stable softmax."""
    h = x
    for w, b in layers[:-1]:
        h = np.maximum(h @ w + b, 0)
    w, b = layers[-1]
    logits = h @ w + b
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class Model:
    """The MLP's weights as tensors of one (app-lifetime) session."""

    layers: tuple[tuple[at.Tensor, at.Tensor], ...]

    @classmethod
    async def load(cls, session: at.AsyncEagerSession, layers: list[Layer]) -> Model:
        """Copy ``layers`` into tensors owned by ``session``."""
        tensors = []
        for i, (w, b) in enumerate(layers):
            tensors.append((await session.constant(w, name=f"w{i}"), await session.constant(b, name=f"b{i}")))
        return cls(tuple(tensors))

    @property
    def nbytes(self) -> int:
        """Bytes of all weights."""
        return sum(w.nbytes + b.nbytes for w, b in self.layers)

    async def predict(self, s: at.AsyncEagerSession, rows: Rows) -> Array:
        """Class probabilities for ``rows``, computed in ``s`` (the app session or a child of it).

        ``rows``: a ``(n, 64)`` float32 tensor of ``s`` (``web.read_rows`` makes one), or
        a list of rows. Each intermediate is a buffer of ``s``; rebinding ``h`` drops the
        previous one, which ``s``'s cleanup strategy frees, and closing ``s`` frees the rest.
        """
        h = await _inputs(s, rows)
        for w, b in self.layers[:-1]:
            h = await s.relu(await s.add(await s.matmul(h, w), b))
        w, b = self.layers[-1]
        probs = await s.softmax(await s.add(await s.matmul(h, w), b), axis=-1)
        return await probs.numpy()

    async def predict_fused(self, s: at.AsyncEagerSession, rows: Rows) -> Array:
        """The same forward pass as one ``apply`` op: two pool round trips per request instead of ten.

        The weights still reach the kernel as the app session's buffers, uncopied. The
        width is checked here, on the loop: inside ``apply`` a shape error would be the
        user function's own failure (``KernelError``, a 500), not the client's (a 422).
        """
        inputs = await _inputs(s, rows)
        probs = await s.apply(_forward_kernel, inputs, *[t for layer in self.layers for t in layer])
        assert not isinstance(probs, tuple)
        return await probs.numpy()

    async def predict_batched(self, s: at.AsyncEagerSession, rows: Rows) -> Array:
        """The same forward pass, micro-batched: concurrent requests share one kernel call.

        The rows of the requests that arrive within one loop iteration are stacked into
        one batch (up to 512 rows), the whole MLP runs once on it, and each request gets
        its own rows back as a tensor of its own session ``s`` (see ``at.batched``).
        """
        inputs = await _inputs(s, rows)
        probs = await batched_forward(inputs, *[t for layer in self.layers for t in layer])
        assert not isinstance(probs, tuple)
        return await probs.numpy()


@at.batched(max_batch_size=512, row_shape=(IN_FEATURES,), dtype=DTYPE)
def batched_forward(ops: at.FusedOps, x: Any, *params: Any) -> Any:
    """The MLP as a batched fused function: ``x`` holds the stacked rows of concurrent requests."""
    layers = list(zip(params[::2], params[1::2], strict=True))
    h = x
    for w, b in layers[:-1]:
        h = ops.relu(h @ w + b)
    w, b = layers[-1]
    return ops.softmax(h @ w + b, axis=-1)


#: The inputs of a forward pass: a float32 tensor of shape (n, 64), or a list of rows.
Rows = at.Tensor | list[list[float]]


async def _inputs(s: at.AsyncEagerSession, rows: Rows) -> at.Tensor:
    """``rows`` as a checked ``(n, 64)`` float32 tensor of ``s``: a 422 naming the width, before any op."""
    if isinstance(rows, at.Tensor):
        shape, dtype = rows.shape, rows.dtype
        t = rows
    else:
        x = as_inputs(rows)
        shape, dtype = x.shape, x.dtype
        t = None
    if len(shape) != 2 or shape[1] != IN_FEATURES or dtype != DTYPE:
        raise at.InvalidArgumentError(
            f"forward: rows of {shape[-1] if shape else 0} {dtype} values, expected {IN_FEATURES} float32",
            inputs=({"dtype": str(dtype), "shape": list(shape)},),
        )
    return t if t is not None else await s.constant(x, name="inputs")


def as_inputs(rows: list[list[float]]) -> Array:
    """``rows`` as a 2-d float32 array; ragged rows raise :class:`~aiotensor.InvalidArgumentError`.

    On the event loop, on purpose: building an array from Python floats holds the GIL
    wherever it runs, and handing the op an ndarray spares it scanning a nested list for
    tensors (the ops accept tensors inside lists), element by element, in Python.
    """
    try:
        x = np.asarray(rows, dtype=DTYPE)
    except ValueError:  # ragged rows (numpy speaks of an "inhomogeneous shape")
        lengths = sorted({len(r) for r in rows})
        raise at.InvalidArgumentError(
            f"inputs: rows of different lengths {lengths[:4]}; every row needs {IN_FEATURES} values",
            inputs=({"value": f"list of {len(rows)} rows"},),
        ) from None
    if x.ndim != 2 or not x.size:
        raise at.InvalidArgumentError(
            f"inputs: expected a non-empty list of rows of {IN_FEATURES} values",
            inputs=({"dtype": str(x.dtype), "shape": list(x.shape)},),
        )
    return x


def _forward_kernel(x: Array, *weights: Array) -> Array:
    return numpy_forward(list(zip(weights[::2], weights[1::2], strict=True)), x)
