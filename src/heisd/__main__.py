"""`python -m heisd ...`: the `heisd` command where its script is not installed (e.g. a PYTHONPATH checkout)."""

import sys

from heisd.cli import main

sys.exit(main())
