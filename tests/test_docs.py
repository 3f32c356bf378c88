"""The docs say what the code does: the quickstart's and the web guide's programs, and an API page for every name.

* Each python block of the quickstart is run as written (a block that awaits at top level
  as a notebook cell, in ``asyncio.run``): it must print the text block the page shows
  after it, and nothing on stderr. Its ``aiotensor demo`` command is run as written, and
  its install command must be the README's.

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

import importlib
import importlib.util
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


def printed_blocks(page: Path) -> list[tuple[str, str, str | None]]:
    """``(language, code, printed)`` of each fenced block right after a ``<!-- tested: ... -->`` comment.

    ``printed`` is the text block that follows the word "prints" after it, if there is one.
    """
    pattern = re.compile(
        re.escape(TESTED) + r"[^\n]*-->\n```(\w+)\n(.*?)\n```(?:\s*prints\s*```text\n(.*?)\n```)?", re.S
    )
    return [(m[1], m[2], m[3]) for m in pattern.finditer(page.read_text())]


def marked_blocks(page: Path) -> list[tuple[str, str]]:
    """``(language, code)`` of each fenced block right after a ``<!-- tested: ... -->`` comment."""
    return [(language, code) for language, code, _ in printed_blocks(page)]


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
    ((lang, program, printed),) = printed_blocks(DOCS / "index.md")
    assert lang == "python"
    assert len(program.splitlines()) <= 15  # short
    assert printed is not None
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == printed.strip()


# -- the quickstart ----------------------------------------------------------------------
QUICKSTART = DOCS / "quickstart.md"

# Runs a block as a script, or, if it awaits at top level (a notebook cell), in asyncio.run.
RUN_BLOCK = """
import ast, asyncio, inspect, sys
code = compile(sys.stdin.read(), "quickstart.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
if code.co_flags & inspect.CO_COROUTINE:
    asyncio.run(eval(code, namespace))
else:
    exec(code, namespace)
"""


QUICKSTART_PROGRAMS = [(code, printed) for lang, code, printed in printed_blocks(QUICKSTART) if lang == "python"]


def test_every_python_block_of_the_quickstart_is_run() -> None:
    text = QUICKSTART.read_text()
    assert text.count("```python\n") == len(QUICKSTART_PROGRAMS) == 5
    assert all(printed is not None for _, printed in QUICKSTART_PROGRAMS)
    # It points on to the standard's page and the k-means example.
    assert "(xp.md)" in text
    assert "examples/kmeans.py" in text


def section_of(page: Path, code: str) -> str:
    """The ``##`` heading ``code`` is under on ``page``."""
    text = page.read_text()
    headings: list[str] = re.findall(r"^## (.+)$", text[: text.index(code)], re.M)
    return headings[-1]


@pytest.mark.parametrize(
    ("program", "printed"),
    [pytest.param(code, printed, id=section_of(QUICKSTART, code)) for code, printed in QUICKSTART_PROGRAMS],
)
def test_the_quickstarts_programs_print_what_the_page_says(program: str, printed: str | None) -> None:
    out = subprocess.run(
        [sys.executable, "-c", RUN_BLOCK], input=program, capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warning either: no expression left unevaluated, no kernel warning
    assert out.stdout.strip() == (printed or "").strip()


def test_the_quickstarts_demo_command_runs_as_written(tmp_path: Path) -> None:
    (command,) = [code for lang, code, _ in printed_blocks(QUICKSTART) if lang == "console"]
    words = shlex.split(command.removeprefix("$ "))
    assert words[:2] == ["aiotensor", "demo"]
    # python -m aiotensor is the same command, from this checkout.
    out = subprocess.run(
        [sys.executable, "-m", *words], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    for strategy in ("IN_BACKGROUND", "ON_SAFE_POINTS", "ON_SESSION_CLOSE"):
        assert strategy in out.stdout
    assert (tmp_path / "live.png").stat().st_size > 0


def test_the_quickstarts_install_command_is_the_readmes() -> None:
    readme = (ROOT / "README.md").read_text()
    demo_command = re.search(r"<!-- demo-command -->\n```bash\n(.*?)\n```", readme, re.S)
    assert demo_command is not None
    assert f"```bash\n{demo_command[1]}\n```" in QUICKSTART.read_text()


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


async def test_the_guides_stats_of_the_example_have_the_examples_keys() -> None:
    from examples.web_service.app import create_app

    after = GUIDE.read_text().split("`/stats` is built from", 1)[1]
    block = after.split("```json\n", 1)[1].split("```", 1)[0]
    shown = dict(re.findall(r'^  "(\w+)": (.*?)(?=^  "|^\})', block, re.M | re.S))
    app = create_app()
    transport = httpx.ASGITransport(app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        stats = (await c.get("/stats")).json()
    assert list(shown) == list(stats)
    for key, body in shown.items():
        if isinstance(stats[key], dict):
            keys = set(re.findall(r'"(\w+)": ', body))
            assert keys <= set(stats[key]), key
            assert "..." in body or keys == set(stats[key]), key


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
    distributed = pytest.importorskip("aiotensor.distributed")
    missing_dask = [name for name in distributed.__all__ if f"aiotensor.distributed.{name}" not in targets]
    assert missing_dask == [], f"add these to docs/api/backends.md: {missing_dask}"


def test_the_xp_page_names_the_data_types_and_constants() -> None:
    # `::: aiotensor.xp` renders the functions; dtype objects and constants have no docstring.
    from aiotensor import xp

    page = (DOCS / "api" / "xp.md").read_text()
    objects = [name for name in xp.__all__ if not callable(getattr(xp, name)) and name not in ("fft", "linalg")]
    assert "float32" in objects
    assert [name for name in objects if f"`{name}`" not in page] == []


def test_session_methods_named_in_the_issue_are_documented() -> None:
    _, members = documented_names()
    assert "trim" in members
    assert hasattr(aiotensor.AsyncEagerSession, "trim")


@pytest.mark.parametrize("page", sorted((DOCS / "api").glob("*.md")), ids=lambda p: p.name)
def test_every_api_directive_names_something_that_exists(page: Path) -> None:
    for target in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M):
        module, _, attr = target.rpartition(".")
        try:
            importlib.import_module(target)
            continue
        except ImportError:
            pass
        assert hasattr(importlib.import_module(module), attr), target


def test_the_sites_hook_hides_the_rest_markers_docstrings_put_before_code() -> None:
    # Docstrings introduce code with reST's "::" (for help()); mkdocstrings renders the
    # indented block as code already, and the marker as a paragraph of its own.
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "mkdocs_hooks.py")
    assert spec is not None
    assert spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    code = '<div class="highlight"><pre><code>x = await s.constant(1.0)\n</code></pre></div>'
    page = f"<p>The rows.</p>\n<p>::</p>\n{code}\n<p>Used bare or with options::</p>\n{code}"
    assert hooks.on_page_content(page) == f"<p>The rows.</p>\n{code}\n<p>Used bare or with options:</p>\n{code}"


@pytest.mark.parametrize(
    "page",
    [
        DOCS / "performance.md",
        ROOT / "benchmarks" / "commentary.md",
        *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
    ],
    ids=lambda p: p.name,
)
def test_the_measured_pages_speak_of_goals_without_tracker_words(page: Path) -> None:
    # The performance page is written for users: its goals are not "the issue's targets".
    text = page.read_text()
    words = r"\bissues?\b|\bissue[- ]\d|\bmoonshot\b|\btargets?\b|\bagents?\b|\bthis round\b"
    assert not re.findall(words, text, re.I)


def test_the_performance_page_carries_the_commentary_that_write_docs_inserts() -> None:
    # `python -m benchmarks --write-docs` rebuilds docs/performance.md around
    # benchmarks/commentary.md: text written into the page alone would be lost by the next run.
    commentary = (ROOT / "benchmarks" / "commentary.md").read_text().strip()
    assert commentary in (DOCS / "performance.md").read_text()


def test_the_reliability_page_counts_the_parity_cases() -> None:
    from ._parity_cases import PARITY_CASES

    page = (DOCS / "reliability.md").read_text()
    match = re.search(r"(\d+) for the (\d+) ops with a case", page)
    assert match is not None
    ops = {name for name, _, _, _ in PARITY_CASES}
    assert (int(match[1]), int(match[2])) == (len(PARITY_CASES), len(ops)), "update the Parity section"


def test_the_quickstart_names_what_each_extra_installs() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    text = " ".join((DOCS / "quickstart.md").read_text().split())
    listed = dict(re.findall(r"`\[(\w+)\]` \(([^)]*)\)", text))
    assert set(listed) >= {"demo", "web", "bench"}
    for extra, names in listed.items():
        said = {{"dask": "distributed"}.get(n.strip().lower(), n.strip().lower()) for n in names.split(",")}
        installed = {re.split(r"[<>=;\[ ]", dep, maxsplit=1)[0].lower() for dep in extras[extra]}
        assert said == installed, extra


def test_the_landing_page_names_every_library_an_extra_brings() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    table = (DOCS / "index.md").read_text().split("## Libraries it stands on", 1)[1].lower()
    for extra in ("demo", "web", "bench", "distributed"):
        for dep in extras[extra]:
            name = re.split(r"[<>=;\[ ]", dep, maxsplit=1)[0].lower()
            assert name in table, f"{name} ({extra})"


def test_the_xp_page_lists_every_function_not_generated() -> None:
    # `::: aiotensor.xp` renders the generated one-op functions; the others are listed by
    # name under it, so that their anchors are aiotensor.xp.<name>, not a private module's.
    from aiotensor import xp
    from aiotensor.xp import _generated_main

    _, members = documented_names()
    hand = [name for name in xp.__all__ if callable(getattr(xp, name)) and name not in _generated_main.__all__]
    assert "zeros" in hand
    assert [name for name in hand if name not in members] == []
