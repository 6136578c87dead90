"""`python -m gpt2lib.course build|check|reset|restore|progress`: the course tool (gpt2lib/course/__init__.py)."""

import sys

from gpt2lib.course import main

if __name__ == "__main__":
    sys.exit(main())
