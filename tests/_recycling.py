"""What the tests of the interpreter's recycler share: a large shape and a stand-in engine."""

from __future__ import annotations

import types
from typing import Any

import numpy as np

__all__ = ["BIG", "ENGINE"]

BIG = (128, 256)  # float32: 128 KiB, over MIN_BYTES
ENGINE: Any = types.SimpleNamespace(_xp=np)  # what the ops read of an engine for array arguments
