"""Start real ortpack servers on 127.0.0.1 (random free ports) for tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningServer:
    url: str
    process: subprocess.Popen[str]
    log: Path

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def output(self) -> str:
        return self.log.read_text()


@contextmanager
def running_server(
    bundle: Path | str,
    *args: str,
    env: dict[str, str] | None = None,
    log_dir: Path,
    python: str = sys.executable,
    wait_ready: bool = True,
    cwd: Path | None = None,
) -> Iterator[RunningServer]:
    port = free_port()
    log = log_dir / f"server-{port}.log"
    with open(log, "w") as fh:
        process = subprocess.Popen(
            [python, "-m", "ortpack.serving", "--bundle", str(bundle), "--port", str(port), *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
        )
    server = RunningServer(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        if wait_ready:
            wait_until_ready(server)
        yield server
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def wait_until_ready(server: RunningServer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.output()}")
        try:
            if httpx.get(f"{server.url}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"server not ready after {timeout} s:\n{server.output()}")


# --- raw HTTP over a socket ----------------------------------------------------------------------


def read_to_close(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def parse(answer: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    headers = {k.lower(): v for k, v in headers.items()}
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}
