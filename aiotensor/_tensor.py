"""The :class:`Tensor` handle: metadata, data access and operators.

A handle holds only what lets its session find the buffer (the registry and a resource
id) plus metadata. When the last reference to it goes, ``__del__`` tells the registry,
from whatever thread that happens on; the cleanup strategy decides when the buffer goes.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import SessionClosedError

if TYPE_CHECKING:
    from ._registry import Registry
    from ._session import AsyncEagerSession
    from ._types import NDArray

__all__ = ["Tensor"]

_Op = Coroutine[Any, Any, "Tensor"]
_REPR_VALUES = 6


class Tensor:
    """A handle on a buffer owned by a session. Made by ops, never by users.

    Metadata (``shape``, ``dtype``, ``name``, ``device``, ``nbytes``) are plain
    properties; reading data suspends: ``await t.numpy()``. Operators return
    awaitables: ``await (a + b)``, ``await t[1:3]``.
    """

    __slots__ = ("__weakref__", "_device", "_dtype", "_name", "_nbytes", "_registry", "_rid", "_session", "_shape")

    # numpy defers to our reflected operators instead of calling __array__.
    __array_ufunc__ = None

    _session: AsyncEagerSession
    _registry: Registry
    _rid: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _nbytes: int
    _name: str
    _device: str

    def __init__(self) -> None:
        raise TypeError("Tensor handles are made by session ops, e.g. await session.constant(...)")

    @classmethod
    def _make(
        cls,
        session: AsyncEagerSession,
        registry: Registry,
        rid: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        nbytes: int,
        name: str,
        device: str,
    ) -> Tensor:
        self = object.__new__(cls)
        self._session = session
        self._registry = registry
        self._rid = rid
        self._shape = shape
        self._dtype = dtype
        self._nbytes = nbytes
        self._name = name
        self._device = device
        return self

    def __del__(self) -> None:
        try:
            self._registry.notify_dropped(self._rid)
        except Exception:
            pass

    # -- metadata -------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """The shape, as a tuple of ints."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype."""
        return self._dtype

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """The size of the buffer in bytes."""
        return self._nbytes

    @property
    def name(self) -> str:
        """The name given at creation, or the op's name with a per-session counter."""
        return self._name

    @property
    def device(self) -> str:
        """The device the buffer lives on, e.g. ``"/cpu:0"``."""
        return self._device

    @property
    def session(self) -> AsyncEagerSession:
        """The session that owns the buffer."""
        return self._session

    # -- data -----------------------------------------------------------------
    async def numpy(self) -> NDArray:
        """A copy of the value, owned by the caller: it stays valid after the session closes."""
        (value,) = await self._session._fetch([self], "numpy")
        return value

    async def eval(self, session: AsyncEagerSession | None = None) -> NDArray:
        """TF1's ``t.eval()``: the value, computed in ``session`` (default: the tensor's own)."""
        if session is None:
            session = self._session
        (value,) = await session._fetch([self], "eval")
        return value

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> NDArray:
        # A read-only view (no copy) unless asked: nobody can change a tensor through it.
        # A view, not the buffer itself: the buffer owns its memory, so numpy would let
        # anyone set its WRITEABLE flag back; a view of a read-only base refuses that.
        arr = self._session._peek(self)
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"converting {arr.dtype} to {np.dtype(dtype)} needs a copy")
            return arr.astype(dtype)
        return arr.copy() if copy else arr.view()

    def __repr__(self) -> str:
        shape = "(" + ", ".join(map(str, self._shape)) + ("," if len(self._shape) == 1 else "") + ")"
        head = f"Tensor(name={self._name!r}, shape={shape}, dtype={self._dtype}, device={self._device!r}"
        try:
            arr = self._session._peek(self)
        except SessionClosedError:
            return head + ", freed)"
        except Exception:  # a remote buffer: values are not shown without a fetch
            return head + ")"
        flat = arr.reshape(-1)
        shown = np.array2string(flat[:_REPR_VALUES], precision=4, separator=" ")
        if flat.size > _REPR_VALUES:
            shown = shown[:-1] + " ...]"
        return f"{head}, values={shown})"

    # -- python protocols that would mislead ------------------------------------
    def __bool__(self) -> bool:
        raise TypeError("the truth value of a Tensor needs its data: use bool(await t.numpy())")

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a Tensor is not iterable: use await t.numpy() or await session.split(t, n)")

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d Tensor")
        return self._shape[0]

    # -- operators: each returns an awaitable -------------------------------------
    def __add__(self, other: Any) -> _Op:
        return self._session.add(self, other)

    def __radd__(self, other: Any) -> _Op:
        return self._session.add(other, self)

    def __sub__(self, other: Any) -> _Op:
        return self._session.subtract(self, other)

    def __rsub__(self, other: Any) -> _Op:
        return self._session.subtract(other, self)

    def __mul__(self, other: Any) -> _Op:
        return self._session.multiply(self, other)

    def __rmul__(self, other: Any) -> _Op:
        return self._session.multiply(other, self)

    def __truediv__(self, other: Any) -> _Op:
        return self._session.divide(self, other)

    def __rtruediv__(self, other: Any) -> _Op:
        return self._session.divide(other, self)

    def __floordiv__(self, other: Any) -> _Op:
        return self._session.floor_divide(self, other)

    def __rfloordiv__(self, other: Any) -> _Op:
        return self._session.floor_divide(other, self)

    def __mod__(self, other: Any) -> _Op:
        return self._session.remainder(self, other)

    def __rmod__(self, other: Any) -> _Op:
        return self._session.remainder(other, self)

    def __pow__(self, other: Any) -> _Op:
        return self._session.pow(self, other)

    def __rpow__(self, other: Any) -> _Op:
        return self._session.pow(other, self)

    def __matmul__(self, other: Any) -> _Op:
        return self._session.matmul(self, other)

    def __rmatmul__(self, other: Any) -> _Op:
        return self._session.matmul(other, self)

    def __neg__(self) -> _Op:
        return self._session.negative(self)

    def __abs__(self) -> _Op:
        return self._session.abs(self)

    def __getitem__(self, key: Any) -> _Op:
        return self._session.getitem(self, key)
