"""Variants of the web-service example that only the benchmark serves (``uvicorn --app-dir benchmarks``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from web_service.app import create_app

#: The op-by-op example without the disconnect watcher: what watching costs is the difference.
no_watch_app = create_app(forward="ops", cancel_on_disconnect=False)
