"""Entry point for `python -m harness`."""

import sys

from harness.cli import main

if __name__ == "__main__":  # a spawned bench worker imports this module under another name: no run
    sys.exit(main())
