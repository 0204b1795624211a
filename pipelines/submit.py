"""`ortpack submit`: upload the compiled pipeline to a Kubeflow Pipelines endpoint, start a run of
that pipeline version, and (with --wait) follow it to the end.

What is uploaded is exactly what `ortpack compile` writes for the same options (the caller
compiles to a file and hands it over): `upload_pipeline` the first time, else
`upload_pipeline_version` with a version name derived from the YAML's sha256 (the same YAML is
never uploaded twice), then a run of that version.

The v2beta1 API returns each task's state but not artifact URIs, so at the end the bundle's URI is
found by listing the run's folder in the artifact store (`PIPELINE_ROOT/package-model/RUN_ID/
package-bundle/*/bundle`), which needs read access to it (AWS_* variables, AWS_ENDPOINT_URL for
MinIO); without it the folder is printed. A published bundle's pinned URI is derived from
`publish_to` and the version the caller chose (`pinned_publish_uri`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortpack import __version__
from ortpack.components.core.errors import OrtpackError, one_line
from ortpack.components.core.sources import ARCHIVE_SUFFIXES, s3_client, s3_errors, uri_scheme
from ortpack.kernel.registry import OciReference, open_client

log = logging.getLogger("ortpack.submit")

DEFAULT_PIPELINE_ROOT = "minio://mlpipeline/v2/artifacts"  # the KFP standalone default
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED")
PACKAGE_TASK = "package-bundle"


class EndpointError(OrtpackError, RuntimeError):
    """The Kubeflow Pipelines endpoint cannot be reached or refused the request."""


@dataclass(frozen=True, kw_only=True)
class SubmittedRun:
    run_id: str
    experiment_id: str
    pipeline_id: str
    version_id: str
    url: str


@dataclass(frozen=True, kw_only=True)
class FinishedRun:
    run_id: str
    state: str  # SUCCEEDED, FAILED, CANCELED, SKIPPED, or TIMED_OUT (terminated by us)
    error: str = ""
    tasks: dict[str, str] = field(default_factory=dict)  # display name -> last state

    @property
    def succeeded(self) -> bool:
        return self.state == "SUCCEEDED"


def check_reachable(host: str, token: str | None = None, timeout_s: float = 5.0) -> None:
    """Fail fast, with one line, when nothing answers at `host` (any HTTP answer is fine)."""
    request = urllib.request.Request(host.rstrip("/") + "/apis/v2beta1/healthz")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered: authentication or routing is the client's business
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EndpointError(f"cannot reach Kubeflow Pipelines at {host}: {reason}") from None


def connect(host: str, *, namespace: str | None, token: str | None) -> Any:
    import kfp

    check_reachable(host, token)
    with _quiet():
        return kfp.Client(host=host, existing_token=token, namespace=namespace or "kubeflow")


@contextlib.contextmanager
def _calling(host: str, what: str) -> Any:
    """kfp_server_api raises many types: one line each."""
    try:
        with _quiet():
            yield
    except OrtpackError:
        raise
    except Exception as exc:  # noqa: BLE001 - see above
        raise EndpointError(f"Kubeflow Pipelines at {host} refused to {what}: {one_line(exc, 300)}") from None


@contextlib.contextmanager
def _quiet() -> Any:
    """kfp.Client prints links to stdout; keep stdout for results."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def version_name(package: Path) -> str:
    """The pipeline version name of a compiled YAML: ortpack's version and the YAML's sha256."""
    return f"{__version__}-{hashlib.sha256(Path(package).read_bytes()).hexdigest()[:12]}"


def upload(client: Any, host: str, package: Path, pipeline_name: str, namespace: str | None) -> tuple[str, str]:
    """Upload `package` as a version of `pipeline_name` (reusing a version of identical YAML);
    return (pipeline_id, version_id)."""
    name = version_name(package)
    with _calling(host, "upload the pipeline"):
        pipeline_id = client.get_pipeline_id(pipeline_name)
        if pipeline_id is None:
            pipeline = client.upload_pipeline(
                str(package),
                pipeline_name=pipeline_name,
                description="ortpack package_model (ortpack compile)",
                namespace=namespace,
            )
            pipeline_id = pipeline.pipeline_id
            versions = client.list_pipeline_versions(pipeline_id).pipeline_versions or []
            if not versions:
                raise EndpointError(f"Kubeflow Pipelines at {host} lists no version of the pipeline just uploaded")
            return str(pipeline_id), str(versions[0].pipeline_version_id)
        same = json.dumps({"predicates": [{"operation": 1, "key": "display_name", "stringValue": name}]})
        existing = client.list_pipeline_versions(pipeline_id, filter=same).pipeline_versions or []
        matching = [v for v in existing if v.display_name == name]
        if matching:
            return str(pipeline_id), str(matching[0].pipeline_version_id)
        version = client.upload_pipeline_version(str(package), name, pipeline_id=pipeline_id)
        return str(pipeline_id), str(version.pipeline_version_id)


def submit_run(
    package: Path,
    arguments: dict[str, Any],
    *,
    host: str,
    experiment: str,
    run_name: str,
    namespace: str | None,
    token: str | None,
    pipeline_name: str,
    service_account: str | None = None,
    pipeline_root: str | None = None,
) -> tuple[Any, SubmittedRun]:
    """Upload the compiled YAML at `package` and start a run of that version; return the client and the run."""
    client = connect(host, namespace=namespace, token=token)
    pipeline_id, version_id = upload(client, host, package, pipeline_name, namespace)
    with _calling(host, "start the run"):
        exp = client.create_experiment(name=experiment, namespace=namespace)
        run = client.run_pipeline(
            experiment_id=exp.experiment_id,
            job_name=run_name,
            params=arguments,
            pipeline_id=pipeline_id,
            version_id=version_id,
            pipeline_root=pipeline_root,
            service_account=service_account,
        )
    return client, SubmittedRun(
        run_id=str(run.run_id),
        experiment_id=str(exp.experiment_id),
        pipeline_id=pipeline_id,
        version_id=version_id,
        url=f"{host.rstrip('/')}/#/runs/details/{run.run_id}",
    )


def follow_run(
    client: Any,
    host: str,
    run_id: str,
    *,
    echo: Callable[[str], None],
    timeout_s: float | None = None,
    poll_s: float = 5.0,
) -> FinishedRun:
    """Poll the run until it ends, echoing each task's state changes; terminate it after `timeout_s`."""
    start, seen = time.monotonic(), {}
    while True:
        with _calling(host, "report the run"):
            run = client.get_run(run_id)
        details = getattr(run, "run_details", None)
        for task in getattr(details, "task_details", None) or []:
            name, state = str(task.display_name or task.task_id), str(task.state or "")
            if name.endswith("-driver") or not state or seen.get(name) == state:
                continue
            seen[name] = state
            echo(f"{name}: {state.lower()}")
        state = str(run.state or "")
        if state in TERMINAL_STATES:
            error = one_line(getattr(run.error, "message", "") or "") if run.error else ""
            return FinishedRun(run_id=run_id, state=state, error=error, tasks=seen)
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            with _calling(host, "terminate the run"):
                client.terminate_run(run_id)
            return FinishedRun(run_id=run_id, state="TIMED_OUT", error=f"terminated after {timeout_s:g} s", tasks=seen)
        time.sleep(poll_s)


# ---------------------------------------------------------------------------- where the bundle went


@dataclass(frozen=True, kw_only=True)
class BundleLocation:
    uri: str  # the bundle artifact's URI, or the run's package folder when it could not be listed
    manifest_sha256: str | None = None
    note: str = ""


def find_bundle(pipeline_root: str, pipeline_name: str, run_id: str) -> BundleLocation:
    """The package step's bundle in the artifact store: `ROOT/PIPELINE/RUN_ID/package-bundle/<id>/bundle`
    (the layout of backends 2.14+), found by listing with boto3 (minio:// is S3 with AWS_ENDPOINT_URL)."""
    folder = f"{pipeline_root.rstrip('/')}/{pipeline_name}/{run_id}/{PACKAGE_TASK}/"
    parts = urllib.parse.urlsplit(folder)
    if parts.scheme not in ("s3", "minio"):
        return BundleLocation(uri=folder, note=f"listing {parts.scheme}:// artifact stores is not supported")
    try:
        client = s3_client(folder)
        prefix = parts.path.lstrip("/")
        with s3_errors(folder):
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=parts.netloc, Prefix=prefix)
            manifests = [
                o["Key"]
                for page in pages
                for o in page.get("Contents", [])
                if o["Key"].endswith("/bundle/manifest.json")
            ]
            if not manifests:
                return BundleLocation(uri=folder, note="no bundle/manifest.json under it")
            key = sorted(manifests)[-1]
            body = client.get_object(Bucket=parts.netloc, Key=key)["Body"].read()
    except OrtpackError as exc:
        return BundleLocation(uri=folder, note=f"cannot list the artifact store: {one_line(exc, 200)}")
    uri = f"{parts.scheme}://{parts.netloc}/{key[: -len('/manifest.json')]}"
    return BundleLocation(uri=uri, manifest_sha256=hashlib.sha256(body).hexdigest())


def pinned_publish_uri(publish_to: str, name: str, version: str) -> str:
    """The publish step's pinned URI for a run with this version: an OCI tag resolved to its
    digest by asking the registry; an S3 key as the step names it (`NAME-VERSION.tar`)."""

    if uri_scheme(publish_to) == "oci":
        ref = OciReference.parse(publish_to)
        if not ref.tag and not ref.digest:
            ref = OciReference.parse(f"{publish_to}:{version}")
        with open_client(ref) as registry:
            body = registry.get_manifest(ref.reference)
        return str(ref.pinned("sha256:" + hashlib.sha256(body).hexdigest()))
    if publish_to.endswith(ARCHIVE_SUFFIXES):
        return publish_to
    return f"{publish_to.rstrip('/')}/{name}-{version}.tar"
