"""Entry point for `python -m harness`."""

import sys

from harness.cli import main

sys.exit(main())
