"""``python -m nebula_tui``: the ``nebula`` command, for a checkout without its script."""

import sys

from .cli import main

sys.exit(main())
