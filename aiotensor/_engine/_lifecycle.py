"""A session's lifecycle: unopened -> (opening ->) open -> closing -> closed, and the loop it is bound to."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _defaults
from .._errors import SessionClosedError, WrongEventLoopError

if TYPE_CHECKING:
    from ._core import Engine

__all__ = ["State", "check_loop", "close", "close_now", "finalize_unclosed", "on_loop", "open", "open_now"]

_get_loop = asyncio.get_running_loop
_get_ident = threading.get_ident
_BaseLoop = asyncio.BaseEventLoop  # (its ``_thread_id``: the thread running it, None while stopped)


def on_loop(loop: Any) -> bool:
    """Whether ``loop`` runs on this thread now (``asyncio.get_running_loop() is loop``, in a coroutine).

    asyncio's loops say which thread runs them (``_thread_id``, None while stopped; a
    thread runs one loop at a time): reading it is cheaper than asking for the running
    loop, which on Python 3.11 asks the OS for the process id each time. A loop that does
    not say (uvloop) is asked for. Not the thread that opened a session: a loop may run
    in another thread later, and that thread run a loop of its own.
    """
    if isinstance(loop, _BaseLoop):
        return bool(loop._thread_id == _get_ident())  # type: ignore[attr-defined]
    return _get_loop() is loop


class State(enum.Enum):
    """A session's lifecycle: unopened -> (opening ->) open -> closing -> closed."""

    UNOPENED = "unopened"
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


_OPEN = State.OPEN
# Module constants: an enum member looked up on its class costs ~80 ns (EnumType.__getattr__).
_UNOPENED, _OPENING, _CLOSING, _CLOSED = State.UNOPENED, State.OPENING, State.CLOSING, State.CLOSED


def _let_go(self: Engine) -> None:
    # Closed: hold the session weakly, breaking the session <-> engine cycle, so a
    # closed session and all it holds (registry, policy) go when its last reference
    # does, not at the next garbage collection (20-100 µs a request in a busy service,
    # most of it full collections of what the cycles kept past the young generation).
    s = self._session
    if s is not None:
        self._session_ref = weakref.ref(s)
        self._session = None


async def open(self: Engine) -> None:
    """Open the session if it is not open yet; raise if it is closed."""
    state = self.state
    if state is _OPEN:
        return
    if state is _UNOPENED:
        try:
            loop = _get_loop()
        except RuntimeError:  # e.g. trio, directly or through anyio
            raise WrongEventLoopError(
                f"{self.session!r} needs a running asyncio event loop (asyncio or uvloop, also through"
                " anyio's asyncio backend); none runs in this thread. trio is not supported: kernel"
                " results come back as asyncio futures and IN_BACKGROUND frees from an asyncio task."
            ) from None
        if not self.backend.needs_start:
            # Nothing to await (the local backend): open now, without a task or a
            # trip through the loop, which is most of a request session's cost.
            self._open_on(loop)
            return
        self.state = _OPENING
        self._opening = loop.create_task(self._start())
    elif state is not _OPENING:
        raise SessionClosedError(f"{self.session!r} is closed")
    assert self._opening is not None
    await asyncio.shield(self._opening)


def open_now(self: Engine) -> bool:
    """Open an unopened session on the running loop if that needs no await (a local backend); whether it is open.

    A web request session is opened so when the handler asks for it: its first op
    then takes the lean path (an unopened session's op goes through :meth:`open`).
    """
    if self.state is _UNOPENED and not self.backend.needs_start:
        try:
            loop = _get_loop()
        except RuntimeError:
            return False
        self._open_on(loop)
    return self.state is _OPEN


def _open_on(self: Engine, loop: asyncio.AbstractEventLoop) -> None:
    self._bind(loop)
    self.policy.start(self.registry, loop)
    self._set_open()


def _bind(self: Engine, loop: asyncio.AbstractEventLoop) -> None:
    self._loop = loop
    self._loop_thread = threading.get_ident()


async def _start(self: Engine) -> None:
    loop = _get_loop()
    self._bind(loop)
    try:
        await self.backend.start()
    except BaseException:
        self.state = _CLOSED
        self._let_go()
        if self._closed_event is not None:
            self._closed_event.set()
        raise
    self.policy.start(self.registry, loop)
    if self.state is _OPENING:
        self._set_open()


def _set_open(self: Engine) -> None:
    self.state = _OPEN
    # One identity test on the lean path stands for "lean, open, and on its loop".
    self._lean_loop = self._loop if self._lean else None


def _wrong_loop(self: Engine) -> WrongEventLoopError:
    return WrongEventLoopError(
        f"{self.session!r} is bound to the event loop it first ran on (thread {self._loop_thread});"
        " it was used from another loop or thread. Create one session per event loop."
    )


def check_loop(self: Engine) -> None:
    """Raise WrongEventLoopError unless called on the session's loop."""
    try:
        loop = _get_loop()
    except RuntimeError:
        loop = None
    if loop is not self._loop:
        raise self._wrong_loop()


async def close(self: Engine, close_backend: Callable[[], Any] | None) -> None:
    """Refuse new ops, let in-flight ops settle, stop cleanup and free every buffer (idempotent)."""
    state = self.state
    if state is _CLOSED:
        return
    if state is _CLOSING:
        if self._closed_event is None:
            self._closed_event = asyncio.Event()
        await self._closed_event.wait()
        return
    if state is _UNOPENED:
        self.state = _CLOSED
        _defaults.replace_interactive(self.session, None)
        self._let_go()
        if close_backend is not None:
            await close_backend()
        return
    if state is _OPENING:
        assert self._opening is not None
        with contextlib.suppress(Exception):
            await asyncio.shield(self._opening)
        if self.state is _CLOSED:
            return
    if not on_loop(self._loop):  # (check_loop, inline: a running loop is certain in a coroutine)
        raise self._wrong_loop()
    self.state = _CLOSING
    self._lean_loop = None
    try:
        if self.inflight:
            self._idle = asyncio.Event()  # set by the last kernel to settle
            await self._idle.wait()
    finally:
        stopping = _end(self)
        try:
            if stopping is not None:
                await asyncio.wait([stopping])
        finally:  # also when that wait is cancelled (anyio cancels every await in a scope)
            if close_backend is not None:
                await close_backend()


def _end(self: Engine) -> asyncio.Task[None] | None:
    # The end of a close, once nothing is in flight: stop cleanup, free everything;
    # the cleanup task winding down, if any, for the caller to await.
    stopping = self.policy.stop()
    self.registry.close()
    self.state = _CLOSED
    _defaults.replace_interactive(self.session, None)
    self._let_go()
    if self._closed_event is not None:
        self._closed_event.set()
    return stopping


def close_now(self: Engine) -> bool | asyncio.Task[None]:
    """Close an open session with no kernel in flight without suspending, as :meth:`close` would.

    For a session that owns no backend (a child session: a web request's). ``False``:
    not done (another state, kernels in flight, or another loop): await :meth:`close`.
    ``True``: closed, everything freed. A task: closed and freed, and the background
    cleanup task is winding down: await it as :meth:`close` does.
    """
    if self.state is not _OPEN or self.inflight:
        return False
    try:
        if not on_loop(self._loop):
            return False
    except RuntimeError:  # (no running loop)
        return False
    self.state = _CLOSING
    self._lean_loop = None
    stopping = _end(self)
    return True if stopping is None else stopping


def finalize_unclosed(self: Engine) -> bool:
    """The session was dropped open: free everything on its loop. False if it was not open."""
    if self.state not in (_OPEN, _CLOSING):
        return False
    policy, registry, loop = self.policy, self.registry, self._loop

    def finalize() -> None:
        with contextlib.suppress(RuntimeError):  # loop already closed
            policy.stop()
        registry.close()

    if loop is not None and not loop.is_closed():
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(finalize)
            return True
    finalize()
    return True


async def _yield_held(self: Engine) -> None:
    # Inline work (ops, fused calls, expressions, small fetches) never suspends: once
    # a run of it has held the loop for the budget (HOLD_THRESHOLDS), the next piece
    # lets other tasks have the loop once. What the run dropped is freed first, so
    # the cleanup task need not wake for it.
    self._held = 0.0
    if self.policy.inline_point is not None:
        self.policy.inline_point()
    await asyncio.sleep(0)
