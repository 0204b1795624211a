"""Faults, injected for real, and what each one lost: a row per fault, non-zero exit when any lost
a request or left a corrupt bundle or cache.

    python bench/faults.py [--only NAME,...] [--server-tree DIR] [--out bench/results/faults.json]

Each fault is named, injected into the real part (no mock of what is under test) and checked:

- pull (a deploy job or a server start fetching a bundle over HTTP into its cache, then verifying
  it: `kernel.sources.fetch`, `verify_bundle`, `keep`/`discard`, as `ortpack-serve` does): a store
  that answers 503, one that resets the connection half-way through the tar, one whose bytes
  differ from what was packaged, a cache on a full filesystem (a 4 MiB tmpfs), two jobs pulling
  into one cache at once (two processes), a job SIGKILLed in the middle of its download;
- package (the pipeline's last step writing the bundle: `kernel.bundle.write_bundle`): the
  filesystem filling while it writes, the process SIGKILLed in the middle of a file;
- serve (a server on the tiny text bundle): the engine raising in the middle of batches
  (in-process: the batcher's backend raises for long inputs), clients that go away mid-request
  under load, and 300 clients writing 2 MB bodies that are refused before they are read.

Every fault is followed by what must hold: each request answered (2xx, or 4xx/5xx in the JSON
error shape; a reset or no answer counts as lost), each failed pull or package a one-line error,
nothing half-written left where it would be used (no bundle at the output, no unverified
extraction reused), and the re-run (from a good store, or the same command) producing a verified
bundle. The quick faults also run in the suite (tests/test_faults.py). Prints a table and writes
`--out` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SERVER_TREE: Path | None = None  # --server-tree: the servers run from another checkout (before a change)


@dataclass
class Outcome:
    """What one fault did."""

    fault: str
    where: str  # pull, package or serve
    injected: str  # how the fault was made
    attempts: int = 0  # requests sent, or pulls / packagings run
    answered: int = 0  # answered (any status in the JSON error shape), or failed with one line
    lost: int = 0  # no answer (a reset, a hang), a traceback, or an error of more than one line
    corrupt: int = 0  # a half-written or unverified bundle or cache entry where it would be used
    seen: str = ""  # what the clients saw, what the re-run gave
    ok: bool = False

    def check(self, condition: bool, seen: str) -> Outcome:
        self.seen = seen
        self.ok = condition and self.lost == 0 and self.corrupt == 0
        return self


# ---------------------------------------------------------------- a bundle and a store

MODEL = "variants/cpu-fp32/model.onnx"


def demo_bundle(root: Path, model_bytes: int = 3 << 20) -> Path:
    """A small valid bundle (the contract's minimal manifest; the model file is random bytes:
    fetching checks files, not graphs)."""
    from ortpack.kernel.bundle import write_bundle
    from tests.models import minimal_manifest

    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "model.onnx").write_bytes(os.urandom(model_bytes))
    (src / "tokenizer.json").write_text("{}")
    files = {"variants/cpu-fp32/model.onnx": src / "model.onnx", "tokenizer.json": src / "tokenizer.json"}
    write_bundle(root / "bundle", minimal_manifest(), files)
    return root / "bundle"


def tar_bytes(bundle: Path) -> bytes:
    path = bundle.parent / "bundle.tar"
    with tarfile.open(path, "w") as tar:
        for item in sorted(bundle.rglob("*")):
            tar.add(item, arcname=item.relative_to(bundle).as_posix(), recursive=False)
    return path.read_bytes()


class Store:
    """A real HTTP server on 127.0.0.1 serving one tar at /bundle.tar, misbehaving as `mode` says:
    ok, 503, reset (half the bytes, then a TCP reset), corrupt (one byte of the model changed),
    no-length (no Content-Length: the size is unknown until the end), slow (64 KiB every 50 ms)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.mode = "ok"
        store = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                store.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/bundle.tar"

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        data = self.data
        if self.mode == "503":
            h.send_response(503)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if self.mode == "corrupt":  # a byte inside the model's data: the tar still reads
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                at = tar.getmember(MODEL).offset_data + 1000
            data = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        h.send_response(200)
        h.send_header("Content-Type", "application/x-tar")
        if self.mode != "no-length":
            h.send_header("Content-Length", str(len(data)))
        else:
            h.close_connection = True
        h.end_headers()
        if self.mode == "reset":
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()  # a reset, not a clean end
            return
        step = 1 << 16
        for offset in range(0, len(data), step):
            with contextlib.suppress(OSError):
                h.wfile.write(data[offset : offset + step])
            if self.mode == "slow":
                time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- pulling


PULL = """
import sys
from pathlib import Path
from ortpack.kernel.bundle import BundleError, verify_bundle
from ortpack.kernel.sources import fetch
try:
    fetched = fetch(sys.argv[1], Path(sys.argv[2]))
    try:
        verify_bundle(fetched.path)
    except BaseException:
        fetched.discard()
        raise
    fetched.keep()
    print("verified", fetched.path, "reused" if fetched.reused else "fetched")
except BundleError as exc:
    print("refused", exc)
    sys.exit(3)
"""


def child_env() -> dict[str, str]:
    """The environment of a pull or packaging process: this checkout importable, the store local."""
    return {**os.environ, "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1", "PYTHONPATH": str(ROOT)}


def start_pull(url: str, cache: Path) -> subprocess.Popen[str]:
    """A deploy job's pull in its own process: fetch, verify, keep or discard."""
    command = [sys.executable, "-c", PULL, url, str(cache)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())


def pull(url: str, cache: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`start_pull`, waited for."""
    job = start_pull(url, cache)
    stdout, stderr = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


def one_line_refusal(result: subprocess.CompletedProcess[str]) -> bool:
    """Exit 3 with one line that names the refusal, and no traceback."""
    return result.returncode == 3 and "Traceback" not in result.stderr and len(result.stdout.strip().splitlines()) == 1


def cache_entries(cache: Path) -> dict[str, list[str]]:
    """The cache's extractions, marked (verified) or not, and staging directories."""
    names = sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []
    return {
        "verified": [n for n in names if n.endswith(".verified")],
        "extractions": [n for n in names if n.startswith("bundle-") and not n.endswith(".verified")],
        "staging": [n for n in names if n.startswith(".")],
    }


def unverified_extractions(cache: Path) -> int:
    """Extractions without their verified mark: what a later start would have to redo."""
    entries = cache_entries(cache)
    return sum(1 for e in entries["extractions"] if f"{e}.verified" not in entries["verified"])


def pull_fault(name: str, mode: str, injected: str, work: Path) -> Outcome:
    """`mode` at the store, then a pull (refused in one line, nothing unverified left), then the
    store healed and the pull again (verified)."""
    bundle = demo_bundle(work)
    store = Store(tar_bytes(bundle))
    cache = work / "cache"
    out = Outcome(name, "pull", injected, attempts=1)
    try:
        store.mode = mode
        first = pull(store.url, cache)
        out.answered += one_line_refusal(first)
        out.lost += not one_line_refusal(first)
        out.corrupt += unverified_extractions(cache)
        store.mode = "ok"
        again = pull(store.url, cache)
        out.attempts += 1
        out.answered += again.returncode == 0
        out.lost += again.returncode != 0
    finally:
        store.close()
    said = first.stdout.strip().replace(store.url, "URI")
    return out.check(again.returncode == 0, f"{said} | re-run: {again.stdout.split()[0]}")


def pull_full_disk(work: Path) -> Outcome:
    """The cache on a 4 MiB tmpfs and a 6 MiB tar without a Content-Length (so no space check can
    refuse it first): the write fails with ENOSPC in the middle."""
    out = Outcome("pull: cache filesystem full", "pull", "4 MiB tmpfs, 6 MiB tar of unknown length", attempts=1)
    bundle = demo_bundle(work, model_bytes=6 << 20)
    store = Store(tar_bytes(bundle))
    store.mode = "no-length"
    cache = work / "small"
    cache.mkdir()
    with tmpfs(cache, "4m") as mounted:
        if not mounted:
            store.close()
            return out.check(True, "skipped: cannot mount a tmpfs here (needs root)")
        try:
            first = pull(store.url, cache)
            out.answered += one_line_refusal(first)
            out.lost += not one_line_refusal(first)
            entries = cache_entries(cache)
            out.corrupt += unverified_extractions(cache) + len(entries["staging"])
            free = shutil.disk_usage(cache).free
        finally:
            store.close()
    return out.check(
        "No space left" in first.stdout and free > 3 << 20,
        f"{first.stdout.strip().replace(store.url, 'URI')} | left in the cache: {sum(map(len, entries.values()))}",
    )


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[bool]:
    """A tmpfs of `size` mounted at `path` (False when mounting is not allowed)."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    try:
        yield mounted.returncode == 0
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def two_pulls_one_cache(work: Path) -> Outcome:
    bundle = demo_bundle(work)
    store = Store(tar_bytes(bundle))
    store.mode = "slow"  # both are under way at once
    cache = work / "cache"
    out = Outcome("pull: two jobs, one cache", "pull", "two processes pull one URI into one cache at once", attempts=2)
    try:
        jobs = [start_pull(store.url, cache) for _ in range(2)]
        results = [job.communicate(timeout=120)[0].strip() for job in jobs]
    finally:
        store.close()
    verified = [r for r in results if r.startswith("verified")]
    out.answered, out.lost = len(verified), 2 - len(verified)
    entries = cache_entries(cache)
    out.corrupt = unverified_extractions(cache)
    how = sorted(r.split()[-1] for r in verified)
    return out.check(
        len(entries["extractions"]) == 1 and how == ["fetched", "reused"],
        f"{' and '.join(how)}; cache: {len(entries['extractions'])} extraction, {len(entries['verified'])} verified",
    )


def pull_killed(work: Path) -> Outcome:
    bundle = demo_bundle(work)
    store = Store(tar_bytes(bundle))
    store.mode = "slow"
    cache = work / "cache"
    out = Outcome("pull: job killed mid-download", "pull", "SIGKILL 0.5 s into a slow download, then the job again")
    try:
        job = start_pull(store.url, cache)
        deadline = time.monotonic() + 60
        while not cache_entries(cache)["staging"] and time.monotonic() < deadline:  # the download began
            time.sleep(0.05)
        time.sleep(0.5)
        job.send_signal(signal.SIGKILL)
        job.wait()
        out.corrupt += unverified_extractions(cache)
        left = cache_entries(cache)["staging"]
        store.mode = "ok"
        again = pull(store.url, cache)
    finally:
        store.close()
    out.attempts, out.answered, out.lost = 1, int(again.returncode == 0), int(again.returncode != 0)
    return out.check(
        again.returncode == 0 and "fetched" in again.stdout,
        f"killed with {len(left)} staging dir(s) left; re-run: {again.stdout.split()[0] if again.stdout else '?'}",
    )


# ---------------------------------------------------------------- packaging


PACKAGE = """
import sys
from pathlib import Path
from ortpack.kernel.bundle import BundleError, write_bundle
from tests.models import minimal_manifest
src, out = Path(sys.argv[1]), Path(sys.argv[2])
try:
    write_bundle(out, minimal_manifest(), {"variants/cpu-fp32/model.onnx": src / "model.onnx",
                                           "tokenizer.json": src / "tokenizer.json"}, force=True)
    print("written", out)
except BundleError as exc:
    print("refused", exc)
    sys.exit(3)
"""


def package(src: Path, out_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PACKAGE, str(src), str(out_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
    )


def verified(bundle: Path) -> bool:
    from ortpack.kernel.bundle import BundleError, verify_bundle

    try:
        verify_bundle(bundle)
    except BundleError:
        return False
    return True


def package_killed(work: Path) -> Outcome:
    """SIGKILL once the 256 MiB model file is being copied into the staging directory."""
    out = Outcome("package: step killed mid-write", "package", "SIGKILL while the bundle's model file is copied")
    src = work / "src"
    src.mkdir(parents=True)
    (src / "tokenizer.json").write_text("{}")
    (src / "model.onnx").write_bytes(os.urandom(1 << 20) * 256)
    dest = work / "dist" / "demo"
    dest.parent.mkdir()
    job = package(src, dest)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and job.poll() is None:
        if any((staged / "variants").is_dir() for staged in dest.parent.glob(".demo.*")):
            break
        time.sleep(0.001)
    job.send_signal(signal.SIGKILL)
    job.wait()
    left = sorted(p.name for p in dest.parent.iterdir())
    out.corrupt += dest.exists()  # a half bundle at the output
    again = package(src, dest)
    again.communicate(timeout=120)
    staging = [p.name for p in dest.parent.iterdir() if p.name.startswith(".")]
    out.attempts, out.answered = 1, int(again.returncode == 0 and verified(dest))
    out.lost = 1 - out.answered
    return out.check(
        bool(left) and staging == [],
        f"killed: {len(left)} staging dir, nothing at the output; re-run verified, staging left: {staging}",
    )


def package_full_disk(work: Path) -> Outcome:
    out = Outcome("package: filesystem full", "package", "the bundle written to a 4 MiB tmpfs, its model 6 MiB")
    src = work / "src"
    src.mkdir(parents=True)
    (src / "tokenizer.json").write_text("{}")
    (src / "model.onnx").write_bytes(os.urandom(6 << 20))
    dist = work / "dist"
    dist.mkdir()
    with tmpfs(dist, "4m") as mounted:
        if not mounted:
            return out.check(True, "skipped: cannot mount a tmpfs here (needs root)")
        job = package(src, dist / "demo")
        stdout, stderr = job.communicate(timeout=120)
        left = sorted(p.name for p in dist.iterdir())
    out.attempts = 1
    one_line = job.returncode == 3 and "Traceback" not in stderr and len(stdout.strip().splitlines()) == 1
    out.answered, out.lost, out.corrupt = int(one_line), int(not one_line), len(left)
    reason = stdout.strip().split(": ", 1)[-1].split(" (")[0]
    return out.check("No space left" in stdout, f"refused: {reason} | left: {left}")


# ---------------------------------------------------------------- serving


POISON_TOKENS = 40  # the raising engine refuses any batch holding an input this long


class RaisingBackend:
    """The real backend, raising (as an ONNX Runtime error would) for any batch that holds an input
    of POISON_TOKENS tokens or more."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run(self, payloads: Any) -> Any:
        if any(len(getattr(p, "ids", p)) >= POISON_TOKENS for p in payloads):
            raise RuntimeError("injected fault: [ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code")
        return self.inner.run(payloads)


def engine_raises(bundle: Path) -> Outcome:
    """40 concurrent requests, 4 of them poisoned, batched together: the 36 others are answered."""
    from tests.fakes import in_process, metric

    out = Outcome("serve: engine raises mid-batch", "serve", "the model call raises for batches with a long input")

    async def body() -> tuple[list[tuple[int, Any]], int, float]:
        async with in_process(bundle, backend=RaisingBackend, max_batch_size=16, max_batch_ms=20) as s:
            texts = ["word " * 60 if i % 10 == 3 else f"short text {i}" for i in range(40)]
            answers = await asyncio.gather(*(s.client.post("/v1/embeddings", json={"input": t}) for t in texts))
            ready = await s.client.get("/v2/health/ready")
            errors = metric(s.metrics(), 'ortpack_model_errors_total{scope="batch"}')
            errors += metric(s.metrics(), 'ortpack_model_errors_total{scope="request"}')
            return [(a.status_code, a.json()) for a in answers], ready.status_code, errors

    answers, ready, errors = asyncio.run(body())
    shaped = [code for code, doc in answers if code == 200 or isinstance(doc.get("error"), dict)]
    out.attempts, out.answered = len(answers), len(shaped)
    out.lost = len(answers) - len(shaped)
    codes = [code for code, _ in answers]
    return out.check(
        codes.count(200) == 36 and codes.count(500) == 4 and ready == 200 and errors >= 1,
        f"{codes.count(200)} x 200, {codes.count(500)} x 500 (JSON), ready {ready}, model errors counted {errors:.0f}",
    )


def server_process(bundle: Path) -> contextlib.AbstractContextManager[tuple[int, Any]]:
    """`ortpack-serve` on `bundle` in its own process (from --server-tree when given): (port, psutil.Process)."""
    from bench.overload import server

    tree = SERVER_TREE or ROOT
    return server([sys.executable, "-m", "ortpack.serving", "--bundle", str(bundle)], tree, {"PYTHONPATH": str(tree)})


def gone_under_load(bundle: Path) -> Outcome:
    """20 clients each send 200 texts; 10 of them close their connection right after sending."""
    import httpx
    import psutil

    from bench.overload import request_bytes

    out = Outcome("serve: clients gone mid-request", "serve", "10 of 20 clients close after sending 200 texts")
    body = json.dumps({"input": [f"document {i} about search and retrieval" for i in range(200)]}).encode()
    head, data = request_bytes("/v1/embeddings", body)

    async def leave(port: int) -> None:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head + data)
        await writer.drain()
        writer.close()

    async def stay(port: int) -> int:
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(f"http://127.0.0.1:{port}/v1/embeddings", content=body)
            return answer.status_code

    with server_process(bundle) as (port, proc):

        async def run() -> list[Any]:
            return await asyncio.gather(
                *(leave(port) for _ in range(10)), *(stay(port) for _ in range(10)), return_exceptions=True
            )

        results = asyncio.run(run())
        statuses = [r for r in results[10:] if isinstance(r, int)]
        time.sleep(1.0)
        ready = httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    out.attempts = 10
    out.answered = sum(1 for s in statuses if s == 200)
    out.lost = 10 - out.answered + int(not alive)
    return out.check(ready == 200, f"{out.answered} of the 10 that stayed answered 200; ready {ready}")


def refused_before_the_body(bundle: Path) -> Outcome:
    """300 clients write 2 MB bodies at once, each asking for a 10 ms deadline it cannot meet: every
    request is refused (429) from its headers, before its body is read, while the clients still
    write. A reset instead of the 429 is a lost answer."""
    from bench.overload import exchange, request_bytes

    out = Outcome("serve: 300 x 2 MB refused early", "serve", "300 clients at once, 429 before the body is read")
    body = json.dumps({"input": ["x" * 2000] * 1000}).encode()
    head, data = request_bytes("/v1/embeddings", body)
    head = head.replace(b"\r\n\r\n", b"\r\nx-request-timeout: 0.01\r\n\r\n", 1)

    with server_process(bundle) as (port, _):

        async def run() -> list[tuple[int, dict[str, str], float]]:
            return await asyncio.gather(*(exchange(port, (head, data), 120) for _ in range(300)))

        statuses = [status for status, _, _ in asyncio.run(run())]
    out.attempts = len(statuses)
    out.answered = sum(1 for s in statuses if s != 0)
    out.lost = statuses.count(0)
    return out.check(
        statuses.count(429) >= 290,
        f"{statuses.count(429)} x 429, {statuses.count(0)} resets, others {sorted(set(statuses) - {0, 429})}",
    )


# ---------------------------------------------------------------- the catalogue


def quick_faults() -> dict[str, Callable[[Path], Outcome]]:
    """The faults that need no server process: the suite runs these (tests/test_faults.py)."""
    return {
        "pull-503": lambda w: pull_fault("pull: store answers 503", "503", "HTTP 503 for the tar", w),
        "pull-reset": lambda w: pull_fault("pull: store resets mid-body", "reset", "half the tar, then a TCP reset", w),
        "pull-corrupt": lambda w: pull_fault(
            "pull: bytes differ from the digest", "corrupt", "one byte of the model changed in the tar", w
        ),
        "pull-full-disk": pull_full_disk,
        "pull-two-jobs": two_pulls_one_cache,
        "pull-killed": pull_killed,
        "package-killed": package_killed,
        "package-full-disk": package_full_disk,
    }


def serve_faults() -> dict[str, Callable[[Path], Outcome]]:
    """The server's faults, on a text bundle (`tiny_bundle` in the suite)."""
    return {"engine-raises": engine_raises, "clients-gone": gone_under_load, "refused-early": refused_before_the_body}


def tiny_bundle(work: Path) -> Path:
    """The suite's tiny text bundle (tests/conftest.py: tiny_bundle), fp32 only."""
    from ortpack.components.core.export import export_model
    from ortpack.components.core.optimize import optimize_model
    from ortpack.components.core.package import package_dirs
    from ortpack.components.core.parity import validate_variant
    from ortpack.components.core.specs import ExportSpec, VariantSpec
    from ortpack.components.core.tasks import thresholds_for
    from tests.models import make_tiny_bert

    model = make_tiny_bert(work / "tiny-bert")
    export = work / "export"
    export_model(ExportSpec(source=str(model), task="text-embedding", name="tiny-bert"), export)
    variant = VariantSpec(target="cpu", precision="fp32")
    optimize_model(export, variant, work / variant.id)
    validate_variant(work / variant.id, export, thresholds_for("text-embedding", "fp32"))
    package_dirs(export, [work / variant.id], work / "dist" / "tiny-bert")
    return work / "dist" / "tiny-bert"


def table(rows: list[Outcome]) -> str:
    from bench.serve_load import table as render

    header = ["fault", "injected", "attempts", "answered", "lost", "corrupt", "ok", "what was seen"]
    body = [
        [r.fault, r.injected, str(r.attempts), str(r.answered), str(r.lost), str(r.corrupt), "yes" if r.ok else "NO",
         r.seen]
        for r in rows
    ]  # fmt: skip
    return render([header, *body])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated fault keys (pull-503, engine-raises, ...)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults.json"))
    parser.add_argument(
        "--server-tree", default="", help="run the server processes from this checkout (git worktree add DIR REV)"
    )
    args = parser.parse_args()
    global SERVER_TREE
    SERVER_TREE = Path(args.server_tree).resolve() if args.server_tree else None
    only = {k.strip() for k in args.only.split(",") if k.strip()}
    quick, serve = quick_faults(), serve_faults()
    unknown = only - set(quick) - set(serve)
    if unknown:
        parser.error(f"unknown faults {sorted(unknown)}; known: {', '.join([*quick, *serve])}")
    rows: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="ortpack-faults-") as tmp:
        root = Path(tmp)
        for key, run in quick.items():
            if not only or key in only:
                rows.append(run(root / key))
                print(f"  {rows[-1].fault}: {'ok' if rows[-1].ok else 'FAILED'} ({rows[-1].seen})", flush=True)
        chosen = [key for key in serve if not only or key in only]
        if chosen:
            bundle = tiny_bundle(root / "tiny")
            for key in chosen:
                rows.append(serve[key](bundle))
                print(f"  {rows[-1].fault}: {'ok' if rows[-1].ok else 'FAILED'} ({rows[-1].seen})", flush=True)
    print()
    print(table(rows))
    from ortpack.kernel.hardware import this_machine

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": this_machine().summary(), "cores": len(os.sched_getaffinity(0)), "arch": platform.machine()},
    }
    out.write_text(json.dumps({**meta, "faults": [asdict(r) for r in rows]}, indent=2) + "\n")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
