"""A real container engine for the image tests: podman (made usable by images/engine.sh and
images/containers.conf) or Docker where one answers; the images built by images/build.sh; podman's
Docker-API socket for kfp.local's DockerRunner; containers started from deploy/'s specs.

Everything started here is stopped and removed by the same fixture or context manager, also when
the test fails. Where no engine can run (not root, no apt-get), the fixtures skip with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "images" / "containers.conf"
LABEL = "dev.ortpack.test"  # on every container a test starts, to find leftovers


@dataclass(frozen=True)
class Engine:
    name: str  # docker or podman
    env: dict[str, str]

    def run(
        self, *args: str, check: bool = True, timeout: float = 600, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.name, *args], capture_output=True, text=True, env=self.env, timeout=timeout, **kwargs
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{self.name} {' '.join(args[:3])} ... exited {done.returncode}: {done.stderr[-3000:]}"
            )
        return done

    def inspect(self, what: str) -> dict[str, Any]:
        return json.loads(self.run("inspect", what).stdout)[0]

    def remove_labelled(self) -> None:
        ids = self.run("ps", "-aq", "--filter", f"label={LABEL}", check=False).stdout.split()
        if ids:
            self.run("rm", "-f", *ids, check=False)


def find_engine() -> Engine:
    """The engine images/engine.sh picks (installing podman with apt-get if needed), or skip."""
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONF))}
    done = subprocess.run(
        ["bash", "-c", "source images/engine.sh && ensure_engine && echo $ENGINE"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no container engine"])[-1]
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip(f"no container engine here: {reason}")
        raise AssertionError(f"the container engine does not work: {reason}")
    return Engine(name=done.stdout.strip().splitlines()[-1], env=env)


IMAGES = ("serve", "serve-slim", "component", "steps")  # images/build.sh's names, in its order


def build_images(engine: Engine) -> dict[str, str]:
    """Build (or reuse the cached layers of) every image; return {name: TAG} for IMAGES."""
    done = subprocess.run(
        ["images/build.sh", *IMAGES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**engine.env, "ENGINE": engine.name},
        timeout=3600,
    )
    if done.returncode != 0:
        raise AssertionError(f"images/build.sh failed:\n{done.stderr[-5000:]}")
    tags = done.stdout.split()
    return dict(zip(IMAGES, tags, strict=True))


# Mounted into a container and put on PYTHONPATH: `site` imports it before anything else, and it
# records every module the interpreter compiles from source (the audit event `compile` with a
# `.py` file name: what an import does when no valid .pyc is found) and every module imported,
# into TRACE_DIR/trace-<pid>.json at exit.
IMPORT_TRACER = """\
import atexit, json, os, sys

_compiled = []


def _hook(event, args):
    if event == "compile" and len(args) > 1 and isinstance(args[1], str) and args[1].endswith(".py"):
        _compiled.append(args[1])


sys.addaudithook(_hook)


def _dump():
    modules = {name: getattr(m, "__file__", None) for name, m in list(sys.modules.items())}
    with open(os.path.join(os.environ["TRACE_DIR"], f"trace-{os.getpid()}.json"), "w") as fh:
        json.dump({"argv": sys.argv, "compiled": _compiled, "modules": modules}, fh)


atexit.register(_dump)
"""


def import_tracer(directory: Path) -> tuple[list[str], Path]:
    """`run` options that trace a container's Python (IMPORT_TRACER) into `directory`/traces, and
    that directory (readable and writable by any user)."""
    probe, traces = directory / "probe", directory / "traces"
    for path in (probe, traces):
        path.mkdir(parents=True, exist_ok=True)
    (probe / "sitecustomize.py").write_text(IMPORT_TRACER)
    os.chmod(directory, 0o755)
    os.chmod(probe, 0o755)
    os.chmod(probe / "sitecustomize.py", 0o644)
    os.chmod(traces, 0o777)
    options = [
        f"--mount=type=bind,source={probe},destination=/probe,ro=true",
        f"--mount=type=bind,source={traces},destination=/traces",
        "--env=PYTHONPATH=/probe",
        "--env=TRACE_DIR=/traces",
    ]
    return options, traces


def read_traces(traces: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(traces.glob("trace-*.json"))]


@contextlib.contextmanager
def docker_api_socket(engine: Engine, root: Path) -> Iterator[str]:
    """A DOCKER_HOST for the engine: podman's `podman system service` on a socket of our own
    (stopped afterwards), or Docker's own."""
    if engine.name == "docker":
        yield os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return
    socket = root / "podman.sock"
    log = open(root / "podman-service.log", "w")
    process = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=engine.env,
    )
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"podman system service did not start: {(root / 'podman-service.log').read_text()}"
                )
            time.sleep(0.1)
        yield f"unix://{socket}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@dataclass
class Container:
    engine: Engine
    name: str
    ports: dict[int, int]  # container port -> host port on 127.0.0.1

    def url(self, port: int = 8080) -> str:
        return f"http://127.0.0.1:{self.ports[port]}"

    def logs(self) -> str:
        done = self.engine.run("logs", self.name, check=False)
        return done.stdout + done.stderr

    def state(self) -> dict[str, Any]:
        return dict(self.engine.inspect(self.name)["State"])


@contextlib.contextmanager
def running_container(engine: Engine, image: str, args: list[str], ports: list[int]) -> Iterator[Container]:
    """`engine run -d` with `args` (options before the image), each container port published on a
    free 127.0.0.1 port; removed afterwards whatever happens."""
    name = f"ortpack-test-{uuid.uuid4().hex[:8]}"
    published = {port: free_port() for port in ports}
    publish = [f"--publish=127.0.0.1:{host}:{port}" for port, host in published.items()]
    engine.run("run", "-d", "--name", name, "--label", f"{LABEL}=1", *publish, *args, image)
    try:
        yield Container(engine=engine, name=name, ports=published)
    finally:
        engine.run("rm", "-f", "-t", "0", name, check=False)


def wait_ready(container: Container, timeout: float = 120) -> float:
    """Poll /v2/health/ready until 200; return the seconds it took (from the call)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not container.state().get("Running", False):
            raise AssertionError(f"container {container.name} exited: {container.logs()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{container.url()}/v2/health/ready", timeout=1).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"container {container.name} not ready after {timeout} s: {container.logs()[-3000:]}")


def run_args_from_pod_spec(pod: dict[str, Any], container_name: str, mounts: dict[str, str]) -> list[str]:
    """`run` options that start the named container as its pod spec says: user and group, a
    read-only root filesystem, dropped capabilities, no privilege escalation, the plain `env`
    values (optional secret references are left out: their secrets do not exist here), args, and
    the volumes it mounts: those named in `mounts` (volume name -> host path) bind-mounted
    read-only, the other emptyDirs as tmpfs of their size limit."""
    (container,) = [c for c in pod["containers"] if c["name"] == container_name]
    security = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    args = [f"--user={security['runAsUser']}:{security.get('runAsGroup', security['runAsUser'])}"]
    if security.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    if "ALL" in (security.get("capabilities") or {}).get("drop", []):
        args.append("--cap-drop=ALL")
    if security.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    for env in container.get("env", []):
        if "value" in env:
            args.append(f"--env={env['name']}={env['value']}")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if mount["name"] in mounts:
            source = mounts[mount["name"]]
            args.append(f"--mount=type=bind,source={source},destination={mount['mountPath']},ro=true")
        elif "emptyDir" in volume:
            size = volume["emptyDir"].get("sizeLimit", "64Mi").replace("Gi", "g").replace("Mi", "m")
            args.append(f"--mount=type=tmpfs,destination={mount['mountPath']},tmpfs-size={size},tmpfs-mode=1777")
        else:
            raise AssertionError(f"no host path for volume {mount['name']} (not an emptyDir)")
    return args
