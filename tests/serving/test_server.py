"""The server as a process on 127.0.0.1: start-up (one line on failure, the port checked before
loading, the cache), signals (the grace period, draining under load), --help and --version.
Routes are tested in-process (tests/serving/test_routes.py); the connection layer in tests/serving/test_hardening.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port, running_server


def serve(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ortpack.serving", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_sigterm_under_load_loses_nothing_accepted(tiny_bundle: Path, tmp_path: Path) -> None:
    with running_server(tiny_bundle, "--workers", "1", "--max-batch-size", "2", log_dir=tmp_path) as s:
        results: list[int | str] = []
        sent = threading.Event()

        async def fire() -> None:
            async with httpx.AsyncClient(base_url=s.url, limits=httpx.Limits(max_connections=100), timeout=60) as c:
                body = {"input": [" ".join(["drain"] * 120)] * 4}
                tasks = [asyncio.ensure_future(c.post("/v1/embeddings", json=body)) for _ in range(60)]
                while True:  # SIGTERM only once the server has accepted all 60 (the 61st is /metrics)
                    text = (await c.get("/metrics")).text
                    line = next(x for x in text.splitlines() if x.startswith("ortpack_requests_in_flight "))
                    if float(line.split()[1]) >= 61 or all(t.done() for t in tasks):
                        break
                    await asyncio.sleep(0.01)
                sent.set()
                for done in await asyncio.gather(*tasks, return_exceptions=True):
                    results.append(done.status_code if isinstance(done, httpx.Response) else type(done).__name__)

        client = threading.Thread(target=lambda: asyncio.run(fire()))
        client.start()
        assert sent.wait(30)
        code = s.stop(signal.SIGTERM)
        client.join(60)
        assert results == [200] * 60, results
        assert code == 0
        assert "stopped: every accepted request answered" in s.output()


def test_sigterm_grace_period_keeps_serving_with_readiness_503(tiny_bundle: Path, tmp_path: Path) -> None:
    """Kubernetes keeps routing to a pod for a moment after SIGTERM: during --shutdown-grace-s the
    server answers every request (new connections and keep-alive ones), readiness says 503, and
    answers carry Connection: close; then it drains and exits 0."""
    with running_server(tiny_bundle, "--shutdown-grace-s", "2", log_dir=tmp_path) as s:
        with httpx.Client(base_url=s.url, timeout=30) as keep_alive:
            assert keep_alive.post("/v1/embeddings", json={"input": "before"}).status_code == 200
            s.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 1.0
            statuses, ready, closes = [], [], []
            while time.monotonic() < deadline:  # well inside the 2 s grace period
                answer = keep_alive.post("/v1/embeddings", json={"input": "during the grace period"})
                statuses.append(answer.status_code)
                closes.append(answer.headers.get("connection"))
                statuses.append(httpx.post(f"{s.url}/v1/embeddings", json={"input": "new connection"}).status_code)
                ready.append(httpx.get(f"{s.url}/v2/health/ready").status_code)
        code = s.process.wait(40)
    assert statuses and set(statuses) == {200}, statuses
    assert set(ready) == {503}, ready
    assert "close" in closes
    assert code == 0
    log = s.output()
    assert "SIGTERM: readiness 503; still serving for 2 s" in log and "grace period over" in log


def test_tampered_bundle_refuses_to_start(tiny_bundle: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny_bundle, bad)
    model = bad / "variants" / "cpu-int8" / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    result = serve("--bundle", str(bad), "--port", str(free_port()))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "ortpack-serve: error: checksum mismatch for variants/cpu-int8/model.onnx: the file was changed after packaging"
    )


def _tar(bundle: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w") as tar:
        tar.add(bundle, arcname="bundle")
    return dest


def test_a_failed_start_from_a_tar_leaves_nothing_in_the_cache(tiny_bundle: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny_bundle, bad)
    (bad / "tokenizer.json").write_text("{}")
    cache = tmp_path / "cache"
    result = serve(
        "--bundle", str(_tar(bad, tmp_path / "bad.tar")), "--cache-dir", str(cache), "--port", str(free_port())
    )
    assert result.returncode == 2 and "mismatch for tokenizer.json" in result.stderr
    assert sorted(p.name for p in cache.iterdir()) == []


def test_repeated_starts_reuse_one_verified_extraction(tiny_bundle: Path, tmp_path: Path) -> None:
    from ortpack.serving.__main__ import build
    from ortpack.serving.config import ServeConfig

    archive = _tar(tiny_bundle, tmp_path / "bundle.tar")
    cache = tmp_path / "cache"
    config = ServeConfig(bundle=str(archive), cache_dir=str(cache), warmup=False)
    build(config)
    first = sorted(p.name for p in cache.iterdir())
    build(config)
    assert sorted(p.name for p in cache.iterdir()) == first
    (extraction,) = [name for name in first if not name.endswith(".verified")]
    assert first == [extraction, extraction + ".verified"] and len(extraction) == len("bundle-") + 64
    # a tampered cached copy is not trusted: the start fails and removes it
    (cache / extraction / "bundle" / "tokenizer.json").write_text("{}")
    result = serve("--bundle", str(archive), "--cache-dir", str(cache), "--port", str(free_port()))
    assert result.returncode == 2 and "mismatch for tokenizer.json" in result.stderr
    assert list(cache.iterdir()) == []


def test_a_used_port_exits_2_in_one_line_before_loading(tiny_bundle: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--bundle", str(tiny_bundle), "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"ortpack-serve: error: cannot listen on 127.0.0.1:{port} (--port): Address already in use"
    ]


@pytest.mark.parametrize(
    ("args", "env", "fragment"),
    [
        ([], {}, "no bundle given"),
        (["--bundle", "/no/such/bundle"], {}, "bundle not found"),
        (["--bundle", "{bundle}", "--variant", "cuda-fp16"], {}, "has no variant 'cuda-fp16'"),
        (["--bundle", "{bundle}"], {"ORTPACK_MAX_BATCH_SIZE": "zero"}, "ORTPACK_MAX_BATCH_SIZE"),
        (["--bundle", "{bundle}", "--port", "0"], {}, "--port must be in 1..65535"),
        (["--bundle", "{bundle}", "--max-tokens", "4096"], {}, "exceeds the model's 128"),
        (["--bundle", "{bundle}", "--max-items", "2048", "--max-queue-size", "1024"], {}, "could never be queued"),
        (["--bundle", "{bundle}", "--warmup", "maybe"], {}, "invalid _bool value: 'maybe'"),
        (["--bundle", "{bundle}", "--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        (["--bundle", "{bundle}", "--api-key-file", "/no/such/key"], {}, "cannot read --api-key-file"),
        (["--bundle", "{bundle}", "--max-batch-pixels", "-1"], {}, "--max-batch-pixels must be >= 0"),
    ],
)
def test_bad_start_is_one_line(args: list[str], env: dict[str, str], fragment: str, tiny_bundle: Path) -> None:
    argv = [a.replace("{bundle}", str(tiny_bundle)) for a in args]
    if "--port" not in argv:
        argv += ["--port", str(free_port())]
    result = serve(*argv, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ortpack-serve: error:") and fragment in lines[0], result.stderr


def test_help_shows_real_defaults_and_version() -> None:
    help_text = " ".join(serve("--help").stdout.split())
    for fragment in (
        "--max-queue-size MAX_QUEUE_SIZE most items waiting",
        "[ORTPACK_MAX_QUEUE_SIZE; default 2048]",
        "[ORTPACK_MAX_TOKENS; default the bundle's max length]",
        "--access-log [BOOL]",
        "bare --access-log means true, --no-access-log false",
        "--decode DECODE image bundles: how JPEGs are decoded",
        "[ORTPACK_SHUTDOWN_GRACE_S; default 0.0]",
        "[ORTPACK_API_KEY_FILE; default none]",
    ):
        assert fragment in help_text, fragment
    version = serve("--version")
    assert version.returncode == 0 and version.stdout.startswith("ortpack-serve ") and "onnxruntime" in version.stdout


def test_api_key_from_a_file(tiny_bundle: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    with running_server(tiny_bundle, "--api-key-file", str(key_file), log_dir=tmp_path) as s:
        assert "s3cret" not in " ".join(s.process.args)  # type: ignore[arg-type]
        ok = httpx.post(f"{s.url}/v1/embeddings", json={"input": "x"}, headers={"Authorization": "bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.post(f"{s.url}/v1/embeddings", json={"input": "x"}).status_code == 401


def test_sigterm_with_slow_body_clients_answers_them_in_json_and_exits(tiny_bundle: Path, tmp_path: Path) -> None:
    """Slow-body connections do not hold the drain past --body-timeout-s, and get a JSON 408
    (before: 35 s, then plain-text 500s with tracebacks)."""
    from tests.servers import parse, read_to_close

    with running_server(tiny_bundle, "--body-timeout-s", "2", log_dir=tmp_path) as s:
        port = int(s.url.rsplit(":", 1)[1])
        slow = []
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", port), timeout=15)
            sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            slow.append(sock)
        time.sleep(0.2)
        s.process.send_signal(signal.SIGTERM)
        answers = [read_to_close(sock, 15) for sock in slow]
        for sock in slow:
            sock.close()
        code = s.process.wait(15)
    assert code == 0
    for answer in answers:
        status, headers, body = parse(answer)
        assert status == 408 and headers["content-type"] == "application/json", answer[:200]
        assert body["error"]["type"] == "request_timeout"  # type: ignore[index]
    assert "Traceback" not in s.output()


def test_a_modelcar_bundle_is_waited_for(tiny_bundle: Path, tmp_path: Path) -> None:
    """KServe's modelcar links /mnt/models in while the server starts (MODEL_INIT_MODE=async):
    the server waits for the directory instead of failing; without the mode it fails at once."""
    later = tmp_path / "mnt" / "models"
    assert serve("--bundle", str(later), "--port", str(free_port())).returncode == 2
    with running_server(later, env={"MODEL_INIT_MODE": "async"}, log_dir=tmp_path, wait_ready=False) as server:
        time.sleep(1.0)
        assert server.process.poll() is None  # still waiting, not failed
        later.parent.mkdir()
        shutil.copytree(tiny_bundle, later)
        from tests.servers import wait_until_ready

        wait_until_ready(server)
        assert "waiting up to 300 s for the bundle" in server.output()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "no bundle given"),
        (["--bundle", "{bundle}", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--bundle", "{bundle}", "--port", "0"], "--port must be in 1..65535"),
    ],
)
def test_usage_errors_point_to_help(args: list[str], fragment: str, tiny_bundle: Path) -> None:
    """Like `ortpack`'s: one line that ends with where the options are explained."""
    result = serve(*[a.replace("{bundle}", str(tiny_bundle)) for a in args])
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert lines[0].endswith("(see ortpack-serve --help)"), lines[0]


def test_a_missing_bundle_is_not_a_usage_error(tiny_bundle: Path) -> None:
    result = serve("--bundle", "/no/such/bundle", "--port", str(free_port()))
    assert result.returncode == 2 and result.stderr.strip() == "ortpack-serve: error: bundle not found: /no/such/bundle"


def test_the_front_door_and_the_documented_examples(tiny_bundle: Path, tmp_path: Path) -> None:
    """GET / says what is served and where to go (JSON for clients, a page for browsers), and every
    example request body in the OpenAPI document works as it is against this server."""
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    with running_server(tiny_bundle, log_dir=tmp_path) as s:
        plain = httpx.get(f"{s.url}/")
        page = httpx.get(f"{s.url}/", headers={"Accept": browser})
        curl = httpx.get(f"{s.url}/", headers={"Accept": "*/*"})
        served = httpx.get(f"{s.url}/v2/models/tiny-bert").json()["parameters"]["variant"]
        doc = httpx.get(f"{s.url}/openapi.json").json()
        docs_page = httpx.get(f"{s.url}/docs").text
        answers = {}
        for path, operations in doc["paths"].items():
            if "post" not in operations:
                continue
            body = operations["post"]["requestBody"]["content"]["application/json"]["example"]
            url = s.url + path.replace("{name}", "tiny-bert").replace("{version}", "1")
            answers[path] = httpx.post(url, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"
    assert plain.headers["vary"] == "Accept"
    info = plain.json()
    assert [info[k] for k in ("name", "task", "variant", "version")] == ["tiny-bert", "text-embedding", served, "1"]
    links = {"docs": "/docs", "openapi": "/openapi.json", "metrics": "/metrics", "ready": "/v2/health/ready"}
    assert info["links"] == links
    routes = {(r["method"], r["path"]) for r in info["routes"]}
    assert routes == {("POST", "/v1/embeddings"), ("POST", "/v2/models/tiny-bert/infer")}
    assert info["server"]["name"] == "ortpack" and info["ready"] is True
    assert curl.headers["content-type"] == "application/json"
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<a href='/docs'>/docs</a>" in page.text and "/v1/embeddings" in page.text and "tiny-bert" in page.text
    assert set(answers) == {"/v1/embeddings", "/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer"}
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text)
    assert docs_page.count("<summary>example request") == len(answers)
