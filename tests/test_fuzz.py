"""Fuzz: 1,000 generated requests, mostly malformed, never get a 5xx and leave the database intact."""

from __future__ import annotations

from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import RunningProxy
from tests.fakes import FakeUpstream

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


def test_fuzzed_requests_never_5xx(proxy: RunningProxy, fake_upstream: FakeUpstream) -> None:
    seen: dict[int, int] = {}
    with httpx.Client(base_url=proxy.base_url, timeout=30) as client:

        @settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(body=st.one_of(valid_bodies, bodies, json_values))
        def check(body: Any) -> None:
            response = client.post("/chat/completions", json=body)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (body, response.text)
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}

        check()
    assert sum(seen.values()) >= 1000
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0  # both valid and invalid requests were generated
