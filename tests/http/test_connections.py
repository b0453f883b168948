"""What a connection may cost before its request reaches a route (service/http/connections.py
and the body limits of service/http/middleware.py), against a real `nmt serve` over raw
sockets: idle and slow headers are cut off, oversized headers get 431, a client past its
connection cap gets 429 while health checks still answer, and a slow body takes no in-flight
slot and has one deadline for the whole body.

Every wait here is a generous upper bound (the behaviour it checks happens in a second or two
after a 1 s limit); none is a timing measurement."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import running_server


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=15)


def read_answer(sock: socket.socket) -> tuple[int | None, bytes]:
    """The status and body the server wrote before closing (None: closed without a word)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    if not data:
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def request(path: str, body: bytes = b"", headers: str = "") -> bytes:
    method = "POST" if body else "GET"
    return (
        f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{headers}\r\n"
    ).encode() + body


JSON = {"content-type": "application/json"}
TRANSLATE = json.dumps({"text": "Un homme.", "source_lang": "fr", "target_lang": "en"}).encode()


def test_idle_and_slow_headers_are_cut_off_at_the_header_timeout(model_dir: Path, logs: Path):
    with running_server(model_dir, logs, header_timeout_seconds=1) as server:
        idle = connect(server.url)  # sends nothing at all
        slow = connect(server.url)  # slowloris: a header line every 0.3 s, never the end
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
        started = time.monotonic()
        with pytest.raises(OSError):  # the server closes it; a send then fails
            while time.monotonic() - started < 15:
                slow.sendall(b"X-Padding: a\r\n")
                time.sleep(0.3)
        assert time.monotonic() - started < 10
        status, _ = read_answer(slow)
        assert status in (408, None)  # 408 when the answer was read before the reset
        assert read_answer(idle) == (None, b"")  # closed without a word: it asked nothing
        # A request that sends its headers at once is served as before.
        assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
        refused = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'nmt_connections_refused_total{reason="header_timeout"} 2.0' in refused


def test_headers_past_the_limit_get_431_whether_they_arrive_at_once_or_in_pieces(
    model_dir: Path, logs: Path
):
    with running_server(model_dir, logs, max_header_bytes=8192) as server:
        whole = connect(server.url)
        whole.sendall(request("/healthz", headers=f"X-Big: {'a' * 20000}\r\n"))
        status, body = read_answer(whole)
        assert status == 431
        assert "NMT_MAX_HEADER_BYTES" in json.loads(body)["detail"]
        # 10 MB of a header that never ends: refused after the first few kilobytes (what the
        # client managed to send is what the kernel's socket buffers took meanwhile).
        endless = connect(server.url)
        endless.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: ")
        sent = 0
        with pytest.raises(OSError):
            while sent < 10_000_000:
                endless.sendall(b"a" * 4096)
                sent += 4096
        assert sent < 10_000_000
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        assert 'nmt_connections_refused_total{reason="header_too_large"} 2.0' in metrics
        # Headers within the limit are served.
        small = connect(server.url)
        small.sendall(request("/healthz", headers=f"X-Small: {'a' * 4000}\r\n"))
        assert small.recv(12).startswith(b"HTTP/1.1 200")


def test_past_the_per_client_cap_requests_get_429_and_health_checks_still_answer(
    model_dir: Path, logs: Path
):
    with running_server(model_dir, logs, max_connections_per_client=3) as server:
        held = [connect(server.url) for _ in range(3)]
        extra = connect(server.url)
        extra.sendall(request("/v1/translate", TRANSLATE))
        status, body = read_answer(extra)
        assert status == 429
        assert "NMT_MAX_CONNECTIONS_PER_CLIENT" in json.loads(body)["detail"]
        probe = connect(server.url)
        probe.sendall(request("/healthz", headers="Connection: close\r\n"))
        assert read_answer(probe)[0] == 200
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 10
        while (
            response := httpx.post(f"{server.url}/v1/translate", content=TRANSLATE, headers=JSON)
        ).status_code != 200:
            assert time.monotonic() < deadline, response.text
            time.sleep(0.1)


def test_a_slow_body_holds_no_in_flight_slot_and_has_one_deadline_for_the_whole_body(
    model_dir: Path, logs: Path
):
    settings = {"max_requests_in_flight": 2, "body_timeout_seconds": 2}
    with running_server(model_dir, logs, **settings) as server:
        # Three slow bodies: a byte every 0.5 s, so no pause is as long as the timeout.
        slow = [connect(server.url) for _ in range(3)]
        for sock in slow:
            sock.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: test\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
            )
        time.sleep(0.5)
        # They take connections, not slots: a client that sends its body at once is served.
        assert (
            httpx.post(f"{server.url}/v1/translate", content=TRANSLATE, headers=JSON).status_code
            == 200
        )
        started = time.monotonic()
        statuses: list[int | None] = []
        for sock in slow:
            try:
                while time.monotonic() - started < 15:
                    sock.sendall(b" ")
                    time.sleep(0.5)
            except OSError:
                pass
            statuses.append(read_answer(sock)[0])
        assert time.monotonic() - started < 10  # the deadline, not the pauses, ended them
        assert set(statuses) <= {408, None} and 408 in statuses


def test_a_client_that_leaves_mid_body_is_a_499_not_a_500(model_dir: Path, logs: Path):
    """Its request never reaches a route (the body is read first): nothing to answer, no
    error logged, and the metrics count a client that closed the request."""
    paths = ["/v1/translate", "/translate", "/v2/translate", "/v2/glossaries", "/detect"]
    with running_server(model_dir, logs) as server:
        for path in paths:
            sock = connect(server.url)
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                'Content-Length: 1000\r\n\r\n{"q": "Un homme'.encode()
            )
            time.sleep(0.2)
            sock.close()
        deadline = time.monotonic() + 15
        while True:  # (the server notices each close on its own time)
            metrics = httpx.get(f"{server.url}/metrics").text
            closed = [
                line
                for line in metrics.splitlines()
                if line.startswith("nmt_requests_total{") and 'status="499"' in line
            ]
            if sum(float(line.rsplit(" ", 1)[1]) for line in closed) >= len(paths):
                break
            assert time.monotonic() < deadline, metrics
            time.sleep(0.2)
        assert 'status="500"' not in metrics
        assert httpx.post(f"{server.url}/v1/translate", content=TRANSLATE, headers=JSON).is_success
    assert "unhandled error" not in server.log()
