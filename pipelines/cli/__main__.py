"""`python -m ortpack.pipelines.cli`: the `ortpack` command line."""

import sys

from ortpack.pipelines.cli import main

sys.exit(main())
