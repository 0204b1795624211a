"""Just enough of the Kubeflow Pipelines v2beta1 REST API for `ortpack submit` (kfp.Client's
routes), with the run's states scripted; the `fake_kfp` fixture (tests/pipelines/conftest.py)
serves it on 127.0.0.1."""

from __future__ import annotations

import email.parser
import json
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from tests.cli import ortpack


def task_state(name: str, state: str) -> dict[str, Any]:
    return {"task_id": f"t-{name}", "display_name": name, "state": state}


SUCCEEDING = [
    ("PENDING", []),
    ("RUNNING", [task_state("root-driver", "RUNNING"), task_state("export", "RUNNING")]),
    ("RUNNING", [task_state("export", "SUCCEEDED"), task_state("package", "RUNNING")]),
    ("SUCCEEDED", [task_state(name, "SUCCEEDED") for name in ("export", "package", "gate")]),
]


class FakeKFP(BaseHTTPRequestHandler):
    """Just enough of the Kubeflow Pipelines v2beta1 REST API."""

    requests: ClassVar[list[dict[str, Any]]] = []
    experiments: ClassVar[dict[str, dict[str, Any]]] = {}
    pipelines: ClassVar[dict[str, dict[str, Any]]] = {}
    versions: ClassVar[dict[str, list[dict[str, Any]]]] = {}
    uploads: ClassVar[list[bytes]] = []
    runs: ClassVar[dict[str, dict[str, Any]]] = {}
    script: ClassVar[list[tuple[str, list[dict[str, Any]]]]] = SUCCEEDING

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

    def _query(self) -> dict[str, str]:
        return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).items()}

    def _named(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Apply a display_name EQUALS filter, as the API server does."""
        raw = self._query().get("filter")
        if not raw:
            return items
        (predicate,) = json.loads(raw)["predicates"]
        return [i for i in items if i["display_name"] == predicate["stringValue"]]

    def do_GET(self) -> None:
        self._record()
        path = urllib.parse.urlsplit(self.path).path
        if path == "/apis/v2beta1/healthz":
            self._reply({"multi_user": False})
        elif path == "/apis/v2beta1/experiments":
            self._reply({"experiments": self._named(list(self.experiments.values()))} if self.experiments else {})
        elif path == "/apis/v2beta1/pipelines":
            found = self._named(list(self.pipelines.values()))
            self._reply({"pipelines": found, "total_size": len(found)} if found else {})
        elif path.startswith("/apis/v2beta1/pipelines/") and path.endswith("/versions"):
            found = self._named(self.versions.get(path.split("/")[4], []))
            self._reply({"pipeline_versions": found, "total_size": len(found)} if found else {})
        elif path.startswith("/apis/v2beta1/runs/"):
            run = self.runs[path.rsplit("/", 1)[1]]
            step = min(run["polls"], len(self.script) - 1)
            run["polls"] += 1
            state, tasks = ("CANCELED", []) if run.get("terminated") else self.script[step]
            body = {**run["body"], "run_id": run["run_id"], "state": state, "run_details": {"task_details": tasks}}
            if state == "FAILED":
                body["error"] = {"code": 9, "message": "gate:\n no variant passed its parity gate"}
            self._reply(body)
        else:
            self._reply({"error": "not found"}, 404)

    def _multipart_file(self, raw: bytes) -> bytes:
        message = email.parser.BytesParser().parsebytes(
            b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + raw
        )
        (part,) = [p for p in message.walk() if p.get_filename()]
        return part.get_payload(decode=True)

    def _new_version(self, pipeline_id: str, name: str) -> dict[str, Any]:
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": f"v-{sum(len(v) for v in self.versions.values()) + 1}",
            "display_name": name,
        }
        self.versions.setdefault(pipeline_id, []).append(version)
        return version

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path, query = urllib.parse.urlsplit(self.path).path, self._query()
        if path in ("/apis/v2beta1/pipelines/upload", "/apis/v2beta1/pipelines/upload_version"):
            self.uploads.append(self._multipart_file(raw))
            self._record({"query": query})
            if path.endswith("/upload"):
                pipeline = {"pipeline_id": f"p-{len(self.pipelines) + 1}", "display_name": query["name"]}
                self.pipelines[pipeline["pipeline_id"]] = pipeline
                self._new_version(pipeline["pipeline_id"], query["name"])
                self._reply(pipeline)
            else:
                self._reply(self._new_version(query["pipelineid"], query["name"]))
            return
        body = json.loads(raw) if raw else None
        self._record(body)
        if path == "/apis/v2beta1/experiments":
            experiment = {**body, "experiment_id": f"exp-{len(self.experiments) + 1}"}
            self.experiments[experiment["display_name"]] = experiment
            self._reply(experiment)
        elif path == "/apis/v2beta1/runs":
            run_id = f"run-{len(self.runs) + 42}"
            self.runs[run_id] = {"run_id": run_id, "body": body, "polls": 0}
            self._reply({**body, "run_id": run_id, "state": "PENDING"})
        elif path.endswith(":terminate"):
            self.runs[path.rsplit("/", 1)[1].split(":")[0]]["terminated"] = True
            self._reply({})
        else:
            self._reply({"error": "not found"}, 404)


def submit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ortpack submit ARGS`, without this environment's AWS_ and ORTPACK_ settings."""
    return ortpack(
        "submit", *args, env={"NO_PROXY": "127.0.0.1,localhost", **(env or {})}, drop=("AWS_", "ORTPACK_"), timeout=120
    )


def serve_fake_kfp() -> Iterator[str]:
    """Serve a fresh FakeKFP (no requests, nothing uploaded, the succeeding script); yield its URL."""
    FakeKFP.requests, FakeKFP.experiments, FakeKFP.pipelines, FakeKFP.versions = [], {}, {}, {}
    FakeKFP.uploads, FakeKFP.runs, FakeKFP.script = [], {}, SUCCEEDING
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKFP)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
