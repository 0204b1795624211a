"""Where `ortpack-serve`'s start-up time goes: when each phase began and ended, in seconds since
`main` began (the interpreter's own start and `python -m`'s are before that). Phases overlap: the
bundle is verified, loaded and checked on one thread while the main one imports the HTTP stack,
and the warm-up runs while the port opens. The ready line's log record carries them (`startup`,
with --log-format json; `--log-level debug` adds a line), and bench/cold_start.py tables them:

- `imports`: the modules the options and the bundle need (pydantic, numpy);
- `fetch`: finding (or downloading and extracting) the bundle, and checking its signature;
- `manifest`: reading manifest.json;
- `verify`: checking every file the server does not load (other variants, the report); a bundle
  directory's files are hashed from the start (`Prehash`), so this mostly compares digests;
- `session`: reading and hashing the variant and the shared files, opening its session (the lone
  session opens after ready); meanwhile the probe set is read and its inputs decoded (or
  tokenized) by the variant's engine, which gets the session once it is open;
- `node check`: running the probe's payloads through the variant on this node and gating them;
- `http imports`: importing the HTTP stack (uvicorn, the app, the routes);
- `warm-up`: running every bucket shape once;
- `listen`: building the app, until the port listens.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import threading
import time
from collections.abc import Iterator
from pathlib import Path


class Timeline:
    """Start-up phases: name -> (began, ended), seconds since `origin` (a `time.perf_counter()`)."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin
        self.phases: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()  # phases end on the verify and warm-up threads too

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def record(self, name: str, began: float) -> None:
        """Phase `name` began at `began` (a `now()`) and ends now; a repeated phase (a second
        candidate variant's session) keeps its first start."""
        with self._lock:
            first = self.phases.get(name, (began, 0.0))[0]
            self.phases[name] = (min(first, began), self.now())

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = self.now()
        try:
            yield
        finally:
            self.record(name, began)

    def as_dict(self) -> dict[str, list[float]]:
        with self._lock:
            phases = sorted(self.phases.items(), key=lambda phase: phase[1])
        return {name: [round(began, 4), round(ended, 4)] for name, (began, ended) in phases}

    def summary(self) -> str:
        return ", ".join(f"{name} {a:.2f}-{b:.2f}" for name, (a, b) in self.as_dict().items())


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class Prehash:
    """The sha256 of every file in a local bundle directory, computed on a thread from the start
    of `main`: hashlib releases the GIL, so the hashing takes the core that sits idle while the
    server imports what reading the manifest needs (pydantic, numpy). The bundle's check
    (`verify_bundle`) takes a file's digest from here when the file is still the one hashed (same
    device, inode, size and modification time), and hashes it again otherwise. The files the server
    loads are read, hashed and loaded from those bytes all the same (`read_verified`)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.digests: dict[Path, tuple[tuple[int, int, int, int], str]] = {}
        self._thread = threading.Thread(target=self._run, name="ortpack-prehash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for path in sorted(self.root.rglob("*")):
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                before = _identity(path)
                digest = hashlib.sha256()
                if before[2]:  # one call per file, mapped: the GIL is released once, not per chunk
                    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                        digest.update(data)
                if _identity(path) == before:
                    self.digests[path] = (before, digest.hexdigest())
            except OSError:  # the check itself reports what is missing or unreadable
                continue

    def known(self, path: Path) -> str | None:
        """The sha256 of `path` when it is still the file hashed here (None: hash it)."""
        self._thread.join()
        known = self.digests.get(path.resolve())
        return known[1] if known is not None and known[0] == _identity(path) else None
