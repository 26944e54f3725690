"""``python -m dev bench|soak|catalogue`` from the repository root (see :mod:`dev.cli`)."""

import sys

from dev.cli import main

sys.exit(main())
