"""Logging set-up for code that runs inside a pipeline step (KFP shows a step's stdout).

A step that goes quiet is not left silent: a heartbeat line repeats what it is doing, with the
seconds since the step started, whenever no progress line came for HEARTBEAT_S seconds.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings

HEARTBEAT_S = 10.0


class _Heartbeat(logging.Handler):
    """Remembers the last progress line; a daemon thread repeats it when the step goes quiet."""

    def __init__(self, logger: logging.Logger, interval: float) -> None:
        super().__init__()
        self.logger, self.interval = logger, interval
        self.start = self.last = time.monotonic()
        self.doing = "starting"
        threading.Thread(target=self._beat, name="ortpack-heartbeat", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name != "ortpack.heartbeat":
            self.doing, self.last = record.getMessage(), time.monotonic()

    def _beat(self) -> None:
        while True:
            time.sleep(self.interval / 2)
            now = time.monotonic()
            if now - self.last >= self.interval:
                self.last = now
                doing = self.doing if len(self.doing) <= 120 else self.doing[:117] + "..."
                self.logger.getChild("heartbeat").info(
                    "still working (%.0f s in this step); last: %s", now - self.start, doing
                )


def log_to_stdout(heartbeat_s: float = HEARTBEAT_S) -> None:
    """Show ortpack's progress lines on stdout, with a heartbeat when they pause; keep third-party
    chatter to errors."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    logger = logging.getLogger("ortpack")
    logger.handlers[:] = [handler]
    if heartbeat_s > 0:
        logger.addHandler(_Heartbeat(logger, heartbeat_s))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logging.getLogger().setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
