"""``python -m ctxcore``: the ``ctxcore`` command."""

import sys

from .cli import main

sys.exit(main())
