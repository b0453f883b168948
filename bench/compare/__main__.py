"""`python -m bench.compare` (bench.compare.cli), and the entry of its engine workers."""

import sys

from bench.compare.cli import main

sys.exit(main())
