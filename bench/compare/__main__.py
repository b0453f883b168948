"""`python -m bench.compare`: the same as `nmt bench` (and the entry of the engine workers)."""

import sys

from bench.compare.cli import main

sys.exit(main())
