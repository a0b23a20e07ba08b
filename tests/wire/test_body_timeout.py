"""A request body must arrive within ``general_settings.body_read_timeout`` seconds, in full: a client that
trickles its upload (a byte now and then, never idle long enough for an idle timeout) is answered 408 in
OpenAI's error shape and its connection is let go, and the server answers everyone else meanwhile."""

from __future__ import annotations

import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy

TIMEOUT = 0.5  # the configured body_read_timeout: the trickle below would take 20 s to finish its body


class Trickle:
    """A raw HTTP request whose headers go out at once and whose body goes out one byte per 50 ms, up to 400
    bytes (20 s): never idle for long, never done within the timeout."""

    def __init__(self, url: str, path: str, content_type: str, start: bytes) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {content_type}\r\n"
            "Content-Length: 1000\r\n\r\n"
        )
        self.sock.sendall(head.encode() + start)
        self.answered = threading.Event()
        self.thread = threading.Thread(target=self._drip, daemon=True)
        self.thread.start()

    def _drip(self) -> None:
        for _ in range(400):
            if self.answered.wait(0.05):  # the client's pace, not a synchronisation: it stops once answered
                return
            try:
                self.sock.sendall(b" ")
            except OSError:
                return  # the server closed the connection

    def response(self) -> tuple[int, list[bytes], dict[str, Any]]:
        """The status, the header lines and the JSON body of the answer, read until the server closes the
        connection (it must: the rest of the body would otherwise keep it open)."""
        data = b""
        try:
            while chunk := self.sock.recv(65536):
                data += chunk
                if data.rstrip().endswith(b"}"):
                    self.answered.set()  # the client stops dripping once answered
        finally:
            self.answered.set()
            self.thread.join()
            self.sock.close()
        head, _, body = data.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        return int(status_line.split(b" ", 2)[1]), [line.lower() for line in lines], orjson.loads(body)


def check_timed_out(proxy: RunningProxy, fake: FakeUpstream, path: str, content_type: str, start: bytes) -> str:
    """Trickle a body to ``path``: the answer's error code, once everything else about it is checked."""
    trickle = Trickle(proxy.url, path, content_type, start)
    # While the upload trickles, the server answers others.
    assert httpx.get(f"{proxy.url}/healthz", timeout=10).status_code == 200
    status, lines, body = trickle.response()
    assert status == 408, body
    assert b"connection: close" in lines
    assert body["error"]["code"] == "request_timeout" and body["error"]["type"] == "invalid_request_error"
    assert str(TIMEOUT) in body["error"]["message"]
    assert fake.requests == []  # nothing was forwarded
    # And afterwards: a whole request is served as ever.
    chat = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(f"{proxy.base_url}/chat/completions", json=chat, timeout=20).status_code == 200
    return str(body["error"]["code"])


def test_a_trickled_json_body_is_a_408(proxy_factory: Any, fake_upstream: FakeUpstream) -> None:
    proxy = proxy_factory(body_read_timeout=TIMEOUT)
    code = check_timed_out(proxy, fake_upstream, "/v1/chat/completions", "application/json", b'{"model": ')
    assert code == "request_timeout"


def test_a_trickled_multipart_upload_is_a_408(proxy_factory: Any, fake_upstream: FakeUpstream) -> None:
    proxy = proxy_factory(body_read_timeout=TIMEOUT)
    code = check_timed_out(
        proxy,
        fake_upstream,
        "/v1/audio/transcriptions",
        "multipart/form-data; boundary=edge",
        b'--edge\r\nContent-Disposition: form-data; name="file"; filename="clip.wav"\r\n\r\n',
    )
    assert code == "request_timeout"


def test_the_default_is_a_minute(tmp_path: Any, upstream_url: str) -> None:
    from tests.support.proxies import make_config

    assert make_config(upstream_url, tmp_path).general_settings.body_read_timeout == 60


# --- answered before the body was read: the connection is let go too ------------------------------------------


def answered_early(url: str, path: str, content_type: str) -> tuple[bytes, bool]:
    """A chunked POST whose headers go out at once and whose body trickles (a chunk per 50 ms, for up to 20 s)
    while the server answers without reading it (a refusal, an unknown path). The answer's head, and whether
    the server closed the connection while the client was still sending."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {content_type}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n".encode()
    )
    closed = threading.Event()

    def drip() -> None:
        for _ in range(400):
            if closed.wait(0.05):  # the client's pace; it stops once the server has closed
                return
            try:
                sock.sendall(b"1\r\nx\r\n")
            except OSError:
                return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    data = b""
    try:
        # Until the server closes (recv gives b"" or the connection is reset), or the socket timeout passes
        # (10 s without a byte): a deadline so the test cannot hang, not a measure of speed.
        while chunk := sock.recv(65536):
            data += chunk
        hung_up = True
    except ConnectionResetError:
        hung_up = True
    except TimeoutError:
        hung_up = False
    finally:
        closed.set()
        thread.join()
        sock.close()
    return data.partition(b"\r\n\r\n")[0].lower(), hung_up


def test_a_refusal_before_the_body_closes_the_connection(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    # The guard's 415 (a text/plain body), a 404 and a 405: none reads the body, and a client trickling it would
    # otherwise hold the connection for ever (each byte resets uvicorn's keep-alive timer).
    for path, content_type, status in (
        ("/v1/chat/completions", "text/plain", b" 415 "),
        ("/v1/no-such-route", "application/json", b" 404 "),
        ("/healthz", "application/json", b" 405 "),
    ):
        head, hung_up = answered_early(proxy.url, path, content_type)
        assert status in head.split(b"\r\n")[0], head
        assert b"connection: close" in head.split(b"\r\n"), head
        assert hung_up, path
    assert fake_upstream.requests == []


def test_a_request_read_in_full_keeps_its_connection(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    chat = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(timeout=20) as client:
        ports = []
        for _ in range(2):
            response = client.post(f"{proxy.base_url}/chat/completions", json=chat)
            assert response.status_code == 200 and "connection" not in response.headers
            ports.append(response.extensions["network_stream"].get_extra_info("client_addr"))
        # A refusal of a request without a body keeps it too.
        assert client.get(f"{proxy.url}/no-such-route").status_code == 404
        assert client.get(f"{proxy.url}/healthz").status_code == 200
    assert ports[0] == ports[1]  # both requests went over one connection


def test_a_413_closes_the_connection_itself() -> None:
    # Refused part way through the body, the rest may still be on its way (as with the 408).
    from proxy.wire.http import error_response, too_large

    assert error_response(too_large(10)).headers["connection"] == "close"
