"""The :class:`Tensor` handle: metadata, data access, and the operators of :class:`Operand`.

A handle holds only what lets its session find the buffer (the registry and a resource
id) plus metadata. When the last reference to it goes, ``__del__`` tells the registry,
from whatever thread that happens on; the cleanup strategy decides when the buffer goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from . import _expr
from ._errors import AioTensorError, SessionClosedError
from ._expr import Operand

if TYPE_CHECKING:
    from ._protocols import EngineLike, SessionLike
    from ._registry import Registry
    from ._types import NDArray

__all__ = ["Tensor"]

_REPR_VALUES = 6


class Tensor(Operand):
    """A handle on a buffer owned by a session. Made by ops, never by users.

    Metadata (``shape``, ``dtype``, ``name``, ``device``, ``nbytes``) are plain
    properties; reading data suspends: ``await t.numpy()``. Operators and the
    ndarray-named methods (``t.sum(axis=0)``, ``t.T``) return awaitable expressions:
    ``await (a * 2.0 + 1.0)`` runs in one dispatch. Comparisons are element-wise
    (``t == 0`` is an expression); ``hash(t)`` is by identity, so tensors key dicts.
    A local tensor's value is in memory: ``float(t)``, ``t.item()``, ``t.tolist()`` and
    ``np.from_dlpack(t)`` (read-only, no copy) work without an await.
    """

    __slots__ = ("__weakref__", "_device", "_dtype", "_engine", "_label", "_nbytes", "_registry", "_rid", "_shape")

    _engine: EngineLike  # the session's Engine (a layer above: see docs/architecture.md)
    _registry: Registry
    _rid: int
    _shape: tuple[int, ...]
    _dtype: np.dtype[Any]
    _nbytes: int
    _label: str | tuple[str, int]
    _device: str

    def __init__(self) -> None:
        raise TypeError("Tensor handles are made by session ops, e.g. await session.constant(...)")

    def __del__(self) -> None:
        try:
            self._registry.notify_dropped(self._rid)
        except Exception:
            pass

    # -- copying and pickling: a handle is one owner of one buffer ------------------
    def __copy__(self) -> NoReturn:
        raise TypeError(
            "a Tensor cannot be copied: a copy would be a second owner of one buffer. Share the handle"
            " itself, or make a new tensor: await session.constant(await t.numpy())"
        )

    def __deepcopy__(self, memo: Any) -> NoReturn:
        self.__copy__()

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"tensor {self.name!r} cannot be pickled: its buffer belongs to a session of this process."
            " Pickle its value instead: await t.numpy()"
        )

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
        label = self._label
        if isinstance(label, str):
            return label
        op, i = label
        return f"{op}:{self._rid}" if i < 0 else f"{op}:{i}"

    @property
    def device(self) -> str:
        """The device the buffer lives on, e.g. ``"/cpu:0"``."""
        return self._device

    @property
    def session(self) -> SessionLike:
        """The session that owns the buffer (an :class:`AsyncEagerSession`).

        An open session lives as long as its tensors; a closed one only as long as
        something else holds it (``SessionClosedError`` here after that).
        """
        return self._engine.session

    # -- data -----------------------------------------------------------------
    async def numpy(self) -> NDArray:
        """A copy of the value, owned by the caller: it stays valid after the session closes."""
        engine = self._engine
        out = engine.fetch_now(self)  # a small local value: copied without another coroutine
        if out is None:
            (out,) = await engine.fetch([self], "numpy")
        return out

    async def eval(self, session: SessionLike | None = None) -> NDArray:
        """TF1's ``t.eval()``: the value, computed in ``session`` (default: the tensor's own)."""
        engine = self._engine if session is None else session._engine
        out = engine.fetch_now(self) if engine is self._engine else None
        if out is None:
            (out,) = await engine.fetch([self], "eval")
        return out

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> NDArray:
        # A read-only view (no copy) unless asked: nobody can change a tensor through it.
        # A view, not the buffer itself: the buffer owns its memory, so numpy would let
        # anyone set its WRITEABLE flag back; a view of a read-only base refuses that.
        arr: NDArray = self._engine.peek(self)
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"converting {arr.dtype} to {np.dtype(dtype)} needs a copy")
            return arr.astype(dtype)
        return arr.copy() if copy else arr.view()

    def __repr__(self) -> str:
        shape = "(" + ", ".join(map(str, self._shape)) + ("," if len(self._shape) == 1 else "") + ")"
        head = f"Tensor(name={self.name!r}, shape={shape}, dtype={self._dtype}, device={self._device!r}"
        try:
            arr = self._engine.peek(self)
        except SessionClosedError:
            return head + ", freed)"
        except Exception:  # a remote buffer: values are not shown without a fetch
            return head + ")"
        flat = arr.reshape(-1)
        shown = np.array2string(flat[:_REPR_VALUES], precision=4, separator=" ")
        if flat.size > _REPR_VALUES:
            shown = shown[:-1] + " ...]"
        return f"{head}, values={shown})"

    # -- concrete values, synchronously: a local buffer is in memory -------------------
    def _local(self, what: str) -> NDArray:
        try:
            arr: NDArray = self._engine.peek(self)
        except SessionClosedError:
            raise
        except AioTensorError:
            raise TypeError(
                f"{what} of tensor {self.name!r} needs its value, which lives on a remote backend:"
                f" await it first, e.g. {what}(await t.numpy())"
            ) from None
        return arr

    def __bool__(self) -> bool:
        return bool(self._local("bool"))

    def __int__(self) -> int:
        return int(self._local("int"))

    def __float__(self) -> float:
        return float(self._local("float"))

    def __complex__(self) -> complex:
        return complex(self._local("complex"))

    def __index__(self) -> int:
        return self._local("operator.index").__index__()

    def item(self) -> Any:
        """The value of a one-element tensor as a Python number (numpy's ``ndarray.item``)."""
        return self._local("item").item()

    def tolist(self) -> Any:
        """The value as nested Python lists (numpy's ``ndarray.tolist``)."""
        return self._local("tolist").tolist()

    def __dlpack__(self, **kwargs: Any) -> Any:
        """DLPack export of a read-only view of the buffer (no copy): ``np.from_dlpack(t)``."""
        view = self._local("__dlpack__").view()
        view.flags.writeable = False
        return view.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """The DLPack device of the buffer (the CPU)."""
        device: tuple[int, int] = self._local("__dlpack_device__").__dlpack_device__()
        return device

    # -- python protocols that would mislead ------------------------------------

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("a Tensor is not iterable: use await t.numpy() or await session.split(t, n)")

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d Tensor")
        return self._shape[0]


def make_tensor(
    engine: EngineLike,
    registry: Registry,
    rid: int,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    nbytes: int,
    label: str | tuple[str, int],
    device: str,
) -> Tensor:
    """A new handle (only the engine makes them)."""
    t = _new(Tensor)
    t._engine = engine
    t._registry = registry
    t._rid = rid
    t._shape = shape
    t._dtype = dtype
    t._nbytes = nbytes
    t._label = label
    t._device = device
    return t


_new = object.__new__
_expr._Tensor = Tensor  # expressions tell tensors apart from values by exact type
