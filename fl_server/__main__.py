"""`python -m fl_server ...` is the same as the `fl-server` command."""

from __future__ import annotations

import sys

from fl_server.cli import main

if __name__ == "__main__":
    sys.exit(main())
