"""The exception tree of aiotensor.

Every error the library raises on purpose derives from :class:`AioTensorError`::

    AioTensorError
    ├── SessionClosedError        (also RuntimeError)
    ├── WrongEventLoopError       (also RuntimeError)
    ├── InvalidArgumentError      (also ValueError)
    │   └── IndexOutOfRangeError  (also IndexError)
    ├── InvalidDeviceError        (also ValueError)
    ├── ResourceExhaustedError    (also MemoryError)
    ├── NoSessionError            (also RuntimeError)
    ├── BackendError              (the backend cannot run kernels)
    └── KernelError               (a kernel raised something else)

The second base lets callers who already catch ``ValueError`` or ``MemoryError``
keep doing so.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AioTensorError",
    "BackendError",
    "IndexOutOfRangeError",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "KernelError",
    "NoSessionError",
    "ResourceExhaustedError",
    "SessionClosedError",
    "WrongEventLoopError",
]


class AioTensorError(Exception):
    """Base class of every error raised by aiotensor."""


class SessionClosedError(AioTensorError, RuntimeError):
    """Raised when a closed (or closing) session, or one of its tensors, is used."""


class WrongEventLoopError(AioTensorError, RuntimeError):
    """Raised when a session is used from an event loop or thread other than the one it is bound to.

    A session binds to the event loop it first runs on; its registry is confined to
    that loop's thread, which is what lets the hot path go without locks.
    """


class InvalidArgumentError(AioTensorError, ValueError):
    """Raised when an op gets a bad shape, dtype, value, ragged input or a foreign tensor.

    The message names the op and the shapes and dtypes involved. When the error comes
    from an op's kernel refusing its arguments, the same facts are attributes too, so
    that a service can report them without the array library's own wording.

    Attributes:
        op: The op whose kernel refused its arguments (e.g. ``"matmul"``), or ``None``
            when the error was raised before any kernel ran.
        inputs: The op's arguments as JSON-ready dicts: ``{"dtype": "float32",
            "shape": [16, 3]}`` for tensors and arrays, ``{"value": "list of 5"}`` (a
            short description) for anything else. Empty when ``op`` is ``None``.
    """

    op: str | None = None
    inputs: tuple[dict[str, Any], ...] = ()

    def __init__(self, *args: object, op: str | None = None, inputs: tuple[dict[str, Any], ...] = ()) -> None:
        super().__init__(*args)
        if op is not None:
            self.op = op
        if inputs:
            self.inputs = inputs


class IndexOutOfRangeError(InvalidArgumentError, IndexError):
    """Raised for an index or axis out of range, or a boolean mask with more dimensions than the array.

    The Array API standard names ``IndexError`` there; an ``InvalidArgumentError`` too, so
    that both kinds of ``except`` catch it.
    """


class InvalidDeviceError(AioTensorError, ValueError):
    """Raised when an op is placed on a device the backend does not have.

    Set ``SessionConfig(allow_soft_placement=True)`` to fall back to ``/cpu:0`` instead.
    """


class ResourceExhaustedError(AioTensorError, MemoryError):
    """Raised when an allocation would exceed ``memory_limit`` or the machine's memory.

    The message names the requested, live and limit bytes.
    """


class KernelError(AioTensorError):
    """Raised when a kernel fails with an error that is not about its arguments.

    Typically an exception raised by a user function given to ``apply``; the original
    exception is chained as ``__cause__``.
    """


class BackendError(AioTensorError):
    """Raised when the backend cannot run kernels at all (its executor was shut down, its cluster is gone)."""


class NoSessionError(AioTensorError, RuntimeError):
    """Raised when a module-level op finds no session: no tensor argument and no default session.

    Pass a tensor, use ``with session.as_default():``, or create an ``InteractiveSession``.
    """
