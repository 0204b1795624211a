"""`ortpack submit`: compile the pipeline and start a run on a Kubeflow Pipelines endpoint."""

from __future__ import annotations

import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.core.errors import OrtpackError


class EndpointError(OrtpackError, RuntimeError):
    """The Kubeflow Pipelines endpoint cannot be reached or refused the request."""


@dataclass(frozen=True, kw_only=True)
class SubmittedRun:
    run_id: str
    experiment_id: str
    url: str


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


def submit_run(
    pipeline: Any,
    arguments: dict[str, Any],
    *,
    host: str,
    experiment: str,
    run_name: str | None,
    namespace: str | None,
    token: str | None,
) -> SubmittedRun:
    """Compile `pipeline` and create a run of it with `kfp.Client` (v2beta1 API)."""
    import kfp
    from kfp import compiler

    check_reachable(host, token)
    with tempfile.TemporaryDirectory(prefix="ortpack-submit-") as tmp:
        package = Path(tmp) / "package_model.yaml"
        compiler.Compiler().compile(pipeline, str(package))
        try:
            client = kfp.Client(host=host, existing_token=token, namespace=namespace or "kubeflow")
            result = client.create_run_from_pipeline_package(
                str(package),
                arguments=arguments,
                run_name=run_name,
                experiment_name=experiment,
                namespace=namespace,
            )
        except Exception as exc:  # noqa: BLE001 - kfp_server_api raises many types; one line each
            text = " ".join(str(exc).split())
            raise EndpointError(f"Kubeflow Pipelines at {host} refused the run: {text[:300]}") from None
    run = result.run_info
    return SubmittedRun(
        run_id=str(run.run_id),
        experiment_id=str(run.experiment_id),
        url=f"{host.rstrip('/')}/#/runs/details/{run.run_id}",
    )
