"""Run one of the example apps as a real uvicorn process on 127.0.0.1 (for tests and benchmarks).

uvicorn gets ``--host 127.0.0.1 --port N`` with a port the OS just reported free, as a
deployment would pass them. (Handing it a bound socket with ``--fd`` would close the
race for the port, but uvicorn wraps such a socket as ``AF_UNIX``, so its connections
miss ``TCP_NODELAY`` and every small response waits ~40 ms for a delayed ACK.) If
another process takes the port in between, the server fails to start and is retried
on a new port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["EXAMPLES_DIR", "RunningServer", "serve"]

#: The directory holding the ``web_service`` package (passed to uvicorn's ``--app-dir``).
EXAMPLES_DIR = Path(__file__).resolve().parent.parent


@dataclass
class RunningServer:
    """A uvicorn process serving an app; ``log`` is its stderr once it has stopped."""

    url: str
    process: subprocess.Popen[bytes]
    log: str = ""


def _wait_until_up(server: RunningServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"uvicorn exited with code {server.process.returncode} before serving")
        try:
            if httpx.get(server.url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"uvicorn did not answer /health within {timeout} s")
        time.sleep(0.05)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown: the lifespan exit runs
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextlib.contextmanager
def serve(
    app: str,
    *,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    startup_timeout: float = 30.0,
    app_dir: Path = EXAMPLES_DIR,
    loop: str = "uvloop",
) -> Iterator[RunningServer]:
    """Serve ``app`` (``"module:attr"`` under ``app_dir``) with ``uvicorn --loop uvloop``.

    Yields once ``/health`` answers; on exit sends SIGINT and waits for the process.
    The server runs with ``-W always::ResourceWarning`` so an unclosed session shows
    up in :attr:`RunningServer.log`. ``loop="asyncio"`` serves on the default loop.
    """
    for attempt in range(3):
        port = _free_port()
        command = [
            sys.executable,
            *("-W", "always::ResourceWarning"),
            *("-m", "uvicorn", app),
            *("--app-dir", str(app_dir)),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--loop", loop, "--log-level", "warning", "--no-access-log"),
            *args,
        ]
        with tempfile.TemporaryFile() as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
            server = RunningServer(f"http://127.0.0.1:{port}", process)
            try:
                try:
                    _wait_until_up(server, startup_timeout)
                except RuntimeError:
                    log.seek(0)
                    if attempt < 2 and b"address already in use" in log.read():
                        continue  # lost the race for the port: try another
                    raise
                yield server
                return
            finally:
                _stop(process)
                log.seek(0)
                server.log = log.read().decode(errors="replace")
    raise AssertionError("unreachable")  # pragma: no cover
