"""``python -m aiotensor``: the same as the ``aiotensor`` command."""

import sys

from ._cli import main

sys.exit(main())
