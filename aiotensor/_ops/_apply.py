"""``apply``: the users' own numpy kernels, run as one op."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import InvalidArgumentError
from ._base import OpsBase

if TYPE_CHECKING:
    from .._tensor import Tensor

__all__ = ["ApplyOps"]


def _unshared(value: Any, refs: int) -> Any:
    # An ndarray that owns its memory is kept as the tensor's buffer (and made
    # read-only). If the user's code still holds it (a global, a cache, a closure),
    # they could set WRITEABLE back and change the tensor, and their own array would
    # turn read-only under them: copy it. ``refs`` is the count of a fresh result.
    if isinstance(value, np.ndarray) and value.base is None and sys.getrefcount(value) > refs:
        return value.copy()
    return value


def _view(x: Any) -> Any:
    # Buffers own their memory, so numpy would let user code set WRITEABLE back on
    # them; a view of a read-only base refuses that, so no kernel can change a tensor.
    # Buffers sit at most one level deep (the session's _arg looks no deeper).
    if isinstance(x, np.ndarray):
        return x.view()
    if type(x) in (list, tuple) and any(isinstance(e, np.ndarray) for e in x):
        return type(x)(e.view() if isinstance(e, np.ndarray) else e for e in x)
    return x


class _UserKernel:
    """Runs a user function and copies results the function's caller may still hold.

    A class rather than a closure so that it pickles (for backends that ship kernels).
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*[_view(a) for a in args], **{k: _view(v) for k, v in kwargs.items()})
        if isinstance(out, tuple | list):
            # A fresh element is referenced by the sequence, ``o``, ``value`` and getrefcount's argument.
            return [_unshared(o, 4) for o in out]
        # A fresh result is referenced by ``out``, ``value`` and getrefcount's argument.
        return _unshared(out, 3)


class ApplyOps(OpsBase):
    """Bring your own kernel."""

    async def apply(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Tensor | tuple[Tensor, ...]:
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
        op = f"apply({getattr(fn, '__name__', type(fn).__name__)})"
        tensors, multi = await self._dispatch(
            op, _UserKernel(fn), args, kwargs, name=None, nbytes=None, user_kernel=True
        )
        return tuple(tensors) if multi else tensors[0]
