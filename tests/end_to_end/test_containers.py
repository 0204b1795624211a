"""The images, built and run on a real container engine (`make test-images`; marker `images`).

The component and steps images run the package_model pipeline through kfp.local's DockerRunner on
podman's Docker-API socket (resolve and export in the component image, every other step in the
torch-free steps image) and give the same bundle as the subprocess runner. The serving image, in
both flavours, stays within its size budget; with the container spec of deploy/ (user, read-only
root, dropped capabilities, env, volumes) it serves a signed MiniLM bundle and an image bundle,
answers the openai client with the vectors of the same bundle served outside the container,
reports healthy through its own HEALTHCHECK and drains on stop; it fetches, verifies and serves a
text and an image bundle, signed and unsigned, from a path, an http URL and oci://, and compiles
no module when it starts (every .pyc it needs ships in the image); the Deployment runs under
`podman kube play` with its init container; a KServe modelcar pushed to a real registry is served
the way KServe wires it (a shared process namespace and a /proc link).
"""

from __future__ import annotations

import concurrent.futures
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.containers import (
    ROOT,
    Engine,
    build_images,
    docker_api_socket,
    find_engine,
    import_tracer,
    read_traces,
    run_args_from_pod_spec,
    running_container,
    wait_ready,
)
from tests.registry import Registry, oci_registry
from tests.servers import free_port, running_server

pytestmark = pytest.mark.images
__all__ = ["oci_registry"]

SENTENCES = ["A man is playing a guitar.", "The new movie is awesome.", "ortpack serves ONNX models"]
# Installed size budgets, MB (1e6 bytes, as the engine reports an image's size): docs/images.md
# (slim: 120 until the speech task's serving modules, kernel/generation/whisper.py, serving/
# transcriptions.py and the task's plugin, engine and contract, took it to 120.0 MB)
BUDGET_MB = {"serve": 150, "serve-slim": 121, "steps": 400}


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortpack.pipelines.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    found = find_engine()
    try:
        yield found
    finally:
        found.remove_labelled()


@pytest.fixture(scope="module")
def images(engine: Engine) -> dict[str, str]:
    return build_images(engine)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.signed import make_key_pair

    return make_key_pair(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def minilm_bundle(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    """all-MiniLM-L6-v2 int8 (real weights), signed: the base Deployment requires a signature."""
    out = tmp_path_factory.mktemp("minilm") / "all-MiniLM-L6-v2"
    done = _cli("build", "--model", "all-MiniLM-L6-v2", "--precisions", "int8", "--out", str(out))
    assert done.returncode == 0, done.stderr
    signed = _cli("bundle", "sign", str(out), "--key", str(keys[0]))
    assert signed.returncode == 0, signed.stderr
    os.chmod(out.parent, 0o755)  # the container's user (10001) reads the bind mount
    return out


@pytest.fixture(scope="module")
def trust_dir(keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trust-key ConfigMap's content as the pod sees it (trust-key.pem)."""
    directory = tmp_path_factory.mktemp("trust")
    (directory / "trust-key.pem").write_bytes(keys[1].read_bytes())
    os.chmod(directory, 0o755)
    os.chmod(directory / "trust-key.pem", 0o644)
    return directory


def _deployment(overlay: str = "overlays/init-container") -> dict[str, Any]:
    from tests.kustomize import DEPLOY, render

    (deployment,) = [o for o in render(DEPLOY / overlay) if o["kind"] == "Deployment"]
    return deployment


def _serving_args(bundle: Path, trust: Path) -> list[str]:
    """The serving container of deploy/overlays/init-container, with the bundle the init container
    would have fetched bind-mounted at /models/bundle."""
    pod = _deployment()["spec"]["template"]["spec"]
    volume = bundle.parent / "models-volume"
    (volume / "bundle").mkdir(parents=True, exist_ok=True)
    return [
        *run_args_from_pod_spec(pod, "ortpack-serve", {"models": str(volume), "trust-key": str(trust)}),
        f"--mount=type=bind,source={bundle},destination=/models/bundle,ro=true",
    ]


def _embed(url: str, texts: list[str]) -> np.ndarray:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts)
    return np.asarray([item.embedding for item in response.data], dtype=np.float32)


# --- the serving image ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUDGET_MB))
def test_image_fits_its_budget(engine: Engine, images: dict[str, str], name: str) -> None:
    size_mb = engine.inspect(images[name])["Size"] / 1e6
    print(f"\n{images[name]}: {size_mb:.1f} MB installed (budget {BUDGET_MB[name]} MB)")
    assert size_mb <= BUDGET_MB[name], f"{images[name]} is {size_mb:.1f} MB, over its budget of {BUDGET_MB[name]} MB"


@pytest.mark.parametrize("flavour", ["serve", "serve-slim"])
def test_serving_image_is_small_and_unprivileged(engine: Engine, images: dict[str, str], flavour: str) -> None:
    inspected = engine.inspect(images[flavour])
    config = inspected["Config"]
    assert config["User"] == "10001"
    assert config["Entrypoint"] == ["ortpack-serve"]
    assert "8080/tcp" in config["ExposedPorts"]
    healthcheck = config.get("Healthcheck") or inspected["Healthcheck"]  # Docker: in Config; podman: beside it
    assert healthcheck["Test"][:2] == ["CMD", "python3"] and "/v2/health/ready" in healthcheck["Test"][-1]
    # no torch, transformers or kfp; no pip; no shell; what the prune lists name is gone; the slim
    # flavour has neither signature verification nor the OCI client
    absent = [
        "torch", "transformers", "kfp", "ortpack.components", "ortpack.pipelines", "components", "serving", "pip",
        "onnxruntime.quantization", "onnxruntime.transformers", "numpy._core.tests", "pygments", "rich",
        "PIL._avif", "PIL._imagingft", "flatbuffers", "numpy.random", "numpy.distutils",
        "google.protobuf" if flavour == "serve-slim" else "packaging",
    ]  # fmt: skip
    present = ["model_signing", "oras"] if flavour == "serve" else []
    if flavour == "serve-slim":
        absent += ["model_signing", "oras", "cryptography"]
    script = (
        "import importlib.util, os, tarfile\n"
        "def has(name):\n"
        "    try:\n"
        "        return importlib.util.find_spec(name) is not None\n"
        "    except ModuleNotFoundError:  # its parent package is absent\n"
        "        return False\n"
        f"print([m for m in {absent!r} if has(m)], [m for m in {present!r} if not has(m)], "
        "os.path.exists('/bin/sh'), hasattr(tarfile, 'data_filter'))\n"
    )
    listing = engine.run("run", "--rm", "--entrypoint", "python3", images[flavour], "-c", script).stdout.strip()
    assert listing == "[] [] False True", listing


def test_serving_container_matches_the_host_and_drains_on_stop(
    engine: Engine, images: dict[str, str], minilm_bundle: Path, trust_dir: Path, tmp_path: Path
) -> None:
    args = _serving_args(minilm_bundle, trust_dir)
    start = time.monotonic()
    with running_container(engine, images["serve"], args, ports=[8080, 9090]) as container:
        ready_after = wait_ready(container)
        inside = _embed(container.url(), SENTENCES)
        logs = container.logs()
        assert "signature verified" in logs, logs[-2000:]
        # its own HEALTHCHECK, run by the engine
        health = engine.run("healthcheck", "run", container.name, check=False) if engine.name == "podman" else None
        assert health is None or health.returncode == 0, health.stderr if health else ""
        metrics = httpx.get(f"{container.url(9090)}/metrics", timeout=5)
        assert metrics.status_code == 200 and "ortpack_requests_total" in metrics.text
        # SIGTERM (podman stop) while a long request runs: it is answered, the container exits 0
        long_texts = ["word " * 200 + str(i) for i in range(64)]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                httpx.post, f"{container.url()}/v1/embeddings", json={"input": long_texts}, timeout=60
            )
            time.sleep(0.3)
            stopped = engine.run("stop", "-t", "45", container.name, check=False)
            answer = pending.result(timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert answer.status_code == 200 and len(answer.json()["data"]) == len(long_texts)
        assert container.state()["ExitCode"] == 0, container.logs()[-2000:]
    print(f"\nserving container: ready {ready_after:.2f} s after start ({time.monotonic() - start:.1f} s in all)")
    with running_server(minilm_bundle, "--variant", "cpu-int8", log_dir=tmp_path) as outside:
        host = _embed(outside.url, SENTENCES)
    np.testing.assert_array_equal(inside, host)


def test_serving_container_serves_an_image_bundle(
    engine: Engine, images: dict[str, str], image_bundle_for_containers: Path, trust_dir: Path, tmp_path: Path
) -> None:
    import io

    from PIL import Image

    from ortpack.components.core.validation_data import ImageSpec, render_image

    buffer = io.BytesIO()
    Image.fromarray(render_image(ImageSpec(height=480, width=640, kind="smooth", seed=3))).save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    args = _serving_args(image_bundle_for_containers, trust_dir)
    with running_container(engine, images["serve"], args, ports=[8080]) as container:
        wait_ready(container)
        inside = _classify(container.url(), jpeg)
    with running_server(image_bundle_for_containers, log_dir=tmp_path) as outside:
        host = _classify(outside.url, jpeg)
    assert inside == host


def _classify(url: str, jpeg: bytes) -> list[Any]:
    response = httpx.post(
        f"{url}/v1/classify?top_k=5", content=jpeg, headers={"Content-Type": "image/jpeg"}, timeout=30
    )
    assert response.status_code == 200, response.text
    return list(response.json()["predictions"])


@pytest.fixture(scope="module")
def image_bundle_for_containers(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    from tests.models import make_image_weights

    root = tmp_path_factory.mktemp("image-bundle")
    weights = make_image_weights("mobilenet_v3_small", root / "mnv3s.safetensors")
    out = root / "mnv3s"
    done = _cli(
        "build", "--model", "mobilenet_v3_small", "--task", "image-classification", "--weights", str(weights),
        "--precisions", "fp32", "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    signed = _cli("bundle", "sign", str(out), "--key", str(keys[0]))
    assert signed.returncode == 0, signed.stderr
    os.chmod(root, 0o755)
    return out


# --- every source, signed and unsigned, in both flavours ----------------------------------------


def _unsigned(bundle: Path, root: Path) -> Path:
    out = root / f"{bundle.name}-unsigned"
    if not out.exists():
        shutil.copytree(bundle, out, ignore=shutil.ignore_patterns("model.sig"))
        os.chmod(out.parent, 0o755)
    return out


@pytest.fixture(scope="module")
def bundles(
    minilm_bundle: Path, image_bundle_for_containers: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, bool], Path]:
    """(kind, signed) -> bundle directory."""
    root = tmp_path_factory.mktemp("unsigned")
    os.chmod(root, 0o755)
    return {
        ("text", True): minilm_bundle,
        ("image", True): image_bundle_for_containers,
        ("text", False): _unsigned(minilm_bundle, root),
        ("image", False): _unsigned(image_bundle_for_containers, root),
    }


@pytest.fixture(scope="module")
def http_bundles(bundles: dict[tuple[str, bool], Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Each bundle as a .tar, served over HTTP on 127.0.0.1 (a thread of this process); the base URL."""
    root = tmp_path_factory.mktemp("http")
    for (kind, signed), bundle in bundles.items():
        with tarfile.open(root / f"{kind}-{'signed' if signed else 'unsigned'}.tar", "w") as tar:
            tar.add(bundle, arcname=bundle.name)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def oci_bundles(bundles: dict[tuple[str, bool], Path], oci_registry: Registry) -> dict[tuple[str, bool], str]:
    out = {}
    for (kind, signed), bundle in bundles.items():
        pushed = _cli("bundle", "push", str(bundle), oci_registry.url(f"ortpack/{kind}-{int(signed)}:1"))
        assert pushed.returncode == 0, pushed.stderr
        out[(kind, signed)] = pushed.stdout.strip().splitlines()[-1]
    return out


@pytest.fixture(scope="module")
def host_answers(bundles: dict[tuple[str, bool], Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the same bundles answer when served by a process on this machine."""
    logs = tmp_path_factory.mktemp("host-logs")
    with running_server(bundles[("text", True)], "--variant", "cpu-int8", log_dir=logs) as server:
        text = _embed(server.url, SENTENCES)
    with running_server(bundles[("image", True)], log_dir=logs) as server:
        image = _classify(server.url, _jpeg())
    return {"text": text, "image": image}


def _jpeg() -> bytes:
    import io

    from PIL import Image

    from ortpack.components.core.validation_data import ImageSpec, render_image

    buffer = io.BytesIO()
    Image.fromarray(render_image(ImageSpec(height=480, width=640, kind="smooth", seed=3))).save(buffer, "JPEG")
    return buffer.getvalue()


# (flavour, kind, signed, source): a path is what the init container or a modelcar leaves, http a
# .tar URL, oci an artifact pushed by `ortpack bundle push`. The slim flavour has no signature check
# and no OCI client: it serves a signed bundle without checking it (and says so).
SOURCES = [
    ("serve", "text", True, "http"),
    ("serve", "image", True, "oci"),
    ("serve", "text", False, "oci"),
    ("serve", "image", False, "http"),
    ("serve-slim", "text", False, "path"),
    ("serve-slim", "text", True, "http"),
    ("serve-slim", "image", False, "http"),
    ("serve-slim", "image", True, "path"),
]


@pytest.mark.parametrize(("flavour", "kind", "signed", "source"), SOURCES)
def test_serving_image_fetches_verifies_and_serves(
    engine: Engine, images: dict[str, str], bundles: dict[tuple[str, bool], Path], http_bundles: str,
    oci_bundles: dict[tuple[str, bool], str], host_answers: dict[str, Any], trust_dir: Path, tmp_path: Path,
    flavour: str, kind: str, signed: bool, source: str,
) -> None:  # fmt: skip
    """deploy/'s container spec (read-only root, user 10001, no capabilities), on the host network
    (the registry and the HTTP server listen on 127.0.0.1); every module it imports has its .pyc in
    the image (an import tracer on PYTHONPATH records the modules compiled from source: none)."""
    bundle = bundles[(kind, signed)]
    uri = {
        "path": "/models/bundle",
        "http": f"{http_bundles}/{kind}-{'signed' if signed else 'unsigned'}.tar",
        "oci": oci_bundles[(kind, signed)],
    }[source]
    verify = signed and flavour == "serve"
    trust_key = "/etc/ortpack/trust/trust-key.pem" if verify else ""
    port, metrics_port = free_port(), free_port()
    tracer, traces = import_tracer(tmp_path / "trace")
    args = [
        *_serving_args(bundle, trust_dir), *tracer, "--network=host",
        f"--env=ORTPACK_BUNDLE={uri}", f"--env=ORTPACK_PORT={port}", f"--env=ORTPACK_METRICS_PORT={metrics_port}",
        "--env=ORTPACK_SHUTDOWN_GRACE_S=0", f"--env=ORTPACK_TRUST_KEY={trust_key}",
    ]  # fmt: skip
    with running_container(engine, images[flavour], args, []) as container:
        container.ports[8080] = port  # the host network: the server listens on ORTPACK_PORT itself
        wait_ready(container)
        url = container.url()
        if kind == "text":
            np.testing.assert_array_equal(_embed(url, SENTENCES), host_answers["text"])
        else:
            assert _classify(url, _jpeg()) == host_answers["image"]
        stopped = engine.run("stop", "-t", "30", container.name, check=False)
        assert stopped.returncode == 0, stopped.stderr
        said = container.logs()
        assert container.state()["ExitCode"] == 0, said[-3000:]
    if verify:
        assert "signature verified" in said, said[-2000:]
    elif signed:
        assert "NOT checked" in said, said[-2000:]
    else:
        assert "unsigned" in said, said[-2000:]
    (server,) = [t for t in read_traces(traces) if "ortpack.serving.__main__" in t["modules"]]
    assert server["compiled"] == [], f"compiled at start (no valid .pyc in the image): {server['compiled'][:10]}"
    imported = [f for f in server["modules"].values() if f and not f.startswith("/probe/")]
    assert imported and all(f.startswith(("/usr/lib/python3", "/opt/ortpack/")) for f in imported), imported[:5]


def test_deployment_runs_under_kube_play(
    engine: Engine, images: dict[str, str], minilm_bundle: Path, keys: tuple[Path, Path], oci_registry: Registry,
    tmp_path: Path,
) -> None:  # fmt: skip
    """deploy/overlays/init-container's pod: the init container pulls the bundle from a real
    registry, the server verifies the signature and serves. Changed for this machine only: the pod
    uses the host network (the registry listens on 127.0.0.1) with its ports moved to free ones
    (named in the probes by number: podman maps no ports on the host network), and the image is
    this build's."""
    if engine.name != "podman":
        pytest.skip("kube play is podman's")
    pushed = _cli("bundle", "push", str(minilm_bundle), oci_registry.url("ortpack/minilm:1"))
    assert pushed.returncode == 0, pushed.stderr
    pinned = pushed.stdout.strip().splitlines()[-1]
    deployment = _deployment()
    pod = deployment["spec"]["template"]["spec"]
    port, metrics_port = free_port(), free_port()
    pod["hostNetwork"] = True
    for container in [*pod["containers"], *pod.get("initContainers", [])]:
        container["image"] = images["serve"]
        for env in container.get("env", []):
            if env["name"] == "ORTPACK_BUNDLE" and env.get("value", "").startswith("oci://"):
                env["value"] = pinned
            if env["name"] == "ORTPACK_PORT":
                env["value"] = str(port)
            if env["name"] == "ORTPACK_METRICS_PORT":
                env["value"] = str(metrics_port)
        # podman maps no ports on the host network: the probes name the port by number instead
        named = {
            spec["name"]: {8080: port, 9090: metrics_port}[spec["containerPort"]] for spec in container.pop("ports", [])
        }
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container:
                container[probe]["httpGet"]["port"] = named[container[probe]["httpGet"]["port"]]
    # The pod the Deployment's ReplicaSet would create. Not the Deployment itself: podman 4.3
    # removes a Deployment's finished init container racily ("cannot remove container ... as it is
    # running"); a Pod can keep it (init container type "always").
    name = f"ortpack-kube-{free_port()}"
    template = deployment["spec"]["template"]
    annotations = {**template["metadata"].get("annotations", {}), "io.podman.annotations.init.container.type": "always"}
    as_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name, "annotations": annotations},
        "spec": pod,
    }
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ortpack-trust-key"},
        "data": {"trust-key.pem": keys[1].read_text()},
    }
    manifest = tmp_path / "kube.yaml"
    manifest.write_text(yaml.safe_dump_all([configmap, as_pod]))
    played = engine.run("kube", "play", "--tls-verify=false", str(manifest), check=False)
    try:
        assert played.returncode == 0, played.stderr
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            logs = engine.run("pod", "logs", f"{name}-pod", check=False)
            raise AssertionError(f"the pod never became ready: {logs.stdout[-3000:]} {logs.stderr[-2000:]}")
        vectors = _embed(url, SENTENCES)
        assert vectors.shape == (3, 384)
        names = engine.run("ps", "-a", "--filter", f"name={name}", "--format", "{{.Names}}").stdout.split()
        (server,) = [n for n in names if n.endswith("-ortpack-serve")]
        inspected = engine.inspect(server)
        assert inspected["Config"]["User"].startswith("10001")
        assert inspected["HostConfig"]["ReadonlyRootfs"] is True
    finally:
        engine.run("kube", "down", str(manifest), check=False)


# --- the component image --------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_host(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with docker_api_socket(engine, tmp_path_factory.mktemp("socket")) as url:
        yield url


def test_pipeline_runs_in_the_component_image(
    images: dict[str, str], docker_host: str, tiny_bert: Path, tmp_path: Path
) -> None:
    """`ortpack run --runner docker`: resolve and export in the component image, every other step
    in the torch-free steps image (kfp.local prints the image it found for each), and the bundle
    equals the subprocess runner's: the same variants, the same model bytes, the same gate results."""
    common = ["run", "--model", str(tiny_bert), "--allow-degenerate-reference", "--version", "1"]
    in_docker = _cli(
        *common, "--runner", "docker", "--component-image", images["component"], "--out", str(tmp_path / "docker"),
        "--pipeline-root", str(tmp_path / "runs-docker"), "-v",
        env={"DOCKER_HOST": docker_host},
    )  # fmt: skip
    assert in_docker.returncode == 0, in_docker.stderr[-5000:]
    torch_steps = in_docker.stderr.count(f"Found image '{images['component']}'")
    assert torch_steps >= 1, in_docker.stderr[-5000:]  # resolve, export
    steps = in_docker.stderr.count(f"Found image '{images['steps']}'")
    assert steps >= 5, in_docker.stderr[-5000:]  # 2 x (optimize, validate, benchmark), package, gate
    here = _cli(*common, "--out", str(tmp_path / "here"), "--pipeline-root", str(tmp_path / "runs-here"))
    assert here.returncode == 0, here.stderr[-3000:]
    docker_manifest = json.loads((tmp_path / "docker" / "manifest.json").read_text())
    here_manifest = json.loads((tmp_path / "here" / "manifest.json").read_text())
    assert [v["id"] for v in docker_manifest["variants"]] == [v["id"] for v in here_manifest["variants"]]
    for ours, theirs in zip(docker_manifest["variants"], here_manifest["variants"], strict=True):
        assert docker_manifest["files"][ours["file"]] == here_manifest["files"][theirs["file"]], ours["id"]
        assert ours["parity"]["passed"] == theirs["parity"]["passed"]
        for key, value in theirs["parity"]["values"].items():
            assert ours["parity"]["values"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (ours["id"], key)
    # the probe set holds the same arrays (the .npz zip records when it was written)
    with (
        np.load(tmp_path / "docker" / "probe" / "probe.npz") as ours,
        np.load(tmp_path / "here" / "probe" / "probe.npz") as theirs,
    ):
        assert sorted(ours.files) == sorted(theirs.files)
        for key in theirs.files:
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)


# --- KServe modelcar ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def busybox_base(engine: Engine, oci_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A busybox image (Debian's static busybox, imported: nothing is pulled) in the test registry:
    the shell KServe's modelcar sidecar needs."""
    import tarfile

    if subprocess.run(["dpkg", "-s", "busybox-static"], capture_output=True).returncode != 0:
        from tests.registry import apt_install

        reason = apt_install("busybox-static")
        if reason:
            pytest.skip(f"no static busybox for the modelcar's shell: {reason}")
    busybox = "/bin/busybox"
    root = tmp_path_factory.mktemp("busybox")
    archive = root / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "ln", "sleep", "ls"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
    tag = f"{oci_registry.host}/busybox:test"
    engine.run("import", "--change", "ENV PATH=/bin", str(archive), tag)
    try:
        engine.run("push", "--tls-verify=false", tag)
        yield f"oci://{tag}"
    finally:
        engine.run("rmi", "-f", tag, check=False)


def test_modelcar_is_served_the_way_kserve_wires_it(
    engine: Engine, images: dict[str, str], minilm_bundle: Path, busybox_base: str, oci_registry: Registry,
    tmp_path: Path,
) -> None:  # fmt: skip
    """`ortpack bundle push --modelcar`: the image from a real registry runs as KServe's modelcar
    sidecar does (`sh -c "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"`, the same
    user, a shared process namespace and an emptyDir at /mnt) beside the serving container with
    ORTPACK_BUNDLE=/mnt/models and MODEL_INIT_MODE=async; the served vectors are the bundle's.

    The emptyDir is a host directory with mode 0777, which is what Kubernetes makes an emptyDir:
    podman's emptyDir volume came up root-owned 0755 in one CI run (it takes the permissions of
    the image's /mnt), and then the non-root sidecar cannot create its link."""
    if engine.name != "podman":
        pytest.skip("kube play is podman's")
    pushed = _cli(
        "bundle", "push", "--modelcar", "--modelcar-base", busybox_base, str(minilm_bundle),
        oci_registry.url("ortpack/minilm-car:1"),
    )  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    modelcar = pushed.stdout.strip().splitlines()[-1].removeprefix("oci://")
    port = free_port()
    name = f"ortpack-modelcar-{port}"
    provision = tmp_path / "kserve-provision-location"
    provision.mkdir()
    provision.chmod(0o777)
    security = {"runAsUser": 10001, "runAsGroup": 10001, "allowPrivilegeEscalation": False}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "shareProcessNamespace": True,
            "hostNetwork": True,
            "containers": [
                {
                    "name": "kserve-container",
                    "image": images["serve"],
                    "env": [
                        {"name": "ORTPACK_BUNDLE", "value": "/mnt/models"},
                        {"name": "MODEL_INIT_MODE", "value": "async"},
                        {"name": "ORTPACK_PORT", "value": str(port)},
                    ],
                    "securityContext": security,
                    "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt"}],
                },
                {
                    "name": "modelcar",
                    "image": modelcar,
                    "args": ["sh", "-c", "ln -sf /proc/$$/root/models /mnt/models && sleep infinity"],
                    "securityContext": security,
                    "volumeMounts": [{"name": "kserve-provision-location", "mountPath": "/mnt"}],
                },
            ],
            "volumes": [
                {"name": "kserve-provision-location", "hostPath": {"path": str(provision), "type": "Directory"}}
            ],
        },
    }
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod))
    played = engine.run("kube", "play", "--tls-verify=false", str(manifest), check=False)
    try:
        assert played.returncode == 0, played.stderr
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            seen = [
                engine.run(*command, check=False)
                for command in (
                    ("logs", f"{name}-kserve-container"),
                    ("logs", f"{name}-modelcar"),
                    ("exec", f"{name}-kserve-container", "ls", "-la", "/mnt", "/mnt/models/"),
                    ("ps", "-a", "--pod"),
                )
            ]
            raise AssertionError(
                "the modelcar pod never became ready: " + " | ".join(d.stdout + d.stderr for d in seen)
            )
        served = _embed(url, SENTENCES)
    finally:
        engine.run("kube", "down", str(manifest), check=False)
        engine.run("rmi", "-f", modelcar, check=False)
    with running_server(minilm_bundle, "--variant", "cpu-int8", log_dir=tmp_path) as outside:
        np.testing.assert_array_equal(served, _embed(outside.url, SENTENCES))


def test_container_helpers_left_nothing_running(engine: Engine) -> None:
    leftovers = engine.run("ps", "-aq", "--filter", "label=dev.ortpack.test", check=False).stdout.split()
    assert leftovers == []
