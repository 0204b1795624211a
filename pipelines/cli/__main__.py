"""`python -m pipelines.cli`: the `ortpack` command line."""

import sys

from pipelines.cli import main

sys.exit(main())
