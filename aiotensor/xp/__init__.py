"""``aiotensor.xp``: the Python Array API standard (2024.12), lazy, over aiotensor's op table.

Every function returns an :class:`~aiotensor.Expr` built from tensors, expressions and
Python scalars; nothing runs until it is awaited (``await xp.exp(x) + 1``), fetched with
``s.run(...)`` or evaluated with ``e.eval(session=s)``, in one dispatch. The data type
functions (``result_type``, ``can_cast``, ``finfo``, ``iinfo``, ``isdtype``) and
``__array_namespace_info__`` return Python objects directly. Tensors and expressions
give this namespace from ``x.__array_namespace__()``, so code written against the
standard (``xp = array_namespace(x)``) runs on them as on numpy arrays.

The functions come from the op table by the standard's names (``_xpnames``): a name
whose op the table does not have is absent.
"""

from __future__ import annotations

import math as _math

from .._opdef import OPS as _OPS
from .._xpnames import HAND_WRITTEN as _HAND_WRITTEN
from .._xpnames import STANDARD_VERSION as _VERSION
from . import fft as fft
from . import linalg as linalg
from ._dtypes import DTYPES as _DTYPES
from ._dtypes import can_cast as can_cast
from ._dtypes import complex64 as complex64
from ._dtypes import complex128 as complex128
from ._dtypes import finfo as finfo
from ._dtypes import float32 as float32
from ._dtypes import float64 as float64
from ._dtypes import iinfo as iinfo
from ._dtypes import int8 as int8
from ._dtypes import int16 as int16
from ._dtypes import int32 as int32
from ._dtypes import int64 as int64
from ._dtypes import isdtype as isdtype
from ._dtypes import result_type as result_type
from ._dtypes import uint8 as uint8
from ._dtypes import uint16 as uint16
from ._dtypes import uint32 as uint32
from ._dtypes import uint64 as uint64
from ._generated_main import *  # noqa: F403 -- the one-op functions, listed in its __all__
from ._generated_main import __all__ as _generated
from ._hand import NEEDS_OP as _NEEDS_OP
from ._hand import Info as Info
from ._hand import UniqueAllResult as UniqueAllResult
from ._hand import UniqueCountsResult as UniqueCountsResult
from ._hand import UniqueInverseResult as UniqueInverseResult
from ._hand import __array_namespace_info__ as __array_namespace_info__
from ._hand import arange as arange
from ._hand import asarray as asarray
from ._hand import astype as astype
from ._hand import broadcast_arrays as broadcast_arrays
from ._hand import broadcast_shapes as broadcast_shapes
from ._hand import empty as empty
from ._hand import empty_like as empty_like
from ._hand import eye as eye
from ._hand import from_dlpack as from_dlpack
from ._hand import full as full
from ._hand import full_like as full_like
from ._hand import linspace as linspace
from ._hand import matrix_transpose as matrix_transpose
from ._hand import meshgrid as meshgrid
from ._hand import ones as ones
from ._hand import ones_like as ones_like
from ._hand import positive as positive
from ._hand import unique_all as unique_all
from ._hand import unique_counts as unique_counts
from ._hand import unique_inverse as unique_inverse
from ._hand import unstack as unstack
from ._hand import zeros as zeros
from ._hand import zeros_like as zeros_like

__array_api_version__ = _VERSION

e = _math.e
pi = _math.pi
inf = _math.inf
nan = _math.nan
newaxis = None

# The hand-written functions of the main namespace (the linalg ones live in xp.linalg).
_HAND = sorted(n for n in _HAND_WRITTEN if n in globals())
for _name, _op in _NEEDS_OP.items():
    if _op not in _OPS:
        del globals()[_name]  # absent until the op table has the op
        _HAND.remove(_name)

__all__ = sorted(
    [
        *_generated,
        *_HAND,
        *_DTYPES,
        "Info",
        "UniqueAllResult",
        "UniqueCountsResult",
        "UniqueInverseResult",
        "__array_api_version__",
        "e",
        "fft",
        "inf",
        "linalg",
        "nan",
        "newaxis",
        "pi",
    ]
)

bool = _DTYPES["bool"]
