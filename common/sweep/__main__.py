"""``python -m common.sweep``: run the command line (common.sweep.cli)."""

import sys

from common.sweep.cli import main

sys.exit(main())
