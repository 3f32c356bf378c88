"""A one-block run's helpers: its result's alignment, its ops in place as one straight-line function.

A blocked run whose rows fit one block (``_blocked_layout.Layout``) runs each op once
over whole arrays; when every op can write into the result, in place in it
(:func:`positional_out`), as one function of straight-line ufunc calls made once per
layout (:func:`straight_line`; an op that raises is found from the traceback's line,
:func:`failed_step`). Its result is asked of malloc until it is 32-byte aligned
(:func:`aligned_result`), and a float's ``absolute`` in place may be its sign bits
cleared (``SIGN_MASKS``; ``_blocked_layout.ABS_AS_BITS``): the same bits as numpy's loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._kernels import aligned_fresh

__all__ = [
    "ALIGN_FROM",
    "RESULT_TRIES",
    "SIGN_MASKS",
    "aligned_result",
    "failed_step",
    "positional_out",
    "straight_line",
]


def straight_line(
    steps: list[tuple[Any, int, int, int]], nin: int, first_op: int, template: list[Any]
) -> tuple[Callable[..., None], dict[int, int]]:
    # An in-place one-block run as one function calling its ufuncs in a straight line
    # (``f1(out, c7, out)`` ...), made once per layout. Every op's value is the result
    # itself (``out``: op k's slot is ``first_op + k``), an input is ``inputs[i]`` and a
    # constant (the typed ones' slots come after the ops') a name bound to its value in
    # ``template``: no list of values is made and nothing is stored per op. The loop over
    # ``in_place``'s tuples, its stores and the list cost ~0.5 µs of a 256x256 chain's
    # ten calls. Each step's line is kept: an op that raises is found from the traceback
    # (:func:`failed_step`), so its error names it as the loop's did.
    lines = ["def in_place(inputs, out, bits, mask):"]
    # (``__name__``: numpy's warnings from these calls are attributed to this module, as
    # they were from the loop it replaces: a user's "error" filter for aiotensor sees them)
    env: dict[str, Any] = {"__name__": __name__, "_and": _and}
    line_of: dict[int, int] = {}

    def arg(i: int) -> str:
        if i < nin:
            return f"inputs[{i}]"
        if first_op <= i < first_op + len(steps):
            return "out"
        env[f"c{i}"] = template[i]
        return f"c{i}"

    for k, (f, i, j, _) in enumerate(steps):
        env[f"f{k}"] = f
        line_of[len(lines) + 1] = k
        if j >= 0:
            lines.append(f"    f{k}({arg(i)}, {arg(j)}, out)")
        elif j == -1 or arg(i) != "out":
            lines.append(f"    f{k}({arg(i)}, out)")
        else:  # (-2: |x| of the result, its sign bits cleared: see Layout._sign_bit)
            lines.append("    _and(bits, mask, bits)")
    exec(compile("\n".join(lines), "<aiotensor in-place run>", "exec"), env)  # (names: f<k>, c<i>, inputs, out)
    return env["in_place"], line_of


def failed_step(exc: BaseException, straight: tuple[Callable[..., None], dict[int, int]]) -> int:
    # The step of ``straight`` whose line raised ``exc``, or -1.
    code = straight[0].__code__
    tb = exc.__traceback__
    line = 0
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    return straight[1].get(line, -1)


def positional_out(f: Any, args: tuple[int, ...]) -> bool:
    # Whether ``f(*args, out)`` is ``f(*args, out=out)``: an element-wise ufunc of one
    # output and as many inputs as ``args`` (one or two), but those for which numpy
    # deprecates a positional output (NumPy 2.4: maximum and minimum, of its 84 such
    # ufuncs; the parity tests, warnings as errors, would show another).
    return (
        isinstance(f, np.ufunc)
        and f.signature is None
        and f.nout == 1
        and f.nin == len(args)
        and len(args) in (1, 2)
        and f not in _KEYWORD_OUT
    )


_KEYWORD_OUT = frozenset({np.maximum, np.minimum})
_and = np.bitwise_and
#: Per float dtype: the integer dtype of its bits and the mask (0-d) that clears the sign.
SIGN_MASKS: dict[np.dtype[Any], tuple[np.dtype[Any], Any]] = {
    np.dtype(np.float32): (np.dtype(np.int32), np.array(0x7FFFFFFF, np.int32)),
    np.dtype(np.float64): (np.dtype(np.int64), np.array(0x7FFFFFFFFFFFFFFF, np.int64)),
}


def aligned_result(
    shape: tuple[int, ...], dtype: np.dtype[Any], empty: Callable[..., Any] = np.empty, tries: int = 2
) -> Any:
    # A fresh result for a one-block run, whose ops all store into it: ten ops storing
    # into a 256x256 float32 result 16 bytes off a 32-byte boundary took 35 µs against
    # 30.5 µs aligned (AVX stores across cache lines), and malloc hands a process the same
    # chunk call after call, so one process paid it on every call (the 256x256 chain's
    # "uvloop" gap). Asked again while the first is held, malloc gives another chunk; at
    # most ``tries`` chunks are asked for, the misaligned ones held until an aligned one
    # comes (then freed), else the first is the result. One retry was not enough: in
    # some benchmark processes the second chunk, from malloc's bins, was 16 bytes off as
    # well on ~85% of calls (48 mod 64, kernel 36 µs against 31 µs); with the chunks held,
    # the third or fourth comes from elsewhere. A plain array either way (the registry
    # owns it as any result); for a moment the run holds up to ``tries`` results' worth
    # (one-block runs: under ``BLOCK_FROM_ITEMS`` elements). The misaligned chunks are
    # parked (``aligned_fresh``'s ``park``: three of up to 512 KiB at most), not freed:
    # freed, malloc handed them back first at the next call, so an awaited 256x256 chain
    # asked for 3.5 chunks per call and still got a misaligned one every other call
    # (48.7 µs per await against 46.0 parked, numpy's chain 44.7, in one process).
    if math.prod(shape) * dtype.itemsize < ALIGN_FROM:
        return empty(shape, dtype)
    return aligned_fresh(shape, dtype, empty, tries, park=True)


#: Chunks a one-block run asks malloc for at most, for a 32-byte-aligned result.
RESULT_TRIES = 4
#: Results smaller than this are not checked for alignment (small arrays: the stores are few).
ALIGN_FROM = 1 << 16
