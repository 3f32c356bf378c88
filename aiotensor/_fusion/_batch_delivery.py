"""Sessions of a batched call, and each caller's rows delivered into its own.

The batch runs in the session that owns the params (the most derived session among
their tensors; if they hold no tensor, the callers' session, and only callers of one
session then share a batch): ``_engines`` finds it, and the caller's. The batch's
stacked rows and intermediates are counted there, in a
:class:`~aiotensor._programs._program.Budget`, as a fused function's are, and so are the
outputs of the callers of that session, which ``engine.call`` registers there: such a
caller takes its tensors as they are. Any other caller's rows are registered in the
caller's session (that of ``x`` if ``x`` is a tensor, else the default session, else the
params' session): by the batch's task (``_batch_task._merge``, the rows never in the
batch's session) when nothing more is done to them on the way, else, under a
``memory_limit``, a device scope or a placement log, taken out of the batch's session
by the caller (``_moved`` when nothing is to await, one output and no limit; else
``_deliver``, counting against its limit). A caller cancelled after its batch handed
its rows over drops them (``_drop_result``).
``_engines``, ``_moved`` and ``_deliver`` are plain functions on the batched function
here, bound as its methods in ``BatchedFunction``'s class body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .. import _defaults
from .._engine._lifecycle import State
from .._engine._session_rule import session_engine
from .._errors import InvalidArgumentError, NoSessionError, SessionClosedError
from .._kernels import KernelResult, info
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._engine._core import Engine
    from .._protocols import EngineLike
    from ._batching import BatchedFunction

# (names of the package's other modules: private to it)
__all__ = ["_discard", "_drop_result", "deliver", "engines", "moved"]

_OPEN = State.OPEN


def moved(
    self: BatchedFunction, engine: Engine, runner: Engine, out: Tensor | tuple[Tensor, ...]
) -> Tensor | tuple[Tensor, ...] | None:
    """The caller's result in its session when nothing is to await, else None.

    Its batch registered it there already (``_batch_task._merge``), or one output's rows
    are moved there now (no memory limit to fit them under).
    """
    first = out if isinstance(out, Tensor) else (out[0] if out else None)
    if first is not None and first._engine is engine:  # registered in its session by its batch
        if engine.state is not _OPEN:  # (closed since: its registry freed them)
            raise SessionClosedError(f"{self._label}: the session was closed while the call waited for its batch")
        return out
    if type(out) is not Tensor or engine.registry.memory_limit is not None or engine.state is not _OPEN:
        return None  # (then _deliver: it fits them under the limit, or says the session closed)
    label = self._label
    arr = runner.buffer(out, label)
    runner.discard(out)
    return engine._register(arr, label, None, engine.place(label))


async def deliver(
    self: BatchedFunction, engine: Engine, runner: Engine, out: Tensor | tuple[Tensor, ...]
) -> Tensor | tuple[Tensor, ...]:
    """The caller's rows as tensors of its own session, ``engine`` (registered in the batch's until now)."""
    label = self._label
    mine: tuple[Tensor, ...] = out if type(out) is tuple else (cast(Tensor, out),)
    arrays = [runner.buffer(t, label) for t in mine]
    _discard(mine, runner)
    if engine.state is not _OPEN:
        raise SessionClosedError(f"{label}: the session was closed while the call waited for its batch")
    device = engine.place(label)
    multi = type(out) is tuple
    result = KernelResult([info(a) for a in arrays], multi)
    tensors = await engine._own(result, label, None, None, device)
    return tuple(tensors) if multi else tensors[0]


def engines(self: BatchedFunction, x: Any, params: tuple[Any, ...]) -> tuple[Engine, Engine]:
    """The engine that owns the caller's result, and the one its batch runs in."""
    first: EngineLike | None = None  # the first tensor's among the params
    owner: EngineLike | None = None  # the most derived of theirs: it may read them all
    for p in params:
        tp = type(p)
        if tp is Tensor and p._engine is owner:  # the common case: params of one session
            continue
        for t in p if tp is list or tp is tuple else (p,):
            if type(t) is not Tensor:
                continue
            e = t._engine
            if owner is None:
                first = owner = e
            elif e is not owner and e not in owner.ancestors:
                if owner not in e.ancestors:
                    raise InvalidArgumentError(
                        f"{self._label}: params mix tensors of unrelated sessions ({owner.session!r} and {e.session!r})"
                    )
                owner = e
    engine: EngineLike
    if type(x) is Tensor:
        engine = x._engine
    else:
        default = _defaults.get_default_session()
        if default is not None:
            engine = session_engine(default)
        elif first is not None:
            engine = first
        else:
            raise NoSessionError(
                f"{self._label}: no session for the result: pass x as a tensor, put a tensor among the"
                " params, or use `with session.as_default():`"
            )
    if owner is None:
        return cast("tuple[Engine, Engine]", (engine, engine))
    if owner is not engine and owner not in engine.ancestors:
        raise InvalidArgumentError(
            f"{self._label}: the params belong to {owner.session!r}, which the result's session"
            f" {engine.session!r} cannot read; call it from that session or a child of it (parent=)"
        )
    return cast("tuple[Engine, Engine]", (engine, owner))  # (tensors see their engine as EngineLike)


def _drop_result(future: asyncio.Future[Any], runner: Engine) -> None:
    """A cancelled caller's rows, if its batch had handed them over already: dropped now, not taken."""
    if future.done() and not future.cancelled() and future.exception() is None:
        out = future.result()
        _discard((out,) if type(out) is Tensor else out, runner)


def _discard(tensors: Sequence[Tensor], runner: Engine) -> None:
    """Free tensors of the batch's session at once, whatever its strategy (their rows left it or are dropped)."""
    for t in tensors:
        runner.discard(t)
