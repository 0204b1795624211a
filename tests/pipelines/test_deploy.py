"""The Kubernetes and KServe manifests under deploy/: valid, and consistent with the server.

Every core-kind file, and every Kustomize overlay rendered here (its patches are JSON 6902, applied
with `jsonpatch`, so no kustomize binary is needed), is validated with `kubernetes-validate` in
strict mode (unknown fields are errors) against Kubernetes 1.31 and the newest version the library
ships. The library carries its schemas in the package; the validation tests run with sockets
disabled, so they prove that no schema is fetched. KServe objects (no CRD schemas here) live in deploy/kserve/
and are checked field by field; their containers are validated as a core Pod.

Then the things a schema cannot see and that break silently on a cluster: probe paths that are not
routes, probe ports that are not the port the server binds, ORTPACK_* variables the server does
not know (it ignores them), a grace period shorter than the server's drain, a writable root
filesystem or a cache directory on it, mounts of undeclared volumes, selectors that miss the pods,
image tags behind the package version.

Nothing here has been applied to a real cluster (see deploy/README.md).
"""

from __future__ import annotations

import copy
import math
import re
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests import ROOT
from tests.kustomize import DEPLOY, load_objects, render

KSERVE = DEPLOY / "kserve"
IMAGE = "ghcr.io/ortpack/ortpack-serve"
RUNTIME_UID = 10001  # Dockerfile.serve: useradd --uid 10001
KUBERNETES_VERSIONS = ("1.31", "newest")

# ORTPACK_* options the manifests use that ortpack.serving.config.ServeConfig does not have yet: they are
# being added for issue 10 (API key file, drain grace period, metrics port). The server ignores
# an unknown ORTPACK_* variable, so until then these settings have no effect. When a field lands,
# test_pending_options_are_still_pending fails: remove its name here, and the name is then checked
# like every other option.
PENDING_OPTIONS: frozenset[str] = frozenset()

# The server's drain after SIGTERM: ORTPACK_SHUTDOWN_GRACE_S of serving with readiness 503, then
# uvicorn's graceful shutdown, which waits up to the request timeout + 5 s (serving/__main__.py).
DRAIN_MARGIN_S = 5


# --- loading and rendering --------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Kubernetes objects from one file, or from one rendered Kustomize directory."""

    name: str
    objects: tuple[dict[str, Any], ...]
    rendered: bool  # from a kustomization (what `kubectl apply -k` sends), not a single file


def core_files() -> list[Path]:
    """Every YAML file of deploy/ that holds Kubernetes objects of core kinds."""
    return sorted(
        p
        for p in DEPLOY.rglob("*.y*ml")
        if p.name != "kustomization.yaml" and not p.name.endswith(".patch.yaml") and KSERVE not in p.parents
    )


def kustomize_dirs() -> list[Path]:
    return sorted(p.parent for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))


def sources() -> list[Source]:
    found = [Source(str(p.relative_to(ROOT)), tuple(load_objects(p)), False) for p in core_files()]
    found += [Source(str(d.relative_to(ROOT)), tuple(render(d)), True) for d in kustomize_dirs()]
    with_key = render(DEPLOY / "overlays" / "cpu", (DEPLOY / "components" / "api-key",))
    found.append(Source("deploy/overlays/cpu + components/api-key", tuple(with_key), True))
    return found


def rendered_sources() -> list[Source]:
    return [s for s in sources() if s.rendered]


def kserve_objects() -> tuple[dict[str, Any], dict[str, Any]]:
    objects = [obj for path in sorted(KSERVE.glob("*.y*ml")) for obj in load_objects(path)]
    runtimes = [o for o in objects if o["kind"] in ("ClusterServingRuntime", "ServingRuntime")]
    services = [o for o in objects if o["kind"] == "InferenceService"]
    assert len(runtimes) == 1 and len(services) == 1, "deploy/kserve/ should hold one runtime and one InferenceService"
    return runtimes[0], services[0]


@dataclass(frozen=True)
class Workload:
    """One pod template: a Deployment's, or a KServe runtime's containers with its InferenceService's pod fields."""

    name: str
    pod: dict[str, Any]
    annotations: dict[str, str]


def workloads() -> list[Workload]:
    found = []
    for source in rendered_sources():
        for obj in source.objects:
            if obj["kind"] == "Deployment":
                template = obj["spec"]["template"]
                found.append(Workload(source.name, template["spec"], template["metadata"].get("annotations", {})))
    found.append(kserve_workload())
    return found


def kserve_workload() -> Workload:
    runtime, service = kserve_objects()
    pod = {k: copy.deepcopy(v) for k, v in runtime["spec"].items() if k in ("containers", "volumes", "tolerations")}
    predictor = service["spec"]["predictor"]
    for key in ("securityContext", "terminationGracePeriodSeconds", "serviceAccountName"):
        if key in predictor:
            pod[key] = copy.deepcopy(predictor[key])
    return Workload("deploy/kserve", pod, runtime["spec"].get("annotations", {}))


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def flag_of(container: dict[str, Any], flag: str) -> str | None:
    args = [*container.get("command", []), *container.get("args", [])]
    return args[args.index(flag) + 1] if flag in args else None


def option(container: dict[str, Any], name: str) -> str | None:
    """The value the server gets for option `name`: its flag wins over its ORTPACK_ variable."""
    flag = flag_of(container, "--" + name.replace("_", "-"))
    return flag if flag is not None else env_of(container).get("ORTPACK_" + name.upper())


def server_container(workload: Workload) -> dict[str, Any]:
    containers = workload.pod["containers"]
    assert len(containers) == 1, f"{workload.name}: expected one container, got {[c['name'] for c in containers]}"
    return containers[0]


def serve_config_fields() -> dict[str, Any]:
    from ortpack.serving.config import ServeConfig

    return {f.name: f.default for f in fields(ServeConfig)}


# --- schemas ----------------------------------------------------------------------------------


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail any attempt to resolve a name or open a connection: the schemas must come from the package."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"network access attempted: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    yield


def resolve_version(version: str) -> str:
    return kubernetes_validate.latest_version() if version == "newest" else version


def validate_strict(obj: dict[str, Any], version: str, where: str) -> None:
    try:
        used = kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(
            f"{where}: {obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: {path}: {exc.message}"
        )
    except kubernetes_validate.SchemaNotFoundError as exc:
        pytest.fail(f"{where}: {exc.message}")
    major_minor = ".".join(version.split(".")[:2])
    assert used == major_minor, f"validated against Kubernetes {used}, not {major_minor}"


def test_library_knows_a_version_newer_than_131() -> None:
    from packaging.version import Version

    assert Version(kubernetes_validate.latest_version()) > Version("1.31")


def test_deploy_holds_what_the_tests_read() -> None:
    """Every YAML file is a core file, a kustomization, a JSON 6902 patch or a KServe file; none is skipped."""
    names = {str(p.relative_to(DEPLOY)) for p in core_files()}
    assert {"base/deployment.yaml", "base/service.yaml", "base/hpa.yaml", "base/pdb.yaml"} <= names
    assert {d.name for d in kustomize_dirs()} >= {"cpu", "gpu", "init-container"}
    for path in DEPLOY.rglob("*.y*ml"):
        if path.name == "kustomization.yaml" or path.name.endswith(".patch.yaml"):
            continue
        for obj in load_objects(path):
            is_kserve = obj["apiVersion"].startswith("serving.kserve.io/")
            assert is_kserve == (KSERVE in path.parents), f"{path.relative_to(ROOT)}: {obj['kind']} belongs in " + (
                "deploy/kserve/ (files without CRD schemas)" if is_kserve else "a core file outside deploy/kserve/"
            )
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    unlisted = {p.name for p in core_files() if p.parent == DEPLOY / "base"} - set(base["resources"])
    assert not unlisted, f"deploy/base/kustomization.yaml does not list {sorted(unlisted)}"
    for directory in {p.parent for p in DEPLOY.rglob("kustomization.yaml")}:
        spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
        for listed in [*spec.get("resources", []), *(p["path"] for p in spec.get("patches", []))]:
            assert (directory / listed).exists(), f"{directory.relative_to(ROOT)}: {listed} does not exist"


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_are_valid(version: str) -> None:
    version = resolve_version(version)
    checked = 0
    for source in sources():
        for obj in source.objects:
            validate_strict(obj, version, source.name)
            checked += 1
    assert checked >= 4 * 5  # 4 base objects, in base files and in each rendered overlay


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kserve_pod_is_valid_core_pod(version: str) -> None:
    """The runtime's containers and volumes with the InferenceService's pod fields, validated as a Pod."""
    workload = kserve_workload()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kserve-predictor"}, "spec": workload.pod}
    validate_strict(pod, resolve_version(version), workload.name)


def test_strict_validation_rejects_what_it_should() -> None:
    """The validator is not a no-op: an unknown field, a wrong type and a missing field all fail."""
    deployment = load_objects(DEPLOY / "base" / "deployment.yaml")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    broken = [
        ("spec.template.spec.containers.0", {**container, "readinesProbe": container["readinessProbe"]}),
        ("spec.template.spec.containers.0.ports.0.containerPort", {**container, "ports": [{"containerPort": "8080"}]}),
    ]
    for path, bad_container in broken:
        obj = copy.deepcopy(deployment)
        obj["spec"]["template"]["spec"]["containers"] = [bad_container]
        with pytest.raises(kubernetes_validate.ValidationError) as caught:
            kubernetes_validate.validate(obj, "1.31", strict=True)
        assert ".".join(str(p) for p in caught.value.path) == path
    obj = copy.deepcopy(deployment)
    del obj["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, "1.31", strict=True)


# --- KServe -----------------------------------------------------------------------------------


def test_kserve_runtime_fields() -> None:
    runtime, _ = kserve_objects()
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["kind"] == "ClusterServingRuntime"
    assert runtime["metadata"].get("name")
    spec = runtime["spec"]
    formats = spec.get("supportedModelFormats") or []
    assert [f["name"] for f in formats] == ["ortpack"]
    assert formats[0].get("autoSelect") is True
    assert spec.get("protocolVersions") == ["v2"]
    containers = spec.get("containers") or []
    assert len(containers) == 1 and containers[0]["name"] == "kserve-container"  # the name KServe looks for
    container = containers[0]
    assert container.get("image", "").startswith(IMAGE + ":")
    assert flag_of(container, "--bundle") == "/mnt/models"  # where KServe's storage initializer writes
    assert flag_of(container, "--model-name") == "{{.Name}}"
    assert flag_of(container, "--host") == "0.0.0.0"
    assert option(container, "port") == "8080"


def test_inference_service_uses_the_runtime() -> None:
    runtime, service = kserve_objects()
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["kind"] == "InferenceService"
    assert service["metadata"].get("name")
    model = service["spec"]["predictor"]["model"]
    runtime_format = runtime["spec"]["supportedModelFormats"][0]
    assert model["modelFormat"]["name"] == runtime_format["name"]
    if "version" in model["modelFormat"]:
        assert model["modelFormat"]["version"] == runtime_format.get("version")
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model.get("protocolVersion", "v2") in runtime["spec"]["protocolVersions"]
    assert re.match(r"^(s3|gs|https?|pvc|hf|azure)://\S+$", model.get("storageUri", "")), model.get("storageUri")


# --- consistency with the server --------------------------------------------------------------


def server_routes() -> set[str]:
    """Every route path the server's modules declare, as `Route("/path", ...)` or `path="/path"` (importing the
    app is heavy)."""
    found: set[str] = set()
    declared = re.compile(r"""(?:\bRoute\(\s*|\bpath\s*=\s*)["'](/[^"']*)["']""")
    for path in (ROOT / "serving").rglob("*.py"):
        found |= set(declared.findall(path.read_text()))
    assert "/v2/health/ready" in found, "no route declarations found in serving/: update server_routes()"
    return found


def probes(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in container}


def test_probes_hit_server_routes_on_the_server_port() -> None:
    routes = server_routes()
    default_port = serve_config_fields()["port"]
    for workload in workloads():
        container = server_container(workload)
        found = probes(container)
        assert set(found) == {"startupProbe", "readinessProbe", "livenessProbe"}, f"{workload.name}: {set(found)}"
        assert found["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready", workload.name
        assert found["livenessProbe"]["httpGet"]["path"] == "/v2/health/live", workload.name
        server_port = int(option(container, "port") or default_port)
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        assert server_port in ports.values(), f"{workload.name}: the server binds {server_port}, ports are {ports}"
        for kind, probe in found.items():
            path, port = probe["httpGet"]["path"], probe["httpGet"]["port"]
            assert path in routes, f"{workload.name}: {kind} path {path} is not a server route"
            resolved = ports.get(port) if isinstance(port, str) else port
            assert resolved == server_port, f"{workload.name}: {kind} port {port} is not the server port {server_port}"
        assert option(container, "host") == "0.0.0.0", f"{workload.name}: the server must bind all interfaces"


def test_metrics_port_is_declared_and_annotated() -> None:
    for workload in workloads():
        container = server_container(workload)
        metrics_port = option(container, "metrics_port")
        assert metrics_port, f"{workload.name}: no ORTPACK_METRICS_PORT"
        annotated = workload.annotations.get("prometheus.io/port") or workload.annotations.get(
            "prometheus.kserve.io/port"
        )
        assert annotated == metrics_port, f"{workload.name}: metrics on {metrics_port}, annotation says {annotated}"
        path = workload.annotations.get("prometheus.io/path") or workload.annotations.get("prometheus.kserve.io/path")
        assert path in server_routes(), f"{workload.name}: metrics path {path} is not a server route"
        if workload.name != "deploy/kserve":  # Knative allows one container port; KServe uses the annotation
            ports = [p["containerPort"] for p in container["ports"]]
            assert int(metrics_port) in ports, f"{workload.name}: metrics port {metrics_port} not in {ports}"


def server_variables() -> set[str]:
    """ORTPACK_* variables the server's modules and the kernel under it read by name, besides its options
    (e.g. registry credentials)."""
    found: set[str] = set()
    for path in [*(ROOT / "serving").rglob("*.py"), *(ROOT / "kernel").rglob("*.py")]:
        found |= set(re.findall(r"""["'](ORTPACK_[A-Z0-9_]+)["']""", path.read_text()))
    return found


def test_every_ortpack_option_is_a_server_option() -> None:
    known = set(serve_config_fields()) | PENDING_OPTIONS
    variables = server_variables()
    for workload in workloads():
        for container in [*workload.pod["containers"], *workload.pod.get("initContainers", [])]:
            for name in env_of(container):
                if name.startswith("ORTPACK_") and name not in variables:
                    option_name = name.removeprefix("ORTPACK_").lower()
                    assert option_name in known, (
                        f"{workload.name}: {name} is not an ortpack-serve option (nor read in serving/ or kernel/)"
                    )
            args = [a for a in container.get("args", []) if a.startswith("--")]
            for flag in args:
                assert flag[2:].replace("-", "_") in known, f"{workload.name}: {flag} is not an ortpack-serve flag"


def test_the_memory_budget_is_the_containers_limit() -> None:
    """Every server container gets ORTPACK_MAX_MEMORY from its own memory limit (the Downward API),
    so the budget the server admits requests within and the limit the kubelet enforces agree."""
    for workload in workloads():
        container = server_container(workload)
        env = {e["name"]: e for e in container.get("env", [])}
        source = env["ORTPACK_MAX_MEMORY"]["valueFrom"]["resourceFieldRef"]
        assert source == {"containerName": container["name"], "resource": "limits.memory"}, workload.name
        assert container["resources"]["limits"]["memory"], workload.name


def test_pending_options_are_still_pending() -> None:
    landed = PENDING_OPTIONS & set(serve_config_fields())
    assert not landed, f"now ServeConfig fields, remove them from PENDING_OPTIONS in this test: {sorted(landed)}"


def test_grace_period_covers_the_drain() -> None:
    defaults = serve_config_fields()
    for workload in workloads():
        container = server_container(workload)
        grace = float(option(container, "shutdown_grace_s") or 0)
        timeout_s = float(option(container, "request_timeout_ms") or defaults["request_timeout_ms"]) / 1000
        assert grace > 0, f"{workload.name}: set ORTPACK_SHUTDOWN_GRACE_S so endpoints drop the pod before it stops"
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        assert "exec" not in container.get("lifecycle", {}).get("preStop", {}), "count an exec preStop's time here"
        needed = pre_stop + grace + math.ceil(timeout_s) + DRAIN_MARGIN_S
        period = workload.pod.get("terminationGracePeriodSeconds", 30)  # 30: Kubernetes' default
        assert period >= needed, f"{workload.name}: terminationGracePeriodSeconds {period} < {needed} the drain needs"


def test_containers_run_locked_down() -> None:
    for workload in workloads():
        pod_context = workload.pod.get("securityContext", {})
        volumes = {v["name"]: v for v in workload.pod.get("volumes", [])}
        for container in [*workload.pod["containers"], *workload.pod.get("initContainers", [])]:
            where = f"{workload.name}: {container['name']}"
            context = {**pod_context, **container.get("securityContext", {})}
            assert context.get("runAsNonRoot") is True, where
            assert context.get("runAsUser") == RUNTIME_UID and context.get("runAsGroup") == RUNTIME_UID, where
            assert context.get("allowPrivilegeEscalation") is False, where
            assert context.get("readOnlyRootFilesystem") is True, where
            assert context.get("privileged", False) is False, where
            assert "ALL" in context.get("capabilities", {}).get("drop", []), where
            assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            for mount in mounts.values():
                assert mount["name"] in volumes, f"{where}: mounts undeclared volume {mount['name']}"
            writable = [p for p, m in mounts.items() if "emptyDir" in volumes[m["name"]] and not m.get("readOnly")]
            assert "/tmp" in writable, f"{where}: /tmp must be a writable emptyDir (the root filesystem is read-only)"
            cache = option(container, "cache_dir")
            if container is workload.pod["containers"][0]:
                assert cache, f"{where}: set ORTPACK_CACHE_DIR to a writable emptyDir"
            if cache:
                assert any(cache == p or cache.startswith(p.rstrip("/") + "/") for p in writable), (
                    f"{where}: ORTPACK_CACHE_DIR {cache} is not on a writable emptyDir ({writable})"
                )
            assert container.get("resources", {}).get("requests") and container["resources"].get("limits"), where
        if workload.name != "deploy/kserve":  # KServe's storage initializer may need the service account
            assert workload.pod.get("automountServiceAccountToken") is False, f"{workload.name}: no API token needed"


def test_trust_key_is_mounted_where_the_server_reads_it() -> None:
    for workload in workloads():
        container = server_container(workload)
        key = option(container, "trust_key")
        assert key and key.endswith(".pem"), f"{workload.name}: no ORTPACK_TRUST_KEY"
        volumes = {v["name"]: v for v in workload.pod["volumes"]}
        mounts = [m for m in container["volumeMounts"] if key.startswith(m["mountPath"].rstrip("/") + "/")]
        assert len(mounts) == 1 and mounts[0].get("readOnly"), f"{workload.name}: {key} is not on a read-only mount"
        source = volumes[mounts[0]["name"]]
        items = (source.get("configMap") or source.get("secret") or {}).get("items", [])
        assert key.removeprefix(mounts[0]["mountPath"].rstrip("/") + "/") in [i["path"] for i in items], workload.name
        assert not (source.get("configMap") or source.get("secret") or {}).get("optional"), "fail closed without a key"


def test_api_key_component_points_at_its_secret() -> None:
    (source,) = [s for s in rendered_sources() if "api-key" in s.name]
    (deployment,) = [o for o in source.objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    key_file = option(container, "api_key_file")
    assert key_file
    (mount,) = [m for m in container["volumeMounts"] if key_file.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "secret" in volume and not volume["secret"].get("optional")
    assert key_file.removeprefix(mount["mountPath"] + "/") in [i["path"] for i in volume["secret"]["items"]]
    assert "ORTPACK_API_KEY" not in env_of(container), "the key comes from a file, not the environment"


def selects(selector: dict[str, str], labels: dict[str, str], what: str) -> None:
    assert selector and selector.items() <= labels.items(), f"{what} {selector} does not select the pods' {labels}"


def test_selectors_match_the_pods() -> None:
    for source in rendered_sources():
        by_kind = {obj["kind"]: obj for obj in source.objects}
        assert set(by_kind) == {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}, source.name
        deployment = by_kind["Deployment"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]

        selects(deployment["spec"]["selector"]["matchLabels"], pod_labels, f"{source.name}: Deployment selector")
        selects(by_kind["Service"]["spec"]["selector"], pod_labels, f"{source.name}: Service selector")
        selects(
            by_kind["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
            pod_labels,
            f"{source.name}: PDB selector",
        )
        for constraint in deployment["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
            selects(constraint["labelSelector"]["matchLabels"], pod_labels, f"{source.name}: topology spread")
        target = by_kind["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
        assert (target["apiVersion"], target["kind"], target["name"]) == (
            deployment["apiVersion"],
            "Deployment",
            deployment["metadata"]["name"],
        ), source.name
        assert "replicas" not in deployment["spec"], f"{source.name}: the HPA owns replicas; apply would reset them"
        container_ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
        for port in by_kind["Service"]["spec"]["ports"]:
            target_port = port["targetPort"]
            assert isinstance(target_port, int) or target_port in container_ports, f"{source.name}: {target_port}"


def test_images_follow_the_package_version() -> None:
    from ortpack import __version__

    for workload in workloads():
        gpu = "gpu" in workload.name
        for container in [*workload.pod["containers"], *workload.pod.get("initContainers", [])]:
            image = container["image"]
            assert image.startswith(IMAGE + ":"), image
            tag = image.removeprefix(IMAGE + ":")
            assert tag == __version__ + ("-gpu" if gpu else ""), f"{workload.name}: {image}, package {__version__}"


def test_gpu_overlay_asks_for_a_gpu() -> None:
    (deployment,) = [o for o in render(DEPLOY / "overlays" / "gpu") if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert option(container, "variant") == "auto"
    (cpu,) = [o for o in render(DEPLOY / "overlays" / "cpu") if o["kind"] == "Deployment"]
    assert "nvidia.com/gpu" not in cpu["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_init_container_pulls_where_the_server_reads(tmp_path: Path) -> None:
    """Run the initContainer's own command on a local .tar: it leaves the bundle where ORTPACK_BUNDLE points."""
    (deployment,) = [o for o in render(DEPLOY / "overlays" / "init-container") if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    server = pod["containers"][0]
    command = init["command"]
    assert command[:2] == ["python", "-c"] and len(command) == 4, command
    target = command[3]
    assert option(server, "bundle") == target
    assert "://" in env_of(init)["ORTPACK_BUNDLE"]
    (server_mount,) = [m for m in server["volumeMounts"] if target.startswith(m["mountPath"] + "/")]
    (init_mount,) = [m for m in init["volumeMounts"] if target.startswith(m["mountPath"] + "/")]
    assert server_mount["name"] == init_mount["name"] and server_mount["readOnly"] and not init_mount.get("readOnly")

    bundle = tmp_path / "src" / "tiny"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    archive = tmp_path / "tiny.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(bundle, arcname="tiny")
    models = tmp_path / "models"
    models.mkdir()
    local_target = models / Path(target).name
    env = {"ORTPACK_BUNDLE": str(archive), "PATH": "/usr/bin:/bin"}
    for _ in range(2):  # the second run (a restarted pod) keeps the first pull
        done = subprocess.run(
            [sys.executable, "-c", command[2], str(local_target)], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert (local_target / "manifest.json").read_text() == "{}"
