"""``python -m aiotensor``: the same as the ``aiotensor`` command."""

from __future__ import annotations

import sys

from ._cli import main

sys.exit(main())
