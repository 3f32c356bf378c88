"""The exception tree: every error is an AioTensorError, and a familiar builtin where it fits."""

from __future__ import annotations

import pytest

import aiotensor as at


@pytest.mark.parametrize(
    ("error", "builtin"),
    [
        (at.SessionClosedError, RuntimeError),
        (at.WrongEventLoopError, RuntimeError),
        (at.InvalidArgumentError, ValueError),
        (at.InvalidDeviceError, ValueError),
        (at.ResourceExhaustedError, MemoryError),
        (at.NoSessionError, RuntimeError),
        (at.KernelError, Exception),
        (at.BackendError, Exception),
    ],
)
def test_error_bases(error: type[Exception], builtin: type[Exception]) -> None:
    assert issubclass(error, at.AioTensorError)
    assert issubclass(error, builtin)
    assert error.__doc__


async def test_kernel_memory_error_becomes_resource_exhausted(s: at.AsyncEagerSession) -> None:
    def hungry() -> None:
        raise MemoryError("Unable to allocate")

    with pytest.raises(at.ResourceExhaustedError, match=r"apply\(hungry\)"):
        await s.apply(hungry)
    assert s.stats().allocated == 0


async def test_floating_point_errors_under_errstate_raise_are_argument_errors(s: at.AsyncEagerSession) -> None:
    import numpy as np

    with (
        np.errstate(divide="raise"),
        pytest.raises(at.InvalidArgumentError, match=r"divide\(float64\[2\], 0\): divide by zero"),
    ):
        await s.divide(np.ones(2), 0)
    assert s.stats().allocated == 0
