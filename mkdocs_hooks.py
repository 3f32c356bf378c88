"""mkdocs hook: the reST left in docstrings (Sphinx roles, ``::`` before a code block) reads well.

Some docstrings use Sphinx roles; mkdocstrings renders them as ``:class:<code>X</code>``.
This turns each into an optional mkdocs-autorefs reference to ``aiotensor.X``, which
links when the API pages document that name and stays plain code otherwise.

Docstrings introduce their examples with reST's ``::`` (which ``help()`` shows as
written); the indented block after it already renders as code, so on the site a
paragraph that is only ``::`` goes, and ``Example::`` keeps one colon.
"""

from __future__ import annotations

import re
from typing import Any

#: A paragraph that is only reST's literal-block marker, or a paragraph ending in one.
_MARKER_ALONE = re.compile(r"<p>::</p>\n?")
_MARKER_END = re.compile(r"(?<=[^:\s]):(?=:</p>)")
_ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|obj|mod):<code>~?(?P<target>[\w.]+)</code>")


def _link(match: re.Match[str]) -> str:
    target = match["target"]
    identifier = target if target.startswith("aiotensor.") else f"aiotensor.{target}"
    title = target.rsplit(".", 1)[-1] if "~" in match[0] else target
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace the roles and literal-block markers in a page's HTML (after mkdocstrings, before autorefs)."""
    html = _MARKER_END.sub("", _MARKER_ALONE.sub("", html))
    return _ROLE.sub(_link, html)
