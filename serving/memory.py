"""Memory bounded by the work admitted, not by the number of clients.

A request's body and what it becomes (parsed texts, tokenizer encodings, token arrays; decoded
images) live until it is answered. Measured on the MiniLM bundle: 300 clients sending 2 MB bodies
at once took the process to 1,554 MB while the deployment gives the pod 1 GiB, which Kubernetes
answers by killing the pod and every request in it. So every request reserves what it will hold
before its body is read, and a reservation that does not fit is refused at once (429 with
Retry-After; the body is never read):

- the budget: `--max-memory` (default: the container's cgroup limit, else the machine's memory),
  less what the process holds once ready (the model, the runtime, both sessions warm), less a
  margin;
- a request's reservation: its declared body size times what a body of its form holds until it
  is answered (`body_expansion`: the body, its parse, the token arrays or the decoded file), then
  its decoded pixels (`PIXEL_EXPANSION`), counted from each image's header before it is decoded;
  pixels that do not fit wait for those of requests ahead of them (`passing`), which their answers
  free; all of it released when it is answered;
- for engines that tokenize, one request's preparation at a time, reserved once for the largest
  body (`PREPARING_EXPANSION`): tokenizing needs far more than it keeps, and requests are
  tokenized one at a time (serving/text.py);
- for engines of images, the model's working memory (`EngineMemory`): ONNX Runtime's arena grows
  to the most pixels run at once and keeps it; the served sessions share one (kernel/runtime.py
  `share_cpu_arena`), which grew by 11.4 bytes a pixel for MobileNetV3-small (a 12-megapixel photo:
  +137 MB, kept). A model call that would grow the arena beyond its high-water mark holds the growth
  for good; one whose growth does not fit waits until no other call runs, then runs alone and gives
  its memory back (`memory.enable_memory_arena_shrinkage`). Requests are not refused for it.

A body without a Content-Length (chunked) reserves as it arrives, chunk by chunk.
Linux only for the limits (`/sys/fs/cgroup`, `/proc`); elsewhere the budget is unbounded.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# What an admitted request holds per body byte until it is answered: the body, its JSON parse (the
# texts as Python strings) and the token arrays. Measured with a 2 MB body of 1,024 texts of ~2,000
# characters (MiniLM's tokenizer, 256 tokens each): 3.1x; 4 leaves a margin.
EXPANSION = 4.0
# The same for the bodies of image requests, by form, besides the decoded pixels (held apart,
# PIXEL_EXPANSION). Measured (bench/memory_factors.py, tracemalloc's peak while one request runs in
# a real server, bench/results/memory_factors.json): the image's bytes as the body 1.1x, base64 in
# JSON 3.6x, a v2 UINT8 tensor as JSON numbers 14.6x, as v2 binary data 1.1x; each with a margin.
# Forms: "raw" (one file as the body), "json", "v2-json", "v2-binary" (a JSON header, then data).
IMAGE_EXPANSION: Mapping[str, float] = {"raw": 1.5, "json": 4.0, "v2-json": 16.0, "v2-binary": 1.5}
# Decoded pixels (uint8), held from their decode until the request is answered; the margin is the
# EXIF rotation's copy. The float copies the graph makes are the engine's (EngineMemory).
PIXEL_EXPANSION = 1.25
# What tokenizing a body needs while it runs, per body byte: the tokenizer's encodings (offsets,
# token strings) and the id lists made of them. Measured on that body: the process grew by 67 MB
# (32x), and kept it (the allocator reuses it). Requests are tokenized one at a time, so this is
# reserved once, for the largest body the server takes.
PREPARING_EXPANSION = 32.0
MARGIN = 0.1  # of the limit, kept free for what is not a request's (the runtime's arenas, threads)
# The most of the budget decoded pixels waiting for the model may hold (more wait to be decoded): a
# decode runs ahead of the model, and with no bound a flood of 12 MP photos filled the budget with
# pixels while the model's arena could not grow (each call then ran alone, shrunk) and the last
# bodies were refused. A quarter is four such photos, two per model worker; VGA photos, hundreds.
PASSING_SHARE = 0.25
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


# glibc's malloc gives an allocation over its mmap threshold a mapping of its own, returned to the
# system when freed; but each such free raises the threshold (up to 32 MB), and larger blocks then
# come from the heap, where freed memory stays with the process. Fixing the threshold at 256 KB
# (ORTPACK_MMAP_THRESHOLD=262144) took the image flood's peak (bench/overload.py, 100 x 4000x3000
# JPEGs at once, --max-memory 1G) from 1,141-1,157 MB to 1,000-1,073 MB, but cost 23 % of the
# image-embedding throughput (74-77 against 98 requests/s at c=50; 1 MB: 88, 4 MB: 91): every
# request's pixels then get a fresh mapping, zeroed page by page. So glibc is left alone unless the
# operator asks; large bodies get mappings of their own instead (serving/http.py `read_body`).
MMAP_THRESHOLD = 0
_M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)


def return_large_blocks(threshold: int | None = None) -> bool:
    """Fix glibc's mmap threshold so that freed blocks over `threshold` bytes (default
    ORTPACK_MMAP_THRESHOLD, else MMAP_THRESHOLD; 0: leave glibc's own) go back to the system;
    False where this is not glibc or the operator set MALLOC_MMAP_THRESHOLD_."""
    if threshold is None:
        setting = os.environ.get("ORTPACK_MMAP_THRESHOLD", "")
        threshold = int(setting) if setting.isdigit() else MMAP_THRESHOLD
    if threshold <= 0 or os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to fix
        return False


def body_expansion(units: str, form: str) -> float:
    """Bytes held per body byte by a request to an engine of `units` ("tokens", "pixels") whose
    body has `form` ("raw", "json", "v2-json", "v2-binary")."""
    if units == "pixels":
        return IMAGE_EXPANSION.get(form, EXPANSION)
    return EXPANSION


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


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


_STATM: tuple[int, int] | None = None  # (pid, an open /proc/self/statm of that process)


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is missing). The file stays open and is
    read again from its start (procfs makes it anew at each read): 1.4 against 18 us a call with
    pathlib, and under image load it is read at every decoded image's reservation."""
    global _STATM
    pid = os.getpid()
    try:
        if _STATM is None or _STATM[0] != pid:  # opened after a fork: /proc/self was the parent then
            _STATM = (pid, os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        pages = int(os.pread(_STATM[1], 256, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * _PAGE


class MemoryBudget:
    """Bytes requests may hold at once; thread-safe."""

    def __init__(self, limit: int | None, resident_cap: int | None = None) -> None:
        self.limit = limit  # None: unbounded
        # the process's resident memory that memory waiting for `passing` holds also waits below (None: unchecked)
        self.resident_cap = resident_cap
        self.held = 0
        self.passing = 0  # of which held by what frees itself soon (decoded pixels on their way to the model)
        self.refused = 0
        self._freed = threading.Condition()

    @classmethod
    def for_server(cls, max_memory: int | None, max_body_bytes: int, *, tokenizes: bool = True) -> MemoryBudget:
        """What is left of `max_memory` (default the container's limit, else the machine's) after
        what the process holds now, the margin and, when the engine tokenizes, one largest body's
        preparation."""
        limit = max_memory or container_limit() or machine_memory()
        if limit is None:
            return cls(None)
        preparing = int(max_body_bytes * PREPARING_EXPANSION) if tokenizes else 0
        cap = int(limit * (1 - MARGIN))
        return cls(max(0, cap - resident_bytes() - preparing), resident_cap=cap)

    def reserve(self, n: int, *, strict: bool = False, wait_s: float = 0.0, passing: bool = False) -> bool:
        """Hold `n` more bytes if they fit (a first reservation always fits an idle budget, unless
        `strict`). One that does not fit waits up to `wait_s` for memory that is sure to be freed
        (`passing` holds: requests on their way through the model), not for memory nothing frees.

        A `passing` hold that waits also waits for the process to have room (`resident_cap`): what is
        resident can be well above what is held, since freed memory is not always given back to
        the system (glibc keeps some; ONNX Runtime's arenas keep theirs)."""
        end = time.monotonic() + wait_s
        crowded = passing and wait_s > 0
        # read before the lock: the read is a system call, which releases the GIL, and the event
        # loop takes this lock to release every answered request's memory
        resident = resident_bytes() if crowded and self.resident_cap else 0
        with self._freed:
            while not self._fits(n, strict, crowded, resident):
                left = end - time.monotonic()
                if left <= 0 or not self.passing:
                    if not strict:  # a request refused (strict reservations are the engine's: they wait)
                        self.refused += 1
                    return False
                self._freed.wait(min(left, 0.02))  # a release wakes it; the resident size is read again
                resident = resident_bytes() if crowded and self.resident_cap else 0
            self.held += n
            self.passing += n if passing else 0
            return True

    def _fits(self, n: int, strict: bool, crowded: bool, resident: int) -> bool:
        if self.limit is None:
            return True
        if self.held + n > self.limit and (self.held > 0 or strict):
            return False
        if not (crowded and self.passing):
            return True
        # while other requests' pixels pass (they will free theirs): a share of the budget, and the process's room
        if self.passing + n > self.limit * PASSING_SHARE:
            return False
        return not (self.resident_cap and resident + n > self.resident_cap)

    def release(self, n: int, passing: int = 0) -> None:
        """Give back `n` bytes, `passing` of them held as `passing`."""
        with self._freed:
            self.held = max(0, self.held - n)
            self.passing = max(0, self.passing - passing)
            self._freed.notify_all()

    def shrink(self, n: int) -> None:
        """`n` bytes more are held outside the budget's requests (a session opened after it was
        measured): the limit shrinks by them."""
        with self._freed:
            if self.limit is not None:
                self.limit = max(0, self.limit - n)


class EngineMemory:
    """The model's working memory in the budget, for engines whose batches vary in size (images).

    ONNX Runtime's arena grows to the most run on it at once and keeps it. So each arena's
    high-water mark (in the engine's units: pixels; one for all sessions when they share the
    process's arena) is tracked, starting from what its warm-up ran (already in the resident memory
    the budget was measured after); a call that would raise it holds `per_unit` bytes per unit of
    the rise in the budget for good. A rise that does not fit waits until no other call runs on any
    session, then runs alone with the arena shrunk after it (`run` yields True): its memory is given
    back, and what the budget holds is never more than its limit for long. Thread-safe: model calls
    run on worker threads."""

    def __init__(self, budget: MemoryBudget, per_unit: float, *, shared: bool = False) -> None:
        self.budget = budget
        self.per_unit = per_unit
        # `shared`: the sessions allocate from one arena (kernel/runtime.py `share_cpu_arena`), whose
        # high-water mark is the most units run at once on all of them together
        self.shared = shared
        self.high: dict[int, float] = {}  # id(session) (0: the shared arena) -> most units it has run at once
        self.running: dict[int, float] = {}  # the same key -> units running on it now
        self.calls = 0  # model calls running now, on every session
        self.grown = 0  # bytes held in the budget for arena growth
        self.shrunk = 0  # calls that ran alone and gave their memory back
        self._cond = threading.Condition()

    def _arena(self, session: object) -> int:
        return 0 if self.shared else id(session)

    def warmed(self, session: object, units: float) -> None:
        """`session` has run `units` at once already (its warm-up)."""
        key = self._arena(session)
        with self._cond:
            self.high[key] = max(self.high.get(key, 0.0), units)

    @contextmanager
    def call(self, session: object, units: float) -> Iterator[bool]:
        """Around one model call of `units` on `session`: yields whether to shrink the arena after it."""
        key = self._arena(session)
        with self._cond:
            while True:
                at_once = self.running.get(key, 0.0) + units
                rise = max(0.0, at_once - self.high.get(key, 0.0))
                growth = int(rise * self.per_unit)
                if growth == 0 or self.budget.reserve(growth, strict=True):
                    self.high[key] = max(self.high.get(key, 0.0), at_once)
                    self.grown += growth
                    shrink = False
                    break
                if self.calls == 0:  # nothing else runs: run alone, give the memory back after
                    shrink = True
                    self.shrunk += 1
                    break
                self._cond.wait(0.05)  # a call ends, or requests release budget
            self.running[key] = self.running.get(key, 0.0) + units
            self.calls += 1
        try:
            yield shrink
        finally:
            with self._cond:
                self.running[key] -= units
                self.calls -= 1
                self._cond.notify_all()


class _ShrinkingSession:
    """An ONNX Runtime session whose calls give the arena's unused memory back after them."""

    def __init__(self, session: Any) -> None:
        self._session = session

    def run(self, outputs: Any, feeds: Any, run_options: Any = None) -> Any:
        import onnxruntime as ort

        options = run_options or ort.RunOptions()
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        return self._session.run(outputs, feeds, options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class MemoryGuardedEngine:
    """A backend whose model calls go through `EngineMemory` (the batcher's, for images); `cost`
    gives a payload's units, `warmed` the most units its session's warm-up ran at once. A backend
    without a session of its own (a test's stand-in) counts as one."""

    def __init__(self, engine: Any, memory: EngineMemory, cost: Any, warmed: float) -> None:
        self._engine = engine
        self._session = getattr(engine, "session", engine)
        self.memory = memory
        self._cost = cost
        memory.warmed(self._session, warmed)

    def run(self, payloads: Any) -> Any:
        engine, session = self._engine, self._session
        with self.memory.call(session, sum(self._cost(p) for p in payloads)) as shrink:
            if shrink and session is not engine and hasattr(engine, "on"):
                engine = engine.on(_ShrinkingSession(session))
            return engine.run(payloads)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
