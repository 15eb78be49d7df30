"""`python -m common compare|report …` (see common/cli.py)."""

import sys

from common.cli import main

sys.exit(main())
