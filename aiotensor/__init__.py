"""aiotensor: an asyncio-native eager tensor runtime.

``async with AsyncEagerSession() as s:`` gives a session that owns every tensor buffer
it creates. Every op is a coroutine whose numpy kernel runs on a thread pool, so the
event loop stays responsive; buffers of dropped handles are freed by one of three
:class:`ResourceCleanupStrategy` values, and closing the session frees everything.
"""

import importlib.metadata as _metadata

from . import xp as xp  # the Array API namespace (a module: not in __all__)
from ._backends._base import Backend as Backend
from ._backends._base import InlineExecutor as InlineExecutor
from ._backends._base import LocalBackend as LocalBackend
from ._backends._base import PendingKernel as PendingKernel
from ._backends._blas import blas_threads as blas_threads
from ._backends._blas import set_blas_threads as set_blas_threads
from ._config import ResourceCleanupStrategy as ResourceCleanupStrategy
from ._config import SessionConfig as SessionConfig
from ._errors import AioTensorError as AioTensorError
from ._errors import BackendError as BackendError
from ._errors import IndexOutOfRangeError as IndexOutOfRangeError
from ._errors import InvalidArgumentError as InvalidArgumentError
from ._errors import InvalidDeviceError as InvalidDeviceError
from ._errors import KernelError as KernelError
from ._errors import NoSessionError as NoSessionError
from ._errors import ResourceExhaustedError as ResourceExhaustedError
from ._errors import SessionClosedError as SessionClosedError
from ._errors import WrongEventLoopError as WrongEventLoopError
from ._expr import Expr as Expr
from ._fusion._batching import BatchedFunction as BatchedFunction
from ._fusion._batching import BatchStats as BatchStats
from ._fusion._batching import batched as batched
from ._fusion._function import FusedFunction as FusedFunction
from ._fusion._function import function as function
from ._fusion._fused_ops import FusedOps as FusedOps
from ._fusion._fused_value import FusedValue as FusedValue
from ._generated_functional import *  # noqa: F403 -- the op functions, listed in _generated_functional.__all__
from ._generated_functional import __all__ as _op_names
from ._interactive import InteractiveSession as InteractiveSession
from ._kernels import BufferInfo as BufferInfo
from ._kernels import KernelResult as KernelResult
from ._loopload import LoopLoad as LoopLoad
from ._loopload import loop_load as loop_load
from ._registry import SessionStats as SessionStats
from ._session import AsyncEagerSession as AsyncEagerSession
from ._session import get_default_session as get_default_session
from ._tensor import Tensor as Tensor

try:
    __version__ = _metadata.version("aiotensor")
except _metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"

__all__ = [
    "AioTensorError",
    "AsyncEagerSession",
    "Backend",
    "BackendError",
    "BatchStats",
    "BatchedFunction",
    "BufferInfo",
    "Expr",
    "FusedFunction",
    "FusedOps",
    "FusedValue",
    "IndexOutOfRangeError",
    "InlineExecutor",
    "InteractiveSession",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "KernelError",
    "KernelResult",
    "LocalBackend",
    "LoopLoad",
    "NoSessionError",
    "PendingKernel",
    "ResourceCleanupStrategy",
    "ResourceExhaustedError",
    "SessionClosedError",
    "SessionConfig",
    "SessionStats",
    "Tensor",
    "WrongEventLoopError",
    "__version__",
    "batched",
    "blas_threads",
    "function",
    "get_default_session",
    "loop_load",
    "set_blas_threads",
    *_op_names,
]
