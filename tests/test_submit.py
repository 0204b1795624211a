"""`ortpack submit` against a local HTTP endpoint speaking the KFP v2beta1 routes kfp.Client calls."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest


class FakeKFP(BaseHTTPRequestHandler):
    """Just enough of the Kubeflow Pipelines v2beta1 REST API: healthz, experiments, runs."""

    requests: ClassVar[list[dict[str, Any]]] = []
    experiments: ClassVar[dict[str, dict[str, Any]]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def _reply(self, body: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body: Any = None) -> None:
        self.requests.append(
            {"method": self.command, "path": self.path, "auth": self.headers.get("Authorization"), "body": body}
        )

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/apis/v2beta1/healthz"):
            self._reply({"multi_user": False})
        elif self.path.startswith("/apis/v2beta1/experiments"):
            self._reply({"experiments": list(self.experiments.values())} if self.experiments else {})
        else:
            self._reply({"error": "not found"}, 404)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self._record(body)
        if self.path == "/apis/v2beta1/experiments":
            experiment = {**body, "experiment_id": f"exp-{len(self.experiments) + 1}"}
            self.experiments[experiment["display_name"]] = experiment
            self._reply(experiment)
        elif self.path == "/apis/v2beta1/runs":
            self._reply({**body, "run_id": "run-42", "state": "PENDING"})
        else:
            self._reply({"error": "not found"}, 404)


@pytest.fixture
def fake_kfp() -> Iterator[str]:
    FakeKFP.requests, FakeKFP.experiments = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKFP)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def submit(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "submit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_submit_creates_experiment_and_run(fake_kfp: str, tmp_path: Path) -> None:
    result = submit(
        "--host",
        fake_kfp,
        "--targets",
        "cpu,cuda",
        "--precisions",
        "fp32,int8,fp16",
        "--run-name",
        "nightly",
        "--experiment",
        "embeddings",
        "--threshold",
        "int8.min_cosine=0.9",
        env={"KFP_TOKEN": "s3cret"},
    )
    assert result.returncode == 0, result.stderr
    assert "submitted run run-42 (experiment exp-1)" in result.stdout
    posts = [r for r in FakeKFP.requests if r["method"] == "POST"]
    assert [p["path"] for p in posts] == ["/apis/v2beta1/experiments", "/apis/v2beta1/runs"]
    assert posts[0]["body"]["display_name"] == "embeddings"
    run = posts[1]["body"]
    assert run["display_name"] == "nightly" and run["experiment_id"] == "exp-1"
    # with a cuda branch the package holds two documents: the pipeline and its Kubernetes platform spec
    spec, platform = run["pipeline_spec"]["pipeline_spec"], run["pipeline_spec"]["platform_spec"]
    assert spec["pipelineInfo"]["name"] == "package-model"
    assert "nvidia.com/gpu" in json.dumps(platform)
    params = run["runtime_config"]["parameters"]
    assert params["cpu_precisions"] == ["fp32", "int8"] and params["cuda_precisions"] == ["fp32", "fp16"]
    assert params["model"] == "all-MiniLM-L6-v2" and params["thresholds"] == {"int8": {"min_cosine": 0.9}}
    assert all(r["auth"] == "Bearer s3cret" for r in FakeKFP.requests)


def test_submit_reuses_an_existing_experiment(fake_kfp: str) -> None:
    assert submit("--host", fake_kfp).returncode == 0
    result = submit("--host", fake_kfp)
    assert result.returncode == 0, result.stderr
    posts = [r["path"] for r in FakeKFP.requests if r["method"] == "POST"]
    assert posts == ["/apis/v2beta1/experiments", "/apis/v2beta1/runs", "/apis/v2beta1/runs"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_host_is_one_line(tmp_path: Path) -> None:
    result = submit("--host", f"http://127.0.0.1:{_free_port()}")
    assert result.returncode == 3
    assert result.stderr.strip().startswith("ortpack: error: cannot reach Kubeflow Pipelines at http://127.0.0.1:")
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_options_fail_before_contacting_the_host(fake_kfp: str) -> None:
    result = submit("--host", fake_kfp, "--precisions", "fp8")
    assert result.returncode == 2 and "unknown precision 'fp8'" in result.stderr
    assert FakeKFP.requests == []
