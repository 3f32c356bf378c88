"""The web example with its batches stamped, for ``python -m benchmarks.trace_batches`` (served from ``benchmarks/``).

Importing this module wraps, for the life of the server process, the two private
functions a batch passes through: the batch's task (``_batch_task.run``, on the loop:
flushed with its callers, then every caller resumed) and its kernel
(``BatchKernel.__call__``, on the thread that runs it: wall and CPU time, callers, parts),
and the app in an ASGI wrapper that stamps each ``POST /predict`` in and out. The
stamps (a tuple appended to a list, ~0.5 µs each) are pickled to the file named by
``AIOTENSOR_TRACE_FILE`` when the process exits. ``AIOTENSOR_TRACE_SWITCH_INTERVAL``
sets ``sys.setswitchinterval`` first (the GIL's hand-over interval).
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiotensor._fusion import _batch_task
from aiotensor._fusion._batch_kernel import BatchKernel
from aiotensor._fusion._batching import BatchedFunction

# Appended, not inserted first: examples/distributed.py would otherwise shadow the dask package.
sys.path.append(str(Path(__file__).resolve().parent.parent / "examples"))

from web_service.app import app as _example

#: (perf_counter, kind, value): "req" / "resp" (a /predict in and out of the app),
#: "flush" / "resumed" (callers; the batch's task), "kernel" ((wall s, CPU s, callers, parts)).
EVENTS: list[tuple[float, str, Any]] = []
_clock = time.perf_counter
_cpu = time.thread_time

if os.environ.get("AIOTENSOR_TRACE_SWITCH_INTERVAL"):
    sys.setswitchinterval(float(os.environ["AIOTENSOR_TRACE_SWITCH_INTERVAL"]))

_kernel_call = BatchKernel.__call__
_run = _batch_task.run


def _stamped_kernel(self: BatchKernel, xs: Any, *params: Any) -> Any:
    start, cpu = _clock(), _cpu()
    try:
        return _kernel_call(self, xs, *params)
    finally:
        end = _clock()
        EVENTS.append((end, "kernel", (end - start, _cpu() - cpu, len(xs), self.parts, threading.get_ident())))


async def _stamped_run(self: BatchedFunction, group: Any) -> None:
    EVENTS.append((_clock(), "flush", len(group.callers)))
    try:
        await _run(self, group)
    finally:
        EVENTS.append((_clock(), "resumed", len(group.callers)))


BatchKernel.__call__ = _stamped_kernel  # type: ignore[method-assign]
BatchedFunction._run = _stamped_run


async def app(scope: Any, receive: Any, send: Any) -> None:
    """The example app, each ``POST /predict`` stamped in and out."""
    if scope["type"] != "http" or scope.get("path") != "/predict":
        await _example(scope, receive, send)
        return
    EVENTS.append((_clock(), "req", None))
    try:
        await _example(scope, receive, send)
    finally:
        EVENTS.append((_clock(), "resp", None))


def _dump() -> None:
    path = os.environ.get("AIOTENSOR_TRACE_FILE")
    if path:
        Path(path).write_bytes(pickle.dumps(EVENTS))


atexit.register(_dump)
