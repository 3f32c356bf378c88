"""``apply``: the users' own numpy kernels, run as one op."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import InvalidArgumentError
from .._kernels import read_only_view, unshared
from .._opdef import Prepared, op


def view(x: Any) -> Any:
    """Buffers as read-only views (one level into lists), so no user kernel can change a tensor.

    Buffers own their memory, so numpy would let user code set WRITEABLE back on them;
    a view of a read-only base refuses that. An expression's intermediate (writeable)
    arrives read-only too, as a tensor would.
    """
    if isinstance(x, np.ndarray):
        return read_only_view(x)
    if type(x) in (list, tuple) and any(isinstance(e, np.ndarray) for e in x):
        return type(x)(read_only_view(e) if isinstance(e, np.ndarray) else e for e in x)
    return x


def _k_apply(xp: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    out = fn(*[view(a) for a in args], **{k: view(v) for k, v in kwargs.items()})
    if isinstance(out, tuple | list):
        # A fresh element is referenced by the sequence and ``o``.
        return [unshared(o, 2) for o in out]
    # A fresh result is referenced by ``out``.
    return unshared(out, 1)


def label(fn: Any) -> str:
    """How errors name a user function: ``apply(name)``."""
    return f"apply({getattr(fn, '__name__', type(fn).__name__)})"


@op(_k_apply, returns="any", user=True)
def apply(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Prepared:
    """Run ``fn(*args, **kwargs)`` as one op, always on the backend's pool.

    Tensor arguments (also inside lists and tuples, and as keyword values) arrive
    as read-only ndarrays. An ndarray result comes back as a tensor owned by the
    session; a tuple of ndarrays as a tuple of tensors.

    Raises:
        InvalidArgumentError: ``fn`` is not callable, or returned something other
            than ndarrays (or numbers) of a numeric dtype.
        KernelError: ``fn`` raised; the original exception is the ``__cause__``.
        RuntimeWarning: numpy's floating-point warning inside ``fn`` when the caller's
            warning filters make it an error (as numpy raises it), at the caller's line.
    """
    if not callable(fn):
        raise InvalidArgumentError(f"apply: fn must be callable, got {type(fn).__name__}")
    return (fn, *args), kwargs or None, None
