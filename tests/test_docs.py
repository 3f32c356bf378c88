"""The docs say what the code does: the web guide's programs and answers, and an API page for every public name.

* The web guide's "A whole service" program is run as written (in process, through
  ``httpx.ASGITransport``), and each ``curl`` of the block after it is sent to it: the
  answer must be the one the guide prints. The same for the requests the guide sends to
  the example (``examples/web_service``).
* Every name of ``aiotensor.__all__`` and ``aiotensor.web.__all__`` has an entry on the
  API pages (``docs/api/*.md``): a ``:::`` directive, or a member listed under one (the
  module-level ops are documented as the session methods of the same name, as the Ops
  page says). Parsing the directives is enough: ``mkdocs build --strict`` in CI fails on
  a directive that does not resolve.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import aiotensor
from aiotensor import web

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GUIDE = DOCS / "guides" / "web-services.md"
TESTED = "<!-- tested:"


def marked_blocks(page: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of each fenced block right after a ``<!-- tested: ... -->`` comment."""
    pattern = re.compile(re.escape(TESTED) + r"[^\n]*-->\n```(\w+)\n(.*?)\n```", re.S)
    return [(m[1], m[2]) for m in pattern.finditer(page.read_text())]


def requests_of(block: str) -> list[tuple[str, str, bytes, str]]:
    """``(method, path, body, printed answer)`` of each ``curl`` in a bash block that prints one."""
    lines = block.replace("\\\n", " ").splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("curl "):
            continue
        answer = lines[i + 1].removeprefix("# ") if i + 1 < len(lines) and lines[i + 1].startswith("# ") else ""
        if not answer:
            continue
        # $(python3 -c '...') as a shell would expand it.
        line = re.sub(
            r"\$\(python3 -c '([^']*)'\)",
            lambda m: subprocess.run([sys.executable, "-c", m[1]], capture_output=True, text=True).stdout.strip(),
            line,
        )
        words = shlex.split(line)
        url = next(w for w in words if w.startswith("localhost:8000"))
        body = words[words.index("-d") + 1].encode() if "-d" in words else b""
        out.append(("POST" if "-d" in words else "GET", url.removeprefix("localhost:8000"), body, answer))
    return out


async def check_answers(app: Any, block: str) -> int:
    """Send each request of ``block`` to ``app``; the answer must read as printed (``...``: the rest elided)."""
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    requests = requests_of(block)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        for method, path, body, printed in requests:
            r = await c.request(method, path, content=body or None)
            if "..." in printed:
                assert r.text.startswith(printed.split("...")[0]), (path, body, r.text)
            else:
                assert r.json() == json.loads(printed), (path, body, r.text)
    return len(requests)


# -- the landing page ---------------------------------------------------------------------
def test_the_landing_pages_example_prints_what_the_page_says() -> None:
    text = (DOCS / "index.md").read_text()
    ((lang, program),) = marked_blocks(DOCS / "index.md")
    assert lang == "python"
    assert len(program.splitlines()) <= 15  # short
    printed = re.search(r"```python\n.*?\n```\s*prints\s*```text\n(.*?)\n```", text, re.S)
    assert printed is not None
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == printed[1].strip()


# -- the web guide --------------------------------------------------------------------
async def test_the_guides_service_runs_and_answers_as_printed(tmp_path: Path) -> None:
    blocks = marked_blocks(GUIDE)
    (lang, program), (shell, requests) = blocks[0], blocks[1]
    assert (lang, shell) == ("python", "bash")
    namespace: dict[str, Any] = {"__name__": "service"}
    exec(compile(program, str(tmp_path / "service.py"), "exec"), namespace)
    assert await check_answers(namespace["app"], requests) == 4
    # The plain Starlette version of the same handler, in the same program.
    language, starlette_version = blocks[2]
    assert language == "python"
    exec(compile(starlette_version, str(tmp_path / "service.py"), "exec"), namespace)
    assert type(namespace["app"]).__name__ == "Starlette"
    assert await check_answers(namespace["app"], requests) == 4


async def test_the_guides_requests_to_the_example_answer_as_printed() -> None:
    from examples.web_service.app import create_app

    (shell, requests) = marked_blocks(GUIDE)[3]
    assert shell == "bash"
    assert await check_answers(create_app(), requests) == 3


def test_the_guide_shows_no_answer_the_example_does_not_give() -> None:
    # The answer the guide once showed for a wrong width ("op": "matmul") is not what
    # the example says: the rows are refused by read_rows, before any op.
    text = GUIDE.read_text()
    assert '"op":"matmul"' not in text
    assert "inputs[0]: 3 values, expected 64" in text


# -- API pages ----------------------------------------------------------------------------
def documented_names() -> tuple[set[str], set[str]]:
    """``(directive targets, members listed under a directive)`` of every API page."""
    targets: set[str] = set()
    members: set[str] = set()
    for page in sorted((DOCS / "api").glob("*.md")):
        text = page.read_text()
        targets.update(re.findall(r"^::: ([\w.]+)", text, re.M))
        members.update(re.findall(r"^ {8}- (\w+)\s*$", text, re.M))
    return targets, members


def test_every_public_name_has_an_api_entry() -> None:
    targets, members = documented_names()
    missing = [
        name
        for name in aiotensor.__all__
        if name != "__version__" and f"aiotensor.{name}" not in targets and name not in members
    ]
    assert missing == [], f"add these to a page under docs/api/: {missing}"
    missing_web = [name for name in web.__all__ if f"aiotensor.web.{name}" not in targets]
    assert missing_web == [], f"add these to docs/api/web.md: {missing_web}"


def test_session_methods_named_in_the_issue_are_documented() -> None:
    _, members = documented_names()
    assert "trim" in members
    assert hasattr(aiotensor.AsyncEagerSession, "trim")


@pytest.mark.parametrize("page", sorted((DOCS / "api").glob("*.md")), ids=lambda p: p.name)
def test_every_api_directive_names_something_that_exists(page: Path) -> None:
    import importlib

    for target in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M):
        module, _, attr = target.rpartition(".")
        try:
            importlib.import_module(target)
            continue
        except ImportError:
            pass
        assert hasattr(importlib.import_module(module), attr), target
