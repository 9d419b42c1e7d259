"""``python -m broky``: the same as the ``broky`` command."""

import sys

from broky.cli import main

sys.exit(main())
