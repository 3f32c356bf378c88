"""The op library, one module per family, each op one ``@op`` entry (see ``_opdef``).

Importing this package fills :data:`aiotensor._opdef.OPS`.
"""

from . import _apply, _creation, _elementwise, _fft, _linalg, _manip, _math, _nn, _reduction, _search, _shape

__all__ = [
    "_apply",
    "_creation",
    "_elementwise",
    "_fft",
    "_linalg",
    "_manip",
    "_math",
    "_nn",
    "_reduction",
    "_search",
    "_shape",
]
