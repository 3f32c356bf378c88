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


async def test_kernel_argument_errors_carry_the_op_and_its_inputs(s: at.AsyncEagerSession) -> None:
    import pickle

    import numpy as np

    x = await s.ones((2, 3), dtype=np.float32)
    with pytest.raises(at.InvalidArgumentError, match=r"matmul\(float32\[2, 3\], float64\[4, 5\]\): ") as info:
        await s.matmul(x, np.ones((4, 5)))
    assert info.value.op == "matmul"
    assert info.value.inputs == ({"dtype": "float32", "shape": [2, 3]}, {"dtype": "float64", "shape": [4, 5]})
    # Dask carries errors between processes: the attributes travel with the message.
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.op, copy.inputs, str(copy)) == (info.value.op, info.value.inputs, str(info.value))
    # Errors raised before a kernel ran say only what their message says.
    with pytest.raises(at.InvalidArgumentError, match="another session") as info:
        async with at.AsyncEagerSession() as other:
            await other.add(x, 1.0)
    assert info.value.op is None
    assert info.value.inputs == ()
    plain = at.InvalidArgumentError("made by a user")
    assert (plain.op, plain.inputs, str(plain)) == (None, (), "made by a user")
