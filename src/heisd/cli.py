"""The `heisd` executable: the command line lives in `heisd.commands.runner` (one module per
command under `heisd.commands`); this top layer only starts it."""

from __future__ import annotations

import sys

from heisd.commands.runner import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
