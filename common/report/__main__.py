"""``python -m common.report``: run the command line (common.report.cli)."""

import sys

from common.report.cli import main

sys.exit(main())
