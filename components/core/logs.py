"""Logging set-up for code that runs inside a pipeline step (KFP shows a step's stdout)."""

from __future__ import annotations

import logging
import sys
import warnings


def log_to_stdout() -> None:
    """Show ortpack's progress lines on stdout; keep third-party chatter to errors."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    logger = logging.getLogger("ortpack")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
