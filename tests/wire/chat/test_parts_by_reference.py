"""Parts a client sends by reference (a file by ``file_id``, an image or audio part without its data) hold no
bytes to store out of line: they are forwarded as sent, stored as sent, and never a 500."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.dialects.chat import CHAT
from proxy.dialects.messages import MESSAGES
from proxy.engine.intercept import Interceptor
from tests.support.fakes import FakeUpstream
from tests.support.proxies import AppProxy

BY_REFERENCE: list[dict[str, Any]] = [
    {"type": "file", "file": {"file_id": "file-abc123"}},
    {"type": "file", "file": {"filename": "notes.pdf", "file_id": "file-def456"}},
]


async def _never(payload: Any) -> str:
    raise AssertionError("nothing is explored when nothing is stored out of line")


@pytest.mark.parametrize("part", BY_REFERENCE)
def test_a_file_part_sent_by_id_is_forwarded_as_sent(
    app_proxy: AppProxy, fake_upstream: FakeUpstream, part: dict[str, Any]
) -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "Summarise this file."}, part]}
    response = app_proxy.client.post("/v1/chat/completions", json={"model": "test-model", "messages": [message]})
    assert response.status_code == 200, response.text
    assert fake_upstream.last.body["messages"][-1] == message


@pytest.mark.parametrize(
    ("dialect", "message"),
    [
        (CHAT, {"role": "user", "content": [BY_REFERENCE[0]]}),
        (CHAT, {"role": "user", "content": [{"type": "input_audio", "input_audio": {"format": "mp3"}}]}),
        (CHAT, {"role": "user", "content": [{"type": "image_url", "image_url": {"detail": "low"}}]}),
        (
            MESSAGES,
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]},
        ),
        (
            MESSAGES,
            {"role": "user", "content": [{"type": "document", "source": {"type": "file", "file_id": "file_011"}}]},
        ),
    ],
)
def test_interception_leaves_a_part_without_bytes_alone(dialect: Any, message: dict[str, Any]) -> None:
    assert dialect.payload_sites(message) == []
    result = asyncio.run(Interceptor("scope", 10, 10, _never, dialect).intercept(message, {}))
    assert result.paths == [] and result.payloads == [] and result.original == message
