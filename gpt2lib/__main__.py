"""`python -m gpt2lib ...`: see gpt2lib/cli.py."""

import sys

from gpt2lib.cli import main

if __name__ == "__main__":
    sys.exit(main())
