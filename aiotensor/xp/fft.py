"""``aiotensor.xp.fft``: the Array API's Fourier transform extension, lazy as the main namespace."""

from __future__ import annotations

from ._generated_fft import *  # noqa: F403 -- the one-op functions, listed in its __all__
from ._generated_fft import __all__ as _generated

__all__ = sorted(_generated)
