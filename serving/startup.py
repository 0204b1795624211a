"""Where `ortpack-serve`'s start-up time goes: when each phase began and ended, in seconds since
`main` began (the interpreter's own start and `python -m`'s are before that). Phases may overlap
(the other files are hashed while the model loads; the HTTP stack is imported meanwhile too; the
warm-up runs while the port opens). The
ready line's log record carries them (`startup`, with --log-format json; `--log-level debug` adds
a line), and bench/cold_start.py tables them:

- `imports`: the modules the options and the bundle need (pydantic, numpy);
- `fetch`: finding (or downloading and extracting) the bundle, and checking its signature;
- `manifest`: reading manifest.json;
- `verify`: hashing every file the server does not load (other variants, the report);
- `session`: reading and hashing the variant, opening its ONNX Runtime session(s);
- `node check`: replaying the probe set through the variant on this node;
- `http imports`: importing the HTTP stack (uvicorn, the app, the routes);
- `warm-up`: running every bucket shape once;
- `listen`: building the app, until the port listens.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


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
