"""A real OCI registry on 127.0.0.1 for tests: Debian's `docker-registry` (the reference distribution registry).

The `oci_registry` fixture installs the package when its binary is missing (`apt-get install -y
docker-registry`, after `apt-get update` if the first try fails), so `make test` on a fresh
machine gets it; it skips, naming the reason, only when it cannot be installed. Each registry
runs with its own config and storage directory on a free port, is waited for until `/v2/`
answers, and is stopped afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port

REGISTRY_BINARY = "/usr/bin/docker-registry"
_CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:{port}
  secret: ortpack-test-secret
{auth}"""
_HTPASSWD_AUTH = """\
auth:
  htpasswd:
    realm: ortpack-test
    path: {htpasswd}
"""


@dataclass(frozen=True)
class Registry:
    host: str  # "127.0.0.1:PORT"
    storage: Path
    log: Path

    def url(self, repository: str) -> str:
        """An `oci://` reference prefix for a repository in this registry."""
        return f"oci://{self.host}/{repository}"

    def blob_path(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes on disk (to corrupt it in tests)."""
        algorithm, _, hex_digest = digest.partition(":")
        return self.storage / "docker/registry/v2/blobs" / algorithm / hex_digest[:2] / hex_digest / "data"


def registry_binary() -> str:
    """The registry binary, installed with apt-get when missing; skips the test when that cannot be done."""
    if os.access(REGISTRY_BINARY, os.X_OK):
        return REGISTRY_BINARY
    reason = apt_install("docker-registry")
    if reason or not os.access(REGISTRY_BINARY, os.X_OK):
        pytest.skip(f"no OCI registry for this test: cannot install Debian's docker-registry ({reason or 'not found'})")
    return REGISTRY_BINARY


def apt_install(package: str) -> str:
    """Install a Debian package; return why it failed ('' on success)."""
    if shutil.which("apt-get") is None:
        return "apt-get not available"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    last = ""
    for step in ([command], [["apt-get", "update", "-q"], command]):
        for cmd in step:
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
                break
        else:
            return ""
    return last


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


def start_registry(root: Path, credentials: Credentials | None = None) -> tuple[Registry, subprocess.Popen[bytes]]:
    binary = registry_binary()
    storage, port = root / "storage", free_port()
    storage.mkdir(parents=True, exist_ok=True)
    auth = ""
    if credentials is not None:
        htpasswd = root / "htpasswd"
        htpasswd.write_text(f"{credentials.username}:{_bcrypt(credentials.password)}\n")
        auth = _HTPASSWD_AUTH.format(htpasswd=htpasswd)
    config = root / "config.yml"
    config.write_text(_CONFIG.format(storage=storage, port=port, auth=auth))
    log = root / "registry.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    registry = Registry(host=f"127.0.0.1:{port}", storage=storage, log=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://{registry.host}/v2/", timeout=1).status_code in (200, 401):
                return registry, process
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"docker-registry did not answer /v2/ within 30 s: {log.read_text()[-2000:]}")


def stop_registry(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _bcrypt(password: str) -> str:
    """A bcrypt hash for htpasswd (the registry accepts only bcrypt), from the system's libcrypt."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt  # deprecated, but in the standard library up to 3.12; libxcrypt does bcrypt

    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("no bcrypt in this system's libcrypt: cannot write an htpasswd file for the test registry")
    return hashed


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """An anonymous registry on 127.0.0.1, one per test module."""
    registry, process = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield registry
    finally:
        stop_registry(process)
