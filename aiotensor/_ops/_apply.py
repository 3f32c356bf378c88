"""``apply``: the users' own numpy kernels, run as one op."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import InvalidArgumentError
from ._base import OpsBase

if TYPE_CHECKING:
    from .._tensor import Tensor

__all__ = ["ApplyOps"]


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
        tensors, multi = await self._dispatch(op, fn, args, kwargs, name=None, nbytes=None, user_kernel=True)
        return tuple(tensors) if multi else tensors[0]
