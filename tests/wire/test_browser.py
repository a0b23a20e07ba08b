"""A real browser against the proxy in its default setup (loopback, no keys): what a hostile page can send it
does nothing, what the user's own pages and tools send still works (``proxy.wire.guard``).

Headless Chromium (Debian's /usr/bin/chromium; .ci/run installs it) driven by Playwright. One page server on
127.0.0.1 is two origins: ``http://127.0.0.1:PORT`` is a hostile site, ``http://localhost:PORT`` an app the
operator listed in ``cors_allow_origins``. DNS rebinding: Chromium resolves ``evil.test`` to 127.0.0.1, and
a page served as ``http://evil.test:PROXY_PORT/`` (by the attacker's server, before the name was rebound)
reads the proxy as its own origin.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy
from tests.support.servers import serve_in_thread
from tests.support.transcripts import long_history

CHROMIUM = "/usr/bin/chromium"
PAGE = "<!doctype html><html><head><title>page</title></head><body>a page</body></html>"
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "spend the operator's keys"}]}
LCM = {"fresh_tail_count": 4, "leaf_chunk_tokens": 300, "leaf_target_tokens": 64}


@pytest.fixture
def chromium() -> Iterator[Any]:
    """Per test, and set up after the proxies: Playwright's sync API keeps an event loop running in this thread
    while it is open, and the proxies' teardown (the doctor check) runs one of its own."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is missing: install the test extra (pip install -e '.[test]')", pytrace=False)
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)", pytrace=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
                "--host-resolver-rules=MAP evil.test 127.0.0.1",
                # Chromium's own Private Network Access refuses a page first loaded from a public address the
                # loopback one its name was rebound to; Firefox and Safari have no such check. Off, so that
                # what stops the rebinding page below is the proxy.
                "--disable-features=BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights,"
                "LocalNetworkAccessChecks",
            ],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def pages() -> Iterator[int]:
    """The page server's port: any path is a blank page."""

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(PAGE)

    app = Starlette(routes=[Route("/{path:path}", page)])
    with serve_in_thread(app) as url:
        yield int(urlsplit(url).port or 0)


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Any]:
    context = chromium.new_context()
    try:
        yield context.new_page()
    finally:
        context.close()


def seeded(proxy: RunningProxy) -> str:
    """A stored conversation, long enough for a compaction to have work."""
    created = httpx.post(f"{proxy.base_url}/chat/completions", json={**CHAT, "messages": long_history(12)}, timeout=30)
    assert created.status_code == 200, created.text
    return created.headers["x-lcm-conversation-id"]


def summaries(proxy: RunningProxy, conversation: str) -> list[str]:
    detail = httpx.get(f"{proxy.url}/lcm/conversations/{conversation}", timeout=20)
    assert detail.status_code == 200, detail.text
    return list(detail.json()["context_summaries"])


def conversations(proxy: RunningProxy) -> list[str]:
    return [c["id"] for c in httpx.get(f"{proxy.url}/lcm/conversations", timeout=20).json()["data"]]


def test_a_hostile_pages_simple_requests_run_nothing(
    proxy_factory: Any, fake_upstream: FakeUpstream, pages: int, browser_page: Any
) -> None:
    proxy = proxy_factory(lcm=LCM, cors_allow_origins=[f"http://localhost:{pages}"])
    conversation = seeded(proxy)
    sent = len(fake_upstream.requests)
    browser_page.goto(f"http://127.0.0.1:{pages}/")
    # fetch() of a text/plain POST and a form-encoded one: "simple" requests, sent without asking the proxy
    # first. The page cannot read the answers (no-cors), but it does not need to: a chat would spend the
    # operator's keys, a compaction would run.
    settled = browser_page.evaluate(
        """async ([proxy, conversation, chat]) => {
            const results = [];
            results.push(await fetch(proxy + "/v1/chat/completions", {
                method: "POST", mode: "no-cors", headers: {"content-type": "text/plain"}, body: JSON.stringify(chat),
            }).then(r => r.type));
            results.push(await fetch(proxy + "/lcm/conversations/" + conversation + "/compact", {
                method: "POST", mode: "no-cors", body: new URLSearchParams({x: "1"}),
            }).then(r => r.type));
            return results;
        }""",
        [proxy.url, conversation, CHAT],
    )
    assert settled == ["opaque", "opaque"]  # both were sent and answered
    # A form posted at the proxy (a navigation: the page lands on the proxy's answer).
    browser_page.evaluate(
        """([action]) => {
            const form = document.createElement("form");
            form.method = "POST"; form.action = action; form.enctype = "text/plain";
            const field = document.createElement("input");
            field.name = '{"model": "test-model", "messages": [{"role": "user", "content": "x"}], "x": "';
            field.value = '"}';
            form.appendChild(field); document.body.appendChild(form); form.submit();
        }""",
        [f"{proxy.base_url}/chat/completions"],
    )
    browser_page.wait_for_url(f"{proxy.base_url}/chat/completions")
    assert "cross_origin_request" in browser_page.content()
    # Nothing reached the upstream (no chat, no summary), nothing was stored, no compaction ran.
    assert len(fake_upstream.requests) == sent
    assert conversations(proxy) == [conversation] and summaries(proxy, conversation) == []


def test_a_rebound_name_cannot_read_or_delete_the_history(
    proxy: RunningProxy, fake_upstream: FakeUpstream, browser_page: Any
) -> None:
    conversation = seeded(proxy)
    port = urlsplit(proxy.url).port
    evil = f"http://evil.test:{port}"
    # The attacker's server answered this first load; then evil.test was rebound to 127.0.0.1, the proxy.
    browser_page.route(f"{evil}/", lambda route: route.fulfill(status=200, content_type="text/html", body=PAGE))
    browser_page.goto(f"{evil}/")
    read = browser_page.evaluate(
        """async ([conversation]) => {
            const out = {};
            for (const [name, path, method] of [
                ["list", "/lcm/conversations", "GET"],
                ["messages", "/lcm/conversations/" + conversation + "/messages", "GET"],
                ["delete", "/lcm/conversations/" + conversation, "DELETE"],
                ["chat", "/v1/chat/completions", "POST"],
            ]) {
                const init = {method};
                if (method === "POST") {
                    init.headers = {"content-type": "application/json"};
                    init.body = JSON.stringify({model: "test-model", messages: [{role: "user", content: "x"}]});
                }
                const response = await fetch(path, init);  // same origin: the page could read anything
                out[name] = [response.status, await response.text()];
            }
            return out;
        }""",
        [conversation],
    )
    for name, (status, text) in read.items():
        assert status == 403 and "host_not_allowed" in text, (name, status, text)
        assert conversation not in text and "design of the system" not in text
    assert conversations(proxy) == [conversation]  # still there
    assert not any(r.body.get("messages") == [{"role": "user", "content": "x"}] for r in fake_upstream.requests)


def test_the_operators_own_pages_still_work(
    proxy_factory: Any, fake_upstream: FakeUpstream, pages: int, browser_page: Any
) -> None:
    app = f"http://localhost:{pages}"
    proxy = proxy_factory(cors_allow_origins=[app])
    # A listed app on another origin: a CORS request with the headers the SDKs send, preflight and all.
    browser_page.goto(f"{app}/")
    answered = browser_page.evaluate(
        """async ([proxy]) => {
            const response = await fetch(proxy + "/v1/chat/completions", {
                method: "POST",
                headers: {"content-type": "application/json", "authorization": "Bearer x", "x-stainless-os": "js"},
                body: JSON.stringify({model: "test-model", messages: [{role: "user", content: "from the app"}]}),
            });
            return [response.status, (await response.json()).choices[0].message.content,
                    response.headers.get("x-lcm-conversation-id")];
        }""",
        [proxy.url],
    )
    assert answered[0] == 200 and answered[1] == "echo: from the app" and answered[2]
    # A page on the proxy's own origin (a UI served with it behind one name): same-origin calls are served.
    own = f"{proxy.url}/ui/index.html"
    browser_page.route(own, lambda route: route.fulfill(status=200, content_type="text/html", body=PAGE))
    browser_page.goto(own)
    same = browser_page.evaluate(
        """async () => {
            const response = await fetch("/v1/chat/completions", {
                method: "POST", headers: {"content-type": "application/json"},
                body: JSON.stringify({model: "test-model", messages: [{role: "user", content: "same origin"}]}),
            });
            const listed = await fetch("/lcm/conversations");
            return [response.status, (await response.json()).choices[0].message.content, listed.status];
        }"""
    )
    assert same == [200, "echo: same origin", 200]
