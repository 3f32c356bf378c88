"""Large element-wise ops split in row chunks across workers, writing one output.

NumPy releases the GIL inside a ufunc's inner loop, so chunks of one large op run on
several cores at once. The output is split along its axis 0 into contiguous blocks
of rows; each chunk is ``ufunc(*inputs_chunk, out=out[lo:hi])``.

**Broadcasting rule.** An input is sliced like the output only when it has the
output's number of dimensions and the same length on axis 0; any other input (fewer
dimensions, length 1 on axis 0, a scalar) is broadcast along axis 0 and is passed
whole to every chunk. The result is therefore element for element what NumPy
computes in one call (the same inner loop on the same values).

**Executor hook.** The caller supplies ``spawn(fn)``: start ``fn`` on another worker
and return at once. The op's blocks sit in one shared queue; the spawned
participants and the calling thread each pop and run blocks until none is left, and
the op waits for the blocks, never for a participant: a worker that wakes late (tens
to hundreds of µs on this machine's VM) finds nothing left and returns, and a pool
with no free worker cannot deadlock a kernel that is itself on that pool.
:func:`executor_spawn` adapts a ``concurrent.futures`` executor; the engine's own
worker pool plugs in the same way; :func:`inline_spawn` is for tests.

**When it pays** (:data:`CHUNK_MIN_BYTES`): a chunk handed to another thread costs a
wake-up (tens of µs) and the two cores share one memory bus, so only outputs of
several MiB gain; ``benchmarks/bench_alloc.py`` measures the crossover.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextvars
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._types import NDArray
from .._ufuncs import ufunc_result

__all__ = [
    "BLOCK_BYTES",
    "CHUNK_MIN_BYTES",
    "CHUNK_MIN_US",
    "Spawn",
    "chunk_bounds",
    "chunked_ufunc",
    "executor_spawn",
    "inline_spawn",
    "should_chunk",
]

#: Start a callable on another worker soon and return at once (fire and forget).
#: The callable never raises. A hook may raise (a pool shut down): the caller then
#: does the work itself.
Spawn = Callable[[Callable[[], None]], object]

#: Output bytes from which splitting a memory-bound ufunc (add, multiply) across 2
#: workers beats one call. Measured on the 2-core development VM, otherwise idle, with
#: ``benchmarks/bench_alloc.py --sweep``: chunked/numpy(out=) 1.8x at 2 MiB, 1.1x at
#: 4 MiB, 0.86x at 8 MiB, 0.78x at 16 MiB. Two threads do not double this machine's
#: memory bandwidth (a bare two-thread split of an add measures ~0.8x), and every
#: hand-over between threads (a wake-up, a GIL transfer) costs tens of µs there.
CHUNK_MIN_BYTES = 8 << 20

#: The same crossover as a single-thread kernel time, for a cost model that
#: estimates it (compute-bound ufuncs such as exp or sin gain more per byte: ~0.6x).
CHUNK_MIN_US = 800.0

#: Output bytes per block. Smaller blocks let the caller do more of the work when a
#: worker wakes late; larger ones mean fewer GIL hand-overs. Measured at 2048x2048
#: float32: 256 KiB 1.08x, 1 MiB 0.97x, 4 MiB 0.87x, 8 MiB 0.84x numpy(out=).
BLOCK_BYTES = 4 << 20


def inline_spawn(fn: Callable[[], None]) -> None:
    """A :data:`Spawn` that runs ``fn`` now on this thread (deterministic tests)."""
    fn()


def executor_spawn(executor: concurrent.futures.Executor) -> Spawn:
    """A :data:`Spawn` on a ``concurrent.futures`` executor, in a copy of the caller's context.

    NumPy's ``errstate`` is a context variable: blocks on the worker see the caller's.
    """

    def spawn(fn: Callable[[], None]) -> object:
        return executor.submit(contextvars.copy_context().run, fn)

    return spawn


def chunk_bounds(rows: int, chunks: int) -> list[tuple[int, int]]:
    """``chunks`` contiguous ``[lo, hi)`` row ranges covering ``rows``, sizes differing by at most one."""
    chunks = max(1, min(chunks, rows))
    base, extra = divmod(rows, chunks)
    bounds = []
    lo = 0
    for i in range(chunks):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def should_chunk(out_nbytes: int, out_shape: Sequence[int], workers: int, min_bytes: int = CHUNK_MIN_BYTES) -> bool:
    """Whether an element-wise op with this output is worth splitting across ``workers``."""
    return workers > 1 and out_nbytes >= min_bytes and len(out_shape) > 0 and out_shape[0] > 1


def _same_layout(x: NDArray, out: NDArray) -> bool:
    return (
        x.shape == out.shape
        and x.strides == out.strides
        and x.__array_interface__["data"][0] == out.__array_interface__["data"][0]
    )


class _Blocks:
    """The blocks of one op, shared by its participants; knows when the last one is done."""

    __slots__ = ("done", "failed", "lock", "pending", "remaining")

    def __init__(self, blocks: list[Callable[[], object]]) -> None:
        self.pending = collections.deque(blocks)
        self.remaining = len(blocks)
        self.failed: list[BaseException] = []
        self.lock = threading.Lock()
        # Held until the last block is done; a Lock is 40x cheaper to create than an Event.
        self.done = threading.Lock()
        self.done.acquire()

    def drain(self) -> None:
        """Run blocks until none is left (never raises: errors are recorded for the caller)."""
        lock = self.lock
        while True:
            with lock:
                if not self.pending:
                    return
                block = self.pending.popleft()
            finished = 1
            try:
                block()
            except BaseException as exc:  # handed to the caller of chunked_ufunc
                with lock:
                    self.failed.append(exc)
                    finished += len(self.pending)  # the others stop at their next pop
                    self.pending.clear()
            # Its views of the inputs and the output must not outlive the op: a buffer
            # cache counts the references to a buffer before it recycles it.
            block = None  # type: ignore[assignment]
            with lock:
                self.remaining -= finished
                if self.remaining == 0:
                    self.done.release()


def chunked_ufunc(
    ufunc: np.ufunc,
    *inputs: Any,
    spawn: Spawn,
    workers: int,
    out: NDArray | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> Any:
    """``ufunc(*inputs, out=out)``, split in row blocks shared by ``workers`` participants.

    The output is cut into blocks of about ``block_bytes`` (at least ``workers``).
    ``workers - 1`` participants are spawned and the calling thread is one too; each
    pops and runs blocks until none is left, and the call returns when every block is
    done. The caller starts at once and never waits for a worker that has not
    started: a worker that wakes late finds less (or nothing) left to do, and a pool
    with no free worker only means the caller does it all.

    Args:
        ufunc: A ufunc with one output.
        inputs: Arrays and Python or NumPy scalars.
        spawn: The executor hook (see :data:`Spawn`).
        workers: Participants, the caller included (the worker count).
        out: Where to write (a recycled buffer); ``None`` allocates one with the
            shape and dtype NumPy would give.
        block_bytes: The output bytes per block.

    Returns ``out`` (or the new array); a block's exception is raised once every
    block has settled. Falls back to one plain ufunc call, which gives NumPy's own
    result or error, whenever splitting cannot be shown to be the same computation:
    several outputs, a result NumPy cannot predict, an output that is 0-d or has one
    row, or an input that may overlap ``out`` at another position.
    """
    if out is None:
        spec = ufunc_result(ufunc, inputs)
        if spec is None or workers < 2 or not spec[0] or spec[0][0] < 2:
            return ufunc(*inputs)  # NumPy's own result (a scalar for 0-d) or error
        out = np.empty(spec[0], spec[1])
    elif not isinstance(out, np.ndarray) or not isinstance(ufunc, np.ufunc) or ufunc.nout != 1:
        return ufunc(*inputs, out=out)
    oshape = out.shape
    if workers < 2 or out.ndim == 0 or oshape[0] < 2:
        return ufunc(*inputs, out=out)
    shapes = [np.shape(x) for x in inputs]
    if any(sh and sh != oshape for sh in shapes):  # broadcast_shapes costs 3 µs: only when needed
        try:
            if np.broadcast_shapes(*shapes, oshape) != oshape:
                return ufunc(*inputs, out=out)
        except ValueError:
            return ufunc(*inputs, out=out)
    sliced: list[bool] = []
    for x, shape in zip(inputs, shapes, strict=True):
        if isinstance(x, np.ndarray) and np.may_share_memory(x, out) and not _same_layout(x, out):
            # NumPy copies such an input first in a single call; blocks on two threads would race.
            return ufunc(*inputs, out=out)
        sliced.append(len(shape) == out.ndim and shape[0] == oshape[0])
    nblocks = max(workers, -(-out.nbytes // max(block_bytes, 1)))
    parts: list[Callable[[], object]] = []
    for lo, hi in chunk_bounds(oshape[0], nblocks):
        args = [x[lo:hi] if s else x for x, s in zip(inputs, sliced, strict=True)]
        parts.append(functools.partial(ufunc, *args, out=out[lo:hi]))
    blocks = _Blocks(parts)
    for _ in range(min(workers, len(parts)) - 1):
        try:
            spawn(blocks.drain)
        except Exception:  # no worker to be had (a pool shut down): this thread does it all
            break
    blocks.drain()
    blocks.done.acquire()  # every block finished (released by whoever finished the last one)
    if blocks.failed:
        raise blocks.failed[0]
    return out
