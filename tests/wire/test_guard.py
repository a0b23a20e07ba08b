"""What a web page can make the proxy do (``proxy.wire.guard``): on loopback, a DNS-rebound name is refused;
a cross-site request is refused unless its origin is listed in ``cors_allow_origins``; JSON endpoints refuse
bodies of other types (what a page can send without a preflight). Tools and SDKs, which send no ``Origin``,
are not concerned. The same requests from a real browser: tests/wire/test_browser.py."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import orjson
import pytest
from starlette.testclient import TestClient

from proxy.app import create_app
from proxy.config.loading import parse_config
from proxy.errors import ConfigError
from proxy.wire.guard import Hosts, split_host
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy, make_config
from tests.support.servers import serve_in_thread
from tests.support.transcripts import long_history

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
EVIL = "http://evil.example"
LCM = {"fresh_tail_count": 4, "leaf_chunk_tokens": 300, "leaf_target_tokens": 64}


def port_of(app_proxy: AppProxy) -> int:
    return int(urlsplit(app_proxy.url).port or 0)


def error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["code"] == code, body
    assert response.headers["x-should-retry"] == "false"
    return str(body["message"])


def stored(app_proxy: AppProxy) -> list[str]:
    response = app_proxy.client.get(f"{app_proxy.url}/lcm/conversations", timeout=20)
    assert response.status_code == 200, response.text
    return [c["id"] for c in response.json()["data"]]


# --- Host: DNS rebinding ------------------------------------------------------------------------------------


def test_a_rebound_host_is_refused_on_loopback(app_proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    port = port_of(app_proxy)
    conversation = app_proxy.client.post(f"{app_proxy.base_url}/chat/completions", json=CHAT, timeout=20)
    assert conversation.status_code == 200
    conversation_id = conversation.headers["x-lcm-conversation-id"]
    sent = len(fake_upstream.requests)
    evil = {"host": f"evil.example:{port}"}
    # What a rebinding page would do as "its own origin": read the history, delete it, chat on our keys.
    message = error(app_proxy.client.get(f"{app_proxy.url}/lcm/conversations", headers=evil), 403, "host_not_allowed")
    assert "evil.example" in message and "allowed_hosts" in message
    error(
        app_proxy.client.get(f"{app_proxy.url}/lcm/conversations/{conversation_id}/messages", headers=evil),
        403,
        "host_not_allowed",
    )
    error(
        app_proxy.client.delete(f"{app_proxy.url}/lcm/conversations/{conversation_id}", headers=evil),
        403,
        "host_not_allowed",
    )
    error(
        app_proxy.client.post(f"{app_proxy.base_url}/chat/completions", json=CHAT, headers=evil),
        403,
        "host_not_allowed",
    )
    error(app_proxy.client.get(f"{app_proxy.url}/healthz", headers={"host": "evil.example"}), 403, "host_not_allowed")
    error(app_proxy.client.get(f"{app_proxy.url}/healthz", headers={"host": ""}), 403, "host_not_allowed")
    assert len(fake_upstream.requests) == sent and stored(app_proxy) == [conversation_id]
    # Loopback names and addresses, with any port or none, are this machine.
    for host in (f"localhost:{port}", "LOCALHOST", "localhost.", "app.localhost:5173", "127.0.0.1", "127.1.2.3:9"):
        assert app_proxy.client.get(f"{app_proxy.url}/healthz", headers={"host": host}).status_code == 200, host
    assert app_proxy.client.get(f"{app_proxy.url}/healthz", headers={"host": f"[::1]:{port}"}).status_code == 200


def test_allowed_hosts_names_the_others(app_factory: Any) -> None:
    proxy = app_factory(allowed_hosts=["proxy.internal", ".example.com", "10.0.0.7", "[fd00::1]"])

    def status(host: str) -> int:
        return proxy.client.get(f"{proxy.url}/healthz", headers={"host": host}, timeout=20).status_code

    for host in ("proxy.internal:4000", "example.com", "api.example.com", "10.0.0.7:4000", "[fd00::1]:80"):
        assert status(host) == 200, host
    assert status(f"localhost:{port_of(proxy)}") == 200  # loopback always: health checks, the machine's own tools
    for host in ("evil.example", "example.com.evil.example", "notexample.com", "10.0.0.8", "proxy.internal.evil"):
        assert status(host) == 403, host
    anyone = app_factory(allowed_hosts=["*"])
    assert anyone.client.get(f"{anyone.url}/healthz", headers={"host": "evil.example"}, timeout=20).status_code == 200


def test_a_non_loopback_bind_without_keys_serves_only_names_a_page_cannot_rebind(
    upstream_url: str, tmp_path: Any
) -> None:
    # The Docker image as shipped: bound to 0.0.0.0, no keys, published on 127.0.0.1:4000. A page at
    # http://evil.test:4000 whose name resolves to 127.0.0.1 is same-origin with itself, so nothing but the
    # Host stands between it and a keyless proxy.
    config = make_config(upstream_url, tmp_path / "open")
    with serve_in_thread(create_app(config, bind_host="0.0.0.0")) as url:
        port = urlsplit(url).port

        def status(host: str) -> int:
            return httpx.get(f"{url}/healthz", headers={"host": host}, timeout=20).status_code

        for host in (f"evil.test:{port}", "evil.test", "proxy.lan:4000", "localhost.evil.test"):
            assert status(host) == 403, host
        message = error(
            httpx.get(f"{url}/lcm/conversations", headers={"host": f"evil.test:{port}"}), 403, "host_not_allowed"
        )
        assert "general_settings.allowed_hosts" in message and "api_keys" in message
        chat = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers={"host": f"evil.test:{port}"}, timeout=20)
        error(chat, 403, "host_not_allowed")
        # Names no page can rebind: IP addresses (what a page's own name never is), localhost, this machine's
        # own name. Other containers and hosts on the LAN reach it so.
        for host in (f"127.0.0.1:{port}", "localhost", f"localhost.:{port}", "app.localhost", "172.17.0.2:4000"):
            assert status(host) == 200, host
        assert status(f"[::1]:{port}") == 200 and status("[fd00::7]:4000") == 200
        assert status(socket.gethostname()) == 200 and status(f"{socket.gethostname()}:{port}") == 200
    # Listed in allowed_hosts: served (the name other containers use for it, a LAN name).
    listed = make_config(upstream_url, tmp_path / "listed", allowed_hosts=["lcm-proxy", "proxy.lan"])
    with serve_in_thread(create_app(listed, bind_host="0.0.0.0")) as url:
        assert httpx.get(f"{url}/healthz", headers={"host": "lcm-proxy:4000"}, timeout=20).status_code == 200
        assert httpx.get(f"{url}/healthz", headers={"host": "evil.test"}, timeout=20).status_code == 403
    # With keys a rebound page is still stopped (it does not know the key): any name is served.
    keyed = make_config(upstream_url, tmp_path / "keyed", api_keys=[{"key": "sk-lcm-guard-test", "tenant": "t"}])
    with serve_in_thread(create_app(keyed, bind_host="0.0.0.0")) as url:
        auth = {"authorization": "Bearer sk-lcm-guard-test"}
        for host in ("proxy.lan:4000", "lcm-proxy:4000"):
            served = httpx.get(f"{url}/lcm/conversations", headers={"host": host, **auth}, timeout=20)
            assert served.status_code == 200, (host, served.text)
    # Bound to loopback, explicitly: loopback names only, keys or not (issue 22).
    with serve_in_thread(create_app(make_config(upstream_url, tmp_path / "closed"), bind_host="127.0.0.1")) as url:
        assert httpx.get(f"{url}/healthz", headers={"host": "proxy.lan:4000"}, timeout=20).status_code == 403
        assert httpx.get(f"{url}/healthz", headers={"host": "10.0.0.7:4000"}, timeout=20).status_code == 403
    closed_keyed = make_config(
        upstream_url, tmp_path / "ck", host="127.0.0.1", api_keys=[{"key": "sk-lcm-x", "tenant": "t"}]
    )
    with serve_in_thread(create_app(closed_keyed, bind_host="127.0.0.1")) as url:
        assert httpx.get(f"{url}/healthz", headers={"host": "proxy.lan:4000"}, timeout=20).status_code == 403


def test_in_a_container_the_server_address_is_not_loopback(upstream_url: str, tmp_path: Any) -> None:
    # docker run -p 127.0.0.1:4000:4000: the request reaches the container's own address (172.17.0.x), so the
    # loopback-address fallback never applies; the rule must hold on every server address.
    config = make_config(upstream_url, tmp_path / "container")
    with TestClient(create_app(config, bind_host="0.0.0.0"), base_url="http://172.17.0.2:4000") as client:
        assert client.get("/healthz").status_code == 200  # Host: 172.17.0.2:4000, an address
        error(client.get("/lcm/conversations", headers={"host": "evil.test:4000"}), 403, "host_not_allowed")
        assert client.get("/healthz", headers={"host": "localhost:4000"}).status_code == 200


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("LocalHost:4000", ("localhost", 4000)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::1]", ("::1", None)),
        ("example.com.", ("example.com", None)),
        ("a:b:c", None),
        ("[::1", None),
        ("host:port", None),
        ("", None),
        ("user@host", None),
    ],
)
def test_host_headers_are_read_strictly(value: str, parsed: tuple[str, int | None] | None) -> None:
    assert split_host(value) == parsed


def test_hosts_match_names_and_domains() -> None:
    hosts = Hosts.of([".example.com", "Proxy.Internal"])
    assert hosts.allows("example.com") and hosts.allows("a.b.example.com") and hosts.allows("proxy.internal")
    assert not hosts.allows("badexample.com") and not hosts.allows("evil.test")
    assert hosts.allows("127.0.0.5") and hosts.allows("::1") and hosts.allows("x.localhost")


@pytest.mark.parametrize("entry", ["http://proxy.internal", "proxy.internal:4000", "proxy.internal/x", "", "a b"])
def test_allowed_hosts_entries_must_be_host_names(tmp_path: Any, entry: str) -> None:
    raw = {
        "model_list": [{"model_name": "m", "litellm_params": {"model": "openai/m", "api_base": "http://127.0.0.1:1"}}],
        "general_settings": {"data_dir": str(tmp_path), "allowed_hosts": ["ok.example", entry]},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert "general_settings.allowed_hosts" in str(info.value) and "entry 1" in str(info.value)


# --- cross-site requests and content types -------------------------------------------------------------------


def test_simple_cross_site_requests_run_nothing(app_factory: Any, fake_upstream: FakeUpstream) -> None:
    proxy = app_factory(lcm=LCM)
    history = long_history(12)
    created = proxy.client.post(f"{proxy.base_url}/chat/completions", json={**CHAT, "messages": history}, timeout=30)
    assert created.status_code == 200
    conversation = created.headers["x-lcm-conversation-id"]
    sent = len(fake_upstream.requests)
    evil = {"origin": EVIL, "sec-fetch-site": "cross-site"}
    text_chat = CHAT | {"messages": [{"role": "user", "content": "spend their keys"}]}
    # A page's fetch() of a text/plain POST, and a form posted at the proxy: no preflight, so only the proxy
    # can say no.
    plain = proxy.client.post(
        f"{proxy.base_url}/chat/completions",
        content=orjson.dumps(text_chat),
        headers={**evil, "content-type": "text/plain;charset=UTF-8"},
    )
    assert "evil.example" in error(plain, 403, "cross_origin_request")
    form = proxy.client.post(f"{proxy.url}/lcm/conversations/{conversation}/compact", data={"x": "1"}, headers=evil)
    error(form, 403, "cross_origin_request")
    # JSON from another origin too (a non-browser could send it; a browser would have asked first).
    error(
        proxy.client.post(f"{proxy.base_url}/chat/completions", json=text_chat, headers=evil),
        403,
        "cross_origin_request",
    )
    error(
        proxy.client.delete(f"{proxy.url}/lcm/conversations/{conversation}", headers=evil), 403, "cross_origin_request"
    )
    # An <img> or <script> pointed at the history: no Origin, but Sec-Fetch-Site says who sent it.
    for sender in ("cross-site", "same-site"):
        loaded = proxy.client.get(f"{proxy.url}/lcm/conversations", headers={"sec-fetch-site": sender})
        error(loaded, 403, "cross_origin_request")
    # Another port of this machine is another origin (a dev server's page at localhost:5173).
    other_port = {"origin": "http://localhost:5173", "sec-fetch-site": "same-site"}
    error(
        proxy.client.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=other_port),
        403,
        "cross_origin_request",
    )
    error(
        proxy.client.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers={"origin": "null"}),
        403,
        "cross_origin_request",
    )
    assert len(fake_upstream.requests) == sent  # nothing reached the upstream: no chat, no summary
    assert stored(proxy) == [conversation]
    detail = proxy.client.get(f"{proxy.url}/lcm/conversations/{conversation}", timeout=20).json()
    assert detail["context_summaries"] == []  # the compaction never ran
    # The same compaction asked for by a tool runs, so the refusal above is what stopped it.
    compacted = proxy.client.post(f"{proxy.url}/lcm/conversations/{conversation}/compact", timeout=60)
    assert compacted.status_code == 200 and compacted.json()["leaf_passes"] >= 1


@pytest.mark.parametrize("origin", ["http://[", "http://[::1", "http://[::1]x", "http://[zz]:80", "https://[::1:4000"])
def test_an_unparsable_origin_is_another_origin(app_proxy: AppProxy, fake_upstream: FakeUpstream, origin: str) -> None:
    # urlsplit raises on these; a request carrying one is refused like any other origin, never a 500.
    response = app_proxy.client.post(
        f"{app_proxy.base_url}/chat/completions", json=CHAT, headers={"origin": origin}, timeout=20
    )
    assert "Origin" in error(response, 403, "cross_origin_request")
    assert fake_upstream.requests == []


def test_same_origin_and_tools_are_served(app_proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    port = port_of(app_proxy)
    for origin in (app_proxy.url, f"http://127.0.0.1:{port}", f"https://127.0.0.1:{port}"):
        same = app_proxy.client.post(
            f"{app_proxy.base_url}/chat/completions", json=CHAT, headers={"origin": origin}, timeout=20
        )
        assert same.status_code == 200, (origin, same.text)
    for sender in ("same-origin", "none"):  # the proxy's own origin, or typed into the address bar
        assert (
            app_proxy.client.get(f"{app_proxy.url}/lcm/conversations", headers={"sec-fetch-site": sender}).status_code
            == 200
        )
    # The real SDK, as ever.
    client = openai.OpenAI(base_url=app_proxy.base_url, api_key="unused", max_retries=0, http_client=app_proxy.client)
    answer = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "sdk"}])
    assert answer.choices[0].message.content == "echo: sdk"


def test_a_listed_origin_is_served_and_can_read_refusals(app_factory: Any, fake_upstream: FakeUpstream) -> None:
    app = "https://app.example.com"
    proxy = app_factory(cors_allow_origins=[app])
    headers = {"origin": app, "sec-fetch-site": "cross-site"}
    answered = proxy.client.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers=headers, timeout=20)
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == app
    # Its page may not send text/plain either, and can read why (CORS headers on the refusal).
    plain = proxy.client.post(
        f"{proxy.base_url}/chat/completions", content=b"{}", headers={**headers, "content-type": "text/plain"}
    )
    assert "text/plain" in error(plain, 415, "unsupported_media_type")
    assert plain.headers["access-control-allow-origin"] == app
    refused = proxy.client.post(f"{proxy.base_url}/chat/completions", json=CHAT, headers={"origin": EVIL})
    error(refused, 403, "cross_origin_request")
    assert "access-control-allow-origin" not in refused.headers


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        ("application/vnd.api+json", 200),
        (None, 200),  # no Content-Type: scripts that post JSON without the header keep working
        ("text/plain", 415),
        ("text/plain;charset=UTF-8", 415),
        ("application/x-www-form-urlencoded", 415),  # curl -d without -H 'content-type: application/json'
        ("multipart/form-data; boundary=x", 415),
        ("application/xml", 415),
    ],
)
def test_json_endpoints_take_json(
    app_proxy: AppProxy, fake_upstream: FakeUpstream, content_type: str | None, status: int
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    body = orjson.dumps(CHAT)
    response = app_proxy.client.post(
        f"{app_proxy.base_url}/chat/completions", content=body, headers=headers, timeout=20
    )
    if status == 200:
        assert response.status_code == 200, response.text
        return
    message = error(response, 415, "unsupported_media_type")
    assert (content_type or "").split(";")[0].lower() in message and "application/json" in message
    assert fake_upstream.requests == [] and stored(app_proxy) == []


def test_multipart_stays_where_openai_takes_it(app_proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    for path in ("/v1/audio/transcriptions", "/audio/translations", "/v1/images/edits"):
        # The guard lets multipart through (the route then reads the fields) and refuses a form or text.
        multipart = app_proxy.client.post(
            f"{app_proxy.url}{path}", files={"unused": ("a.bin", b"")}, data={"x": "1"}, timeout=20
        )
        assert multipart.status_code == 400 and multipart.json()["error"]["code"] != "unsupported_media_type"
        form = app_proxy.client.post(f"{app_proxy.url}{path}", data={"model": "test-model"}, timeout=20)
        assert "multipart/form-data" in error(form, 415, "unsupported_media_type")
    embeddings = app_proxy.client.post(
        f"{app_proxy.base_url}/embeddings", files={"input": ("a.txt", b"hi")}, timeout=20
    )
    error(embeddings, 415, "unsupported_media_type")
    assert fake_upstream.requests == []


def test_lcm_routes_refuse_forms_and_text_too(app_proxy: AppProxy, fake_upstream: FakeUpstream) -> None:
    conversation = app_proxy.client.post(f"{app_proxy.base_url}/chat/completions", json=CHAT, timeout=20)
    conversation_id = conversation.headers["x-lcm-conversation-id"]
    url = f"{app_proxy.url}/lcm/conversations/{conversation_id}"
    error(app_proxy.client.post(f"{url}/compact", data={"x": "1"}, timeout=20), 415, "unsupported_media_type")
    plain = app_proxy.client.request("DELETE", url, content=b"x", headers={"content-type": "text/plain"}, timeout=20)
    error(plain, 415, "unsupported_media_type")
    assert stored(app_proxy) == [conversation_id]
    # Without a body (curl -X DELETE, curl -X POST), as ever.
    assert app_proxy.client.post(f"{url}/compact", timeout=60).status_code == 200
    assert app_proxy.client.delete(url, timeout=20).status_code == 200 and stored(app_proxy) == []
