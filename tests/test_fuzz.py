"""Fuzz: 1,900 generated requests, mostly malformed, never get a 5xx, never lose an acknowledged message and
leave the database intact (the proxy fixture runs doctor, integrity_check included, after every test); JSON
nested 300 to 1000 levels deep anywhere in a request is a 400 naming the field that holds it; 150 generated
hostile regular expressions (compile bombs, catastrophic backtracking) get a 200 or a 400 naming `pattern`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine.canonical import canonical
from proxy.engine.ingest import export_conversation
from proxy.store.files import FileStore
from proxy.store.sqlite.store import SQLiteStore
from tests.support.fakes import FakeUpstream
from tests.support.proxies import RunningProxy

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "wizard", ""])
parts = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "file", "input_audio", "video"])},
    optional={"text": json_values, "image_url": json_values, "file": json_values, "input_audio": json_values},
)
messages = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": st.one_of(st.text(max_size=60), st.lists(parts, max_size=3), json_values),
        "tool_calls": st.one_of(
            json_values,
            st.lists(
                st.fixed_dictionaries({"id": json_values, "type": st.just("function"), "function": json_values}),
                max_size=2,
            ),
        ),
        "tool_call_id": json_values,
        "name": json_values,
    },
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.just("test-model"), json_values),
        "messages": st.one_of(st.lists(messages, max_size=4), json_values),
        "stream": st.one_of(st.booleans(), json_values),
        "stream_options": json_values,
        "temperature": json_values,
        "max_tokens": json_values,
        "n": json_values,
        "tools": json_values,
        "tool_choice": json_values,
        "stop": json_values,
        "metadata": json_values,
    },
)


valid_bodies = st.fixed_dictionaries(
    {
        "model": st.just("test-model"),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system"]), "content": st.text(min_size=1, max_size=80)}
            ),
            min_size=1,
            max_size=4,
        ),
    },
    optional={
        "temperature": st.floats(0, 2),
        "max_tokens": st.integers(1, 500),
        "stream": st.booleans(),
        "user": st.text(max_size=20),
        "metadata": st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
        "vendor_extra": json_values,
    },
)


def _transcript(messages: list[Any]) -> list[Any]:
    """Without the leading system messages: those are instructions, stored once per conversation (the latest
    request's), not part of the transcript a request is acknowledged for."""
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    return messages[first:]


async def _missing_transcripts(data_dir: Path, acknowledged: list[tuple[str, list[Any]]]) -> list[str]:
    """The acknowledged requests whose messages are not, in order, at the start of their stored conversation."""
    store = SQLiteStore(data_dir)
    await store.open()
    try:
        missing = []
        for conversation_id, sent in acknowledged:
            exported = _transcript(await export_conversation(store, FileStore(data_dir), None, conversation_id))
            if [canonical(m) for m in exported[: len(sent)]] != [canonical(m) for m in sent]:
                missing.append(f"{conversation_id}: sent {sent}, stored {exported}")
        return missing
    finally:
        await store.close()


def test_fuzzed_requests_never_5xx(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    seen: dict[int, int] = {}
    acknowledged: list[tuple[str, list[Any]]] = []  # (conversation id, transcript) of each request answered 200
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:

        @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(body=st.one_of(valid_bodies, bodies, json_values))
        def check(body: Any) -> None:
            response = client.post("/chat/completions", json=body)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            elif response.status_code == 200:
                stored = response.headers.get("x-lcm-conversation-id")
                # Instructions alone (system/developer messages) are forwarded but make no conversation.
                assert (stored is None) == all(m["role"] in ("system", "developer") for m in body["messages"]), body
                if stored is not None:
                    acknowledged.append((stored, _transcript(body["messages"])))

        check()
    assert sum(seen.values()) >= 1000
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0  # both valid and invalid requests were generated
    # Nothing acknowledged was lost among the malformed ones (the fixture runs doctor and integrity_check).
    data_dir = Path(proxy.config.general_settings.data_dir)
    assert len({conversation_id for conversation_id, _ in acknowledged}) > 50
    assert asyncio.run(_missing_transcripts(data_dir, acknowledged)) == []


# Ids, query values and header values as a client or an attacker might send them: real-looking ids,
# traversal, percent-encoding, control characters, huge numbers, unicode.
odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "..",
            "../../etc/passwd",
            "%2e%2e%2f",
            "sum_",
            "file_",
            "msg_",
            "msg_99999999999999999999",
            "²",
            "٣",
            "1e3",
            "0x10",
        ]
    ),
    st.from_regex(r"(sum|file|conv|msg)_[0-9a-f]{0,20}", fullmatch=True),
    st.integers(-(2**70), 2**70).map(str),
)
admin_requests = st.tuples(
    st.sampled_from(
        [
            ("GET", "/lcm/conversations"),
            ("GET", "/lcm/conversations/{id}"),
            ("GET", "/lcm/conversations/{id}/messages"),
            ("GET", "/lcm/conversations/{id}/context"),
            ("GET", "/lcm/conversations/{id}/grep"),
            ("POST", "/lcm/conversations/{id}/compact"),
            ("GET", "/lcm/conversations/{id}/ledger"),
            ("POST", "/lcm/conversations/{id}/ledger/{id}"),
            ("GET", "/lcm/summaries/{id}"),
            ("GET", "/lcm/files/{id}"),
        ]
    ),
    odd_text,
    st.dictionaries(
        st.sampled_from(["limit", "pattern", "mode", "start_line", "end_line", "model", "all"]), odd_text, max_size=4
    ),
)
HEADER_CHARS = frozenset(map(chr, [*range(0x20, 0x7F), *range(0xA0, 0x100)]))
header_values = st.text(alphabet=sorted(HEADER_CHARS), min_size=1, max_size=250)
raw_bodies = st.one_of(
    st.binary(max_size=200),  # not JSON, maybe not UTF-8
    st.text(max_size=200).map(str.encode),
    st.sampled_from([b"", b"null", b"[]", b'{"model": "test-model", "messages": [', b"\xff\xfe{}", b"{" * 5000]),
)


def test_fuzzed_admin_routes_headers_and_raw_bodies_never_5xx(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    """The rest of the surface: every admin route with generated ids and query values, the conversation
    header with generated values, and raw bodies that are not JSON (or not UTF-8) with assorted content types."""
    seen: dict[int, int] = {}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client, httpx.Client(base_url=proxy.url) as admin:
        # Something real to find: generated requests sometimes name the stored conversation.
        first = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
        stored = client.post("/chat/completions", json=first).headers["x-lcm-conversation-id"]

        def record(response: httpx.Response) -> None:
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, response.text
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(request=admin_requests, real_id=st.booleans())
        def check_admin(request: tuple[tuple[str, str], str, dict[str, str]], real_id: bool) -> None:
            (method, template), item_id, params = request
            if real_id:
                item_id = stored
            # Percent-encoded except dots and percent signs, so "..", "%2e%2e%2f" and friends arrive as sent.
            path = template.replace("{id}", quote(item_id, safe=".%") or "x")
            record(admin.request(method, path, params=params))

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(
            body=raw_bodies,
            content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"]),
            conversation=st.one_of(st.none(), odd_text, header_values),
        )
        def check_chat(body: bytes, content_type: str, conversation: str | None) -> None:
            headers: dict[str, str | bytes] = {"content-type": content_type}
            # Only what HTTP allows in a header value (the server itself refuses the rest, before the app).
            conversation = "".join(c for c in conversation or "" if c in HEADER_CHARS).strip()
            if conversation:
                headers["x-lcm-conversation-id"] = conversation.encode("latin-1")
            record(client.post("/chat/completions", content=body, headers=headers))

        check_admin()
        check_chat()
    assert sum(seen.values()) >= 800
    assert seen.get(404, 0) > 0 and seen.get(400, 0) > 0 and seen.get(200, 0) > 0


# --- hostile depth: 300 to 1000 levels of nesting (orjson parses up to 1024) wherever a client may put JSON --

SLOT = "__deep_slot__"
USER = {"role": "user", "content": "hi"}
# Where the nesting goes: (body with SLOT in it, the param the 400 must name), from the generated position
# numbers i and j and an extra field's name.
deep_sites = st.one_of(
    st.builds(
        lambda i, key: ({"messages": [USER] * i + [{"role": "user", "content": "x", key: SLOT}]}, f"messages[{i}].{key}"),
        st.integers(0, 3),
        st.sampled_from(["metadata", "cache_control", "x-extra", "$lcm_segments"]),
    ),
    st.builds(
        lambda i, j: (
            {"messages": [USER] * i + [{"role": "user", "content": [{"type": "text", "text": "x"}] * j + [SLOT]}]},
            f"messages[{i}].content[{j}]",
        ),
        st.integers(0, 3),
        st.integers(0, 3),
    ),
    st.builds(
        lambda i, j: (
            {"messages": [USER] * i + [{"role": "user", "content": [{"type": "text", "text": "x"}] * j + [{"type": "text", "text": "x", "cache": SLOT}]}]},
            f"messages[{i}].content[{j}].cache",
        ),
        st.integers(0, 3),
        st.integers(0, 3),
    ),
    st.builds(
        lambda k: (
            {"tools": [{"type": "function", "function": {"name": f"f{n}", "parameters": SLOT if n == k else {}}} for n in range(k + 1)]},
            f"tools[{k}].function.parameters",
        ),
        st.integers(0, 3),
    ),
    st.builds(
        lambda i: (
            {"messages": [USER] * i + [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}", "x": SLOT}}]}]},
            f"messages[{i}].tool_calls[0].function.x",
        ),
        st.integers(1, 3),
    ),
    st.builds(
        lambda key: ({key: SLOT}, key),
        st.sampled_from(["vendor_extra", "metadata", "logit_bias", "user", "response_format", "extra_body"]),
    ),
)  # fmt: skip
# The nesting: a short pattern of containers (an array, or an object under one key) repeated, starting
# with an array so that the first level below a content part or a message is not one of their known keys.
deep_patterns = st.lists(st.one_of(st.just(None), st.text(max_size=6)), min_size=1, max_size=4)


def deep_json(pattern: list[str | None], levels: int, leaf: bytes) -> bytes:
    """``levels`` containers following ``pattern`` (None: an array; a string: an object with that key)."""
    kinds = [None, *(pattern[i % len(pattern)] for i in range(levels - 1))]
    opening = [b"[" if key is None else b"{" + orjson.dumps(key) + b":" for key in kinds]
    closing = [b"]" if key is None else b"}" for key in reversed(kinds)]
    return b"".join(opening) + leaf + b"".join(closing)


def test_fuzzed_deep_nesting_is_a_400_naming_the_parameter(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    """Nesting far past what canonical form, copies and orjson's serialiser survive is refused at validation,
    wherever it is: message extras, content parts, tool parameters, tool calls, top-level fields."""
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:

        @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(
            site=deep_sites,
            pattern=deep_patterns,
            levels=st.integers(300, 1000),
            leaf=scalars.map(orjson.dumps),
        )
        def check(site: tuple[dict[str, Any], str], pattern: list[str | None], levels: int, leaf: bytes) -> None:
            fields, param = site
            body = orjson.dumps({"model": "test-model", "messages": [USER], **fields})
            slot = orjson.dumps(SLOT)
            assert body.count(slot) == 1
            response = client.post("/chat/completions", content=body.replace(slot, deep_json(pattern, levels, leaf)))
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert (error["param"], error["code"], error["type"]) == (param, "invalid_value", "invalid_request_error")

        check()
    assert fake_upstream.requests == []


# --- hostile regular expressions -----------------------------------------------------------------------------

atoms = st.sampled_from(["a", "aa", ".", r"\w", "[a-z]", r"\d", "(?:a|aa)", "(a|a?)", "[^b]", r"\s*"])
counts = st.one_of(
    st.integers(0, 2000).map(lambda n: f"{{{n}}}"),
    st.integers(0, 10**12).map(lambda n: f"{{{n}}}"),
    st.tuples(st.integers(0, 5000), st.integers(0, 5000)).map(lambda mn: f"{{{min(mn)},{max(mn)}}}"),
    st.sampled_from(["*", "+", "?", "*?", "++", "{e<=2}", "{,1000000}"]),
)


@st.composite
def hostile_patterns(draw: st.DrawFn) -> str:
    """Repeats nested in repeats, alternations that backtrack, counts up to 10^12: compile bombs and
    catastrophic matches, as a prompt-injected model or an admin caller might write them."""
    pattern = draw(atoms) + draw(counts)
    for _ in range(draw(st.integers(0, 4))):
        pattern = f"({pattern}{draw(st.sampled_from(['', '|' + draw(atoms)]))}){draw(counts)}"
    return pattern + draw(st.sampled_from(["", "$", "b", "(?R)?"]))


def test_fuzzed_hostile_patterns_never_5xx_nor_stall(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    """Every generated pattern gets an answer (200 with matches or none, or a 400 naming ``pattern``) within
    the grep deadline's reach, and the process stays up: a compile bomb used to take 15 GB."""
    text = {"role": "user", "content": "a" * 40 + "b " + "aaaa " * 200}
    body = {"model": "test-model", "messages": [text, {"role": "assistant", "content": "ok"}, text]}
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        conversation = client.post("/v1/chat/completions", json=body).headers["x-lcm-conversation-id"]
        statuses: dict[int, int] = {}

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(pattern=hostile_patterns())
        def check(pattern: str) -> None:
            response = client.get(f"/lcm/conversations/{conversation}/grep", params={"pattern": pattern})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code in (200, 400), response.text
            if response.status_code == 400:
                assert response.json()["error"]["param"] == "pattern", response.text

        check()
        assert client.get("/healthz").status_code == 200
    assert statuses.get(400, 0) > 0 and statuses.get(200, 0) > 0, statuses
