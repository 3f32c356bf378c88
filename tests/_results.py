"""Narrowing the results of ops that may return several tensors (``apply``, fused and batched calls)."""

from __future__ import annotations

import aiotensor as at


def one(result: at.Tensor | tuple[at.Tensor, ...]) -> at.Tensor:
    """``result``, checked to be a single tensor (not a tuple of outputs)."""
    assert isinstance(result, at.Tensor), f"expected one tensor, got {type(result).__name__}"
    return result
