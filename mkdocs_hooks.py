"""mkdocs hook: Sphinx roles left in docstrings (``:class:`X```) become API links.

Some docstrings use Sphinx roles; mkdocstrings renders them as ``:class:<code>X</code>``.
This turns each into an optional mkdocs-autorefs reference to ``aiotensor.X``, which
links when the API pages document that name and stays plain code otherwise.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|obj|mod):<code>~?(?P<target>[\w.]+)</code>")


def _link(match: re.Match[str]) -> str:
    target = match["target"]
    identifier = target if target.startswith("aiotensor.") else f"aiotensor.{target}"
    title = target.rsplit(".", 1)[-1] if "~" in match[0] else target
    return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace the roles in a page's HTML (run after mkdocstrings, before autorefs)."""
    return _ROLE.sub(_link, html)
