"""``apply``: the users' own numpy kernels, run as one op."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import InvalidArgumentError
from .._opdef import Prepared, op


def _unshared(value: Any, refs: int) -> Any:
    # An ndarray that owns its memory is kept as the tensor's buffer (and made
    # read-only). If the user's code still holds it (a global, a cache, a closure),
    # they could set WRITEABLE back and change the tensor, and their own array would
    # turn read-only under them: copy it. ``refs`` is the count of a fresh result.
    # CPython-specific: re-check the counts on a new CPython (tests cover both cases).
    if isinstance(value, np.ndarray) and value.base is None and sys.getrefcount(value) > refs:
        return value.copy()
    return value


def view(x: Any) -> Any:
    """Buffers as read-only views (one level into lists), so no user kernel can change a tensor.

    Buffers own their memory, so numpy would let user code set WRITEABLE back on them;
    a view of a read-only base refuses that.
    """
    if isinstance(x, np.ndarray):
        return x.view()
    if type(x) in (list, tuple) and any(isinstance(e, np.ndarray) for e in x):
        return type(x)(e.view() if isinstance(e, np.ndarray) else e for e in x)
    return x


def _k_apply(xp: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    out = fn(*[view(a) for a in args], **{k: view(v) for k, v in kwargs.items()})
    if isinstance(out, tuple | list):
        # A fresh element is referenced by the sequence, ``o``, ``value`` and getrefcount's argument.
        return [_unshared(o, 4) for o in out]
    # A fresh result is referenced by ``out``, ``value`` and getrefcount's argument.
    return _unshared(out, 3)


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
    """
    if not callable(fn):
        raise InvalidArgumentError(f"apply: fn must be callable, got {type(fn).__name__}")
    return (fn, *args), kwargs or None, None
