"""The connection layer of a real server on 127.0.0.1 (serving/protocol.py): bounded headers,
slow and idle clients, the connection limit, protocol errors in the JSON error shape, clients
that go away, and the metrics port. Raw sockets, bounded loops, generous upper bounds only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.fakes import metric
from tests.servers import RunningServer, free_port, parse, read_to_close, running_server

KEY = "k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tiny_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, int]]:
    metrics_port = free_port()
    with running_server(
        tiny_bundle,
        "--api-key",
        KEY,
        "--metrics-port",
        str(metrics_port),
        "--max-header-bytes",
        "8192",
        "--max-headers",
        "20",
        "--header-timeout-s",
        "1",
        "--body-timeout-s",
        "1",
        "--timeout-keep-alive-s",
        "1",
        "--max-connections",
        "40",
        "--workers",
        "1",
        "--max-batch-size",
        "1",
        "--access-log",
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as s:
        yield s, metrics_port


def port_of(server: RunningServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def talk(port: int, data: bytes, timeout: float = 10) -> bytes:
    """Send `data`, then read until the server closes (or `timeout` passes: the test then fails)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_to_close(sock, timeout)


def scrape(metrics_port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text


# --- headers ----------------------------------------------------------------------------------


def test_header_limits_answer_431_in_the_json_shape(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    port = port_of(s)
    big = talk(port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
    many = talk(
        port,
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(2000)) + b"\r\n",
    )
    for answer in (big, many):
        status, headers, body = parse(answer)
        assert status == 431 and headers["content-type"] == "application/json" and headers["connection"] == "close"
        assert body["error"]["type"] == "headers_too_large" and body["error"]["code"] == 431  # type: ignore[index]
    ok = httpx.get(f"{s.url}/v2/health/live", headers={"X-Fine": "b" * 4000})
    assert ok.status_code == 200


def test_header_flood_keeps_memory_bounded(server: tuple[RunningServer, int]) -> None:
    """8 connections each trying to send 64 MB of one header: the server reads at most the limit of
    each, answers 431 and closes; its memory stays within 50 MB of idle (before: +1 GB)."""
    s, _ = server
    port = port_of(s)
    process = psutil.Process(s.process.pid)
    idle = process.memory_info().rss
    sent: list[int] = []

    def flood() -> None:
        total = 0
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Flood: ")
                chunk = b"f" * 65536
                for _ in range(1024):  # at most 64 MB
                    sock.sendall(chunk)
                    total += len(chunk)
        except OSError:
            pass  # closed by the server: what should happen
        sent.append(total)

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for thread in threads:
        thread.start()
    peak = idle
    while any(t.is_alive() for t in threads):
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.01)
    for thread in threads:
        thread.join(60)
    peak = max(peak, process.memory_info().rss)
    assert peak - idle < 50 * 1024**2, f"RSS grew {(peak - idle) / 1024**2:.0f} MB"
    assert max(sent) < 64 * 1024**2, "a flood was read to its end"
    assert httpx.get(f"{s.url}/v2/health/live").status_code == 200


# --- protocol errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",
        b"GET /v1/models HTTP/9.9\r\n\r\n",
    ],
    ids=["bad-request-line", "conflicting-content-length", "nul-in-header", "bad-version"],
)
def test_protocol_errors_answer_400_in_the_json_shape(server: tuple[RunningServer, int], request_bytes: bytes) -> None:
    s, _ = server
    status, headers, body = parse(talk(port_of(s), request_bytes))
    assert status == 400 and headers["content-type"] == "application/json"
    assert body["error"]["type"] == "invalid_request" and "malformed HTTP request" in body["error"]["message"]  # type: ignore[index]


# --- slow and idle clients --------------------------------------------------------------------


def test_slow_header_client_gets_408_and_is_closed(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n")  # ... and never the rest
        answer = read_to_close(sock, 10)
    assert time.monotonic() - started < 9, "not closed by the header timeout"
    status, _, body = parse(answer)
    assert status == 408 and body["error"]["type"] == "request_timeout"  # type: ignore[index]


def test_slow_body_client_gets_408_and_is_closed(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        sock.sendall(head.encode() + b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"input"')
        answer = read_to_close(sock, 10)
    assert time.monotonic() - started < 9, "not closed by the body timeout"
    status, _, body = parse(answer)
    assert status == 408 and "body" in body["error"]["message"]  # type: ignore[index]


def test_a_body_in_many_pieces_arrives_whole(server: tuple[RunningServer, int]) -> None:
    """The connection writes a body straight into the route's buffer as it arrives (past uvicorn's
    64 KB pause): a 300 KB body sent in 40 pieces, with pauses, and a second request on the same
    connection after it, each answer the same as for the compact body."""
    s, _ = server
    compact = httpx.post(f"{s.url}/v1/embeddings", json={"input": "pieces"}, headers=AUTH).json()
    body = b'{"input": "pieces"' + b" " * 300_000 + b"}"
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        for _ in range(2):
            sock.sendall(head.encode())
            step = len(body) // 40 + 1
            for start in range(0, len(body), step):
                sock.sendall(body[start : start + step])
                time.sleep(0.005)
            reader = sock.makefile("rb")
            assert reader.readline().startswith(b"HTTP/1.1 200")
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            answer = json.loads(reader.read(length))
            assert answer["data"][0]["embedding"] == compact["data"][0]["embedding"]


def test_expect_100_continue_is_answered_before_the_body(server: tuple[RunningServer, int]) -> None:
    """A client that sends `Expect: 100-continue` (curl does for bodies over 1 KB) hears 100 before
    it sends its body, then the answer."""
    s, _ = server
    body = b'{"input": "continue"}'
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nExpect: 100-continue\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=5) as sock:
        sock.sendall(head.encode())
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")  # within the timeout
        sock.sendall(body)
        assert sock.makefile("rb").readline().startswith(b"HTTP/1.1 200")


def test_idle_connection_is_closed(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        assert read_to_close(sock, 10) == b""  # a connection that never sends: closed quietly
    assert time.monotonic() - started < 9


@contextlib.contextmanager
def at_the_connection_limit(port: int) -> Iterator[None]:
    """The server's 40 connections (its --max-connections) held open while the block runs."""
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    try:
        yield
    finally:
        for sock in held:
            sock.close()


def test_connection_limit_answers_503(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    port = port_of(s)
    with at_the_connection_limit(port), socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
        status, headers, body = parse(read_to_close(extra, 10))
    assert status == 503 and headers["retry-after"] == "1"
    assert "too many connections" in body["error"]["message"]  # type: ignore[index]


# --- answers before the body: the client still writing reads them -------------------------------


def read_answer(sock: socket.socket, timeout: float = 10) -> tuple[int, dict[str, str], dict[str, object]]:
    """One answer on a connection that may stay open: the head, then Content-Length bytes."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before an answer: {data!r}"
        data += chunk
    _, headers, _ = parse(data.partition(b"\r\n\r\n")[0] + b"\r\n\r\n")
    while len(data.partition(b"\r\n\r\n")[2]) < int(headers["content-length"]):
        data += sock.recv(65536)
    return parse(data)


def send_slowly(sock: socket.socket, body: bytes, pause_after: int, pause_s: float) -> None:
    """Write `body` in 64 KB pieces with one pause: a client that keeps writing after the answer
    came (sendall raises if the server closed meanwhile: the reset this checks against)."""
    for offset in range(0, len(body), 1 << 16):
        if offset == pause_after:
            time.sleep(pause_s)
        sock.sendall(body[offset : offset + (1 << 16)])


def test_a_client_that_reads_the_early_answer_then_writes_its_body_is_not_reset(
    server: tuple[RunningServer, int],
) -> None:
    """401 comes before the 2 MB body is read; this client reads it, pauses 1.5 s (past the 1 s
    keep-alive and body timeouts) and writes its body all the same. Before, the keep-alive timer
    closed the connection during the pause and the body's first bytes were answered with a reset;
    now the server lingers: a FIN after the answer, the body read and dropped, then the close."""
    s, _ = server
    body = b"x" * (2 << 20)
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        sock.sendall(head.encode())
        status, _, answer = read_answer(sock)
        time.sleep(1.5)
        send_slowly(sock, body, pause_after=-1, pause_s=0)
        assert sock.recv(1) == b""  # the server's FIN, not a reset
    assert status == 401 and answer["error"]["type"] == "unauthorized"  # type: ignore[index]


def test_a_body_dropped_after_an_early_answer_keeps_the_connection(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    body = b"x" * (2 << 20)
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        refused, _, _ = read_answer(sock)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        live, _, _ = read_answer(sock)
    assert (refused, live) == (401, 200)


def test_a_body_over_twice_the_limit_is_cut_off_after_the_answer(server: tuple[RunningServer, int]) -> None:
    """413 before reading a 64 MB body (the limit is 4 MB): the server drops up to twice the limit,
    then closes; the client, still writing, is reset. Bounded work, never the whole body."""
    s, _ = server
    head = "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        sock.sendall(head.encode())
        with pytest.raises(OSError):  # reset (or broken pipe) once the server stopped dropping
            for _ in range(1024):
                sock.sendall(b"x" * (1 << 16))
                sent += 1 << 16
    assert sent < 32 << 20, f"{sent >> 20} MB read after the answer"


def test_a_refusal_that_closes_lingers_for_the_client_still_writing(server: tuple[RunningServer, int]) -> None:
    """Over the connection limit: 503 at once, and the connection closes. A client writing a 2 MB
    request meanwhile still reads the 503 (the server drops the bytes, then closes)."""
    s, _ = server
    port = port_of(s)
    body = b"x" * (2 << 20)
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with at_the_connection_limit(port), socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
        time.sleep(0.2)  # the 503 and the FIN are sent before the request is
        send_slowly(extra, head.encode() + body, pause_after=-1, pause_s=0)
        status, headers, answer = parse(read_to_close(extra, 10))
    assert status == 503 and headers["retry-after"] == "1"
    assert "too many connections" in answer["error"]["message"]  # type: ignore[index]


# --- clients that go away ---------------------------------------------------------------------


def test_a_client_gone_after_sending_drops_its_queued_work(server: tuple[RunningServer, int]) -> None:
    """1,000 texts, one per model call on one worker, and the client closes at once: the server
    stops computing them (before: every item was computed for nobody)."""
    s, metrics_port = server
    before = metric(scrape(metrics_port), "ortpack_items_total")
    gone_before = metric(scrape(metrics_port), 'ortpack_requests_total{route="/v1/embeddings",status="499"}')
    body = json.dumps({"input": [f"text number {i} " * 8 for i in range(1000)]}).encode()
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        time.sleep(0.05)
    for _ in range(200):  # up to 10 s for the server to notice
        text = scrape(metrics_port)
        if metric(text, 'ortpack_requests_total{route="/v1/embeddings",status="499"}') > gone_before:
            break
        time.sleep(0.05)
    else:
        pytest.fail("no 499 counted for the client that went away")
    time.sleep(0.3)
    done = metric(scrape(metrics_port), "ortpack_items_total") - before
    assert done < 1000, f"{done:.0f} items computed for a client that was gone"
    assert metric(scrape(metrics_port), "ortpack_queue_depth") == 0


def test_a_client_gone_mid_body_is_499_without_a_traceback(server: tuple[RunningServer, int]) -> None:
    s, metrics_port = server
    label = 'ortpack_requests_total{route="/v1/embeddings",status="499"}'
    before = metric(scrape(metrics_port), label)
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    with socket.create_connection(("127.0.0.1", port_of(s)), timeout=10) as sock:
        sock.sendall(head.encode() + b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"input": ')
        time.sleep(0.05)
    for _ in range(100):
        if metric(scrape(metrics_port), label) > before:
            break
        time.sleep(0.05)
    assert metric(scrape(metrics_port), label) == before + 1
    assert "Traceback" not in s.output() and " 500 " not in s.output()


# --- the metrics port and the operator's view --------------------------------------------------


def test_metrics_port_needs_no_key_and_the_main_port_does(server: tuple[RunningServer, int]) -> None:
    s, metrics_port = server
    assert httpx.get(f"{s.url}/metrics").status_code == 401
    assert httpx.get(f"{s.url}/metrics", headers=AUTH).status_code == 200
    side = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert side.status_code == 200 and "ortpack_requests_total" in side.text and "_created" not in side.text
    assert httpx.get(f"http://127.0.0.1:{metrics_port}/v1/models").status_code == 404


def test_answers_carry_ids_and_times_and_the_log_says_it_once(server: tuple[RunningServer, int]) -> None:
    s, _ = server
    answer = httpx.post(f"{s.url}/v1/embeddings", json={"input": "hello"}, headers={**AUTH, "x-request-id": "req-42"})
    assert answer.status_code == 200 and answer.headers["x-request-id"] == "req-42"
    assert float(answer.headers["x-queue-time"]) >= 0 and float(answer.headers["x-inference-time"]) > 0
    log = s.output()
    assert log.count("ready: tiny-bert variant cpu-") == 1 and " (ORT " in log, log
    assert "Uvicorn running" not in log and "Started server process" not in log
    assert "request_id=req-42" in log and "route=/v1/embeddings status=200 items=1" in log


def test_an_answers_head_and_body_go_out_in_one_send() -> None:
    """uvicorn writes an answer's status line and headers, then its body: the connection's transport
    sends both at once (one system call, one wake-up of the client); a head with no body write
    (a HEAD answer) goes out at the end of the event loop's turn; a 100 Continue, before the
    answer, at once."""
    from types import SimpleNamespace

    from ortpack.serving.protocol import _CloseAfterAnswer

    class Socket:  # the transport under the wrapper: records each send
        def __init__(self) -> None:
            self.sends: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.sends.append(bytes(data))

        def writelines(self, pieces: Iterator[bytes]) -> None:
            self.sends.append(b"".join(pieces))

        def is_closing(self) -> bool:
            return False

    async def answer(head_only: bool) -> list[bytes]:
        sock, cycle = Socket(), SimpleNamespace(response_started=False)
        protocol = SimpleNamespace(loop=asyncio.get_running_loop(), close_after_answer=lambda: None)
        transport = _CloseAfterAnswer(sock, protocol, cycle)  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        cycle.response_started = True
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        if not head_only:
            transport.write(b"{}")
        before_turn = len(sock.sends)
        await asyncio.sleep(0)
        return [*sock.sends[:before_turn], b"-- turn --", *sock.sends[before_turn:]]

    assert asyncio.run(answer(head_only=False)) == [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}",
        b"-- turn --",
    ]
    assert asyncio.run(answer(head_only=True)) == [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"-- turn --",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n",
    ]
