"""``python -m ctxcore``: the ``ctxcore`` command."""

import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C while the command is still starting up
    sys.exit(130)

sys.exit(main())
