"""The lean path of an element-wise op or a product: synchronous, inline, without another frame (``Engine.lean``)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _fpwarn
from .._backends._allocator import out_for
from .._cost import HOLD_PER_OP_S, OVERHEAD_NS, PER_BYTE, estimate_us
from .._kernels import NUMERIC_KINDS, kernel_error, normalize
from .._loopload import stays_inline
from .._opdef import OPS, OpDef
from .._tensor import Tensor
from ._lifecycle import on_loop

if TYPE_CHECKING:
    from ._core import Engine

__all__ = ["LEAN", "adopt", "lean"]

_ndarray = np.ndarray
_ufunc = np.ufunc
_clock = time.perf_counter
_new = object.__new__


#: Ops the lean path takes (``OpDef.lean``: plain element-wise ops of one output, and
#: products of two data args such as ``matmul``), kernels of numpy's.
LEAN = frozenset(d for d in OPS.values() if d.lean and d.kernel_for(np) is not None)
# The element-wise ones among them (``OpDef.elementwise``: erf, of Cost.SPECIAL, is not) ...
_ELEMENTWISE = frozenset(d for d in LEAN if d.elementwise)
# ... and the cost model's ns per byte of every element-wise op of LEAN, by op (an enum's
# hash is a Python call: too slow here). An op of LEAN not in it is a product, estimated
# by the cost model itself.
_PER_BYTE_OF = {d: PER_BYTE[d.cost] for d in LEAN if d.cost in PER_BYTE}


def lean(self: Engine, d: OpDef, args: tuple[Any, ...], name: str | None) -> Tensor | None:
    """The lean path of op ``d`` (in :data:`LEAN`), synchronously; None to take :meth:`op`.

    Session methods, module-level functions and one-node expressions of such ops
    call it before :meth:`op`, saving a coroutine frame on the hottest path;
    :meth:`op` tries it again only after it yielded the loop. A product's operands
    are tensors or numeric arrays: numpy checks their shapes and promotes their dtypes,
    and its errors become the general path's (``kernel_error``).
    """
    if not (
        self._lean_loop is not None
        and on_loop(self._lean_loop)
        and self._held < self._hold_s
        and (name is None or type(name) is str)
        and (not self.placed or self.device_var.get() is None)
    ):
        return None
    # The hottest path: an element-wise op on tensors (or numeric ndarrays, for a
    # ufunc) and numbers, cheap enough to run inline, in a session without a memory
    # limit. Shapes are one shape, or broadcast as a row against rows (the shorter
    # shape is the end of the longer one: a scaler's mean, a bias). Each step is the
    # general path's below, without its calls; anything unusual falls through to it.
    # None: a product, whose operands' shapes are numpy's to check (its output's shape is its own).
    per_byte = _PER_BYTE_OF.get(d)
    bufs = []
    shape = None
    broadcast = per_byte is None
    total = largest = 0
    for a in args:
        ta = type(a)
        if ta is Tensor:
            owner = a._engine
            if owner is not self and owner not in self.ancestors:
                break
            try:
                buf = a._registry._buffers[a._rid][0]
            except KeyError:
                break
            a_shape = a._shape
            n = a._nbytes
        elif (ta is float or ta is int) and per_byte is not None:
            bufs.append(a)
            continue
        elif ta is _ndarray and a.dtype.kind in NUMERIC_KINDS and type(d._np_kernel) is _ufunc:
            # (a ufunc's output is always fresh: a non-ufunc kernel might return the
            # caller's array itself, which the general path checks for)
            buf = a
            a_shape = a.shape
            n = a.nbytes
        else:
            break
        if shape is None:
            shape = a_shape
        elif a_shape != shape and per_byte is not None:
            k, m = len(a_shape), len(shape)
            if k < m and shape[m - k :] == a_shape:
                pass
            elif k > m and a_shape[k - m :] == shape:
                shape = a_shape
            else:
                break  # any other broadcast, or shapes that do not: the general path
            broadcast = True
        total += n
        if n > largest:
            largest = n
        bufs.append(buf)
    else:
        # The cost model's element-wise estimate (_cost.estimate_us): bytes read plus
        # the output's (its size x the widest item); without broadcasting, the output
        # is as large as the largest input.
        if per_byte is None:
            # A product: the cost model's estimate (flops), as the general path takes it.
            cost_ns = estimate_us(d, bufs, None, None) * 1000.0 - OVERHEAD_NS
        else:
            out_bytes = largest
            if broadcast:
                itemsize = 1
                for b in bufs:
                    if type(b) is _ndarray and b.itemsize > itemsize:
                        itemsize = b.itemsize
                out_bytes = math.prod(shape) * itemsize  # type: ignore[arg-type]
            cost_ns = (total + out_bytes) * per_byte
        if shape is not None and cost_ns <= self._inline_ns and (cost_ns <= self._busy_ns or stays_inline()):
            policy = self.policy
            safe_point = policy.safe_point
            registry = self.registry
            # Both hooks free what the registry queued as dropped (_cleanup): with
            # nothing queued they would do nothing, so they are not called.
            dropped = registry._dropped
            if dropped:
                if safe_point is not None:
                    safe_point()
                if policy.inline_point is not None:
                    policy.inline_point()
            kernel = d._np_kernel
            cache = registry.cache
            start = _clock()
            try:
                # (a product's output is not the broadcast of its inputs: never into a recycled buffer)
                if cache is not None and largest >= cache.min_bytes and cache.cached_bytes and per_byte is not None:
                    recycled = out_for(cache, kernel, bufs) if type(kernel) is _ufunc else None
                    out = kernel(*bufs) if recycled is None else kernel(*bufs, out=recycled)  # type: ignore[misc]
                else:
                    out = kernel(*bufs)  # type: ignore[misc]
            except RuntimeWarning:  # numpy's, an exception here (_fpwarn): reported at the caller's line
                out = _fpwarn.rerun(d.name, kernel, bufs, None)
            except Exception as exc:
                self._held += HOLD_PER_OP_S  # a failing op holds the loop too: a loop of them yields
                error = kernel_error(d.name, args, exc, False)
                raise error from error.__cause__
            took = _clock() - start
            registry.kernel_seconds += took
            self._held += took + HOLD_PER_OP_S
            # A ufunc's output is a fresh array (or its out=, a cached buffer that owns its
            # memory): only other kernels may return an input as it is. setflags(False),
            # positional: a quarter of the cost of ``out.flags.writeable = False``.
            if type(out) is _ndarray and (type(kernel) is _ufunc or (out.base is None and out.flags.writeable)):
                out.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
                nbytes = out.nbytes
                # make_tensor, written out: one call less on the hottest path.
                t = _new(Tensor)
                t._engine = self
                t._registry = registry
                t._rid = registry.add(out, nbytes)
                # (without broadcasting, an element-wise op's output has the inputs' shape; out.shape is a new tuple)
                t._shape = out.shape if broadcast else shape
                t._dtype = out.dtype
                t._nbytes = nbytes
                t._label = name or d.label
                t._device = self._device
                if safe_point is not None and dropped:
                    safe_point()
                return t
            # A numpy scalar (0-d inputs), an input returned as it is: owned as _own would
            # (no memory limit to fit here), as the op's one result.
            result = normalize(out)
            tensors = [
                self._wrap(b.handle, b.shape, b.dtype, b.nbytes, d.name, name, i, result.multi, self._device)
                for i, b in enumerate(result.buffers)
            ]
            if safe_point is not None:
                safe_point()
            return tensors[0]
    return None


def adopt(self: Engine, arr: Any, name: str | None) -> Tensor | None:
    """A fresh numeric ndarray as this engine's tensor, without a copy; ``None`` to take an op (``constant``).

    For data the caller made and hands over whole, such as a request's parsed rows: the
    array must own its memory and be writeable (nobody made it read-only to keep it),
    and the caller must hold the only reference it keeps, since the array becomes the
    tensor's read-only buffer. Taken under :func:`lean`'s conditions (open on this
    loop, no yield due, numpy inline without a memory limit to fit, no device scope);
    anything else returns ``None``.
    """
    if not (
        self._lean_loop is not None
        and on_loop(self._lean_loop)
        and self._held < self._hold_s
        and (name is None or type(name) is str)
        and (not self.placed or self.device_var.get() is None)
        and type(arr) is _ndarray
        and arr.base is None
        and arr.flags.writeable
        and arr.flags.c_contiguous  # (as constant's copy would be: a Fortran-ordered array takes the copy)
        and arr.dtype.kind in NUMERIC_KINDS
    ):
        return None
    arr.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
    self._held += HOLD_PER_OP_S
    return self._register(arr, "constant", name, self._device)
