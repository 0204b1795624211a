"""Memory bounded by the work admitted, not by the number of clients.

A request's body and what it becomes (parsed texts, tokenizer encodings, token arrays; decoded
images) live until it is answered. Measured on the MiniLM bundle: 300 clients sending 2 MB bodies
at once took the process to 1,554 MB while the deployment gives the pod 1 GiB, which Kubernetes
answers by killing the pod and every request in it. So every request reserves what it will hold
before its body is read, and a reservation that does not fit is refused at once (429 with
Retry-After; the body is never read):

- the budget: `--max-memory` (default: the container's cgroup limit, else the machine's memory),
  less what the process holds once ready (the model, the runtime), less a margin;
- a request's reservation: its declared body size times `EXPANSION` (what a JSON body of texts
  holds until it is answered: the body, its parse, the token arrays), released when it is answered;
- one request's preparation at a time, reserved once for the largest body
  (`PREPARING_EXPANSION`): tokenizing needs far more than it keeps, and requests are tokenized one
  at a time (serving/text.py).

A body without a Content-Length (chunked) reserves as it arrives, chunk by chunk.
Linux only for the limits (`/sys/fs/cgroup`, `/proc`); elsewhere the budget is unbounded.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

# What an admitted request holds per body byte until it is answered: the body, its JSON parse (the
# texts as Python strings) and the token arrays. Measured with a 2 MB body of 1,024 texts of ~2,000
# characters (MiniLM's tokenizer, 256 tokens each): 3.1x; 4 leaves a margin.
EXPANSION = 4.0
# What tokenizing a body needs while it runs, per body byte: the tokenizer's encodings (offsets,
# token strings) and the id lists made of them. Measured on that body: the process grew by 67 MB
# (32x), and kept it (the allocator reuses it). Requests are tokenized one at a time, so this is
# reserved once, for the largest body the server takes.
PREPARING_EXPANSION = 32.0
MARGIN = 0.1  # of the limit, kept free for what is not a request's (the runtime's arenas, threads)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """`1073741824`, `1024M`, `1G`, `1.5GiB` -> bytes (ValueError otherwise)."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size in bytes (e.g. 1073741824, 1024M, 1G): {text!r}")
    return int(float(match[1]) * _UNITS[match[2].lower()])


def container_limit() -> int | None:
    """The memory limit of this process's cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`),
    None when there is none."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with a huge number
            return int(text)
    return None


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


class MemoryBudget:
    """Bytes requests may hold at once; thread-safe."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # None: unbounded
        self.held = 0
        self.refused = 0
        self._lock = threading.Lock()

    @classmethod
    def for_server(cls, max_memory: int | None, max_body_bytes: int) -> MemoryBudget:
        """What is left of `max_memory` (default the container's limit, else the machine's) after
        what the process holds now, the margin and one largest body's preparation."""
        limit = max_memory or container_limit() or machine_memory()
        if limit is None:
            return cls(None)
        preparing = int(max_body_bytes * PREPARING_EXPANSION)
        return cls(max(0, int(limit * (1 - MARGIN)) - resident_bytes() - preparing))

    def reserve(self, n: int) -> bool:
        """Hold `n` more bytes if they fit (a first reservation always fits an idle budget)."""
        with self._lock:
            if self.limit is not None and self.held + n > self.limit and self.held > 0:
                self.refused += 1
                return False
            self.held += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.held = max(0, self.held - n)
