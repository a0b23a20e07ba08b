"""A second review of the Responses door: each test fails against the door as reviewed (commit 791b870); its
docstring says what is wrong and what the right behaviour is."""

from __future__ import annotations

from typing import Any

from tests.support.fake_responses import FakeResponses
from tests.support.fakes import FakeUpstream, Reply
from tests.wire.responses.test_review import AGENTS, BASE, CODEX, HEADERS, history, msg, post, start


def test_deleting_the_abandoned_branch_keeps_the_checkpoint_its_fork_still_replays(
    app_factory: Any, fake_responses_server: tuple[FakeResponses, str], upstream_url: str, fake_upstream: FakeUpstream,
) -> None:  # fmt: skip
    """A remote compaction's checkpoint stands for the first p messages of conversation A (no output of its own).
    Two continuations of the compacted session that differ in their first new prompt (an edited prompt, a
    resumed session taking another way) fork A at exactly p. Deleting A keeps its first ``keep`` = p messages for
    the fork, but store/*/delete.py deletes ``responses`` rows with ``position >= keep``: the checkpoint (position
    p == keep) goes although everything it stands for is kept. The fork replays Codex's compaction item on every
    request; ``expand`` no longer resolves it and refuses it as foreign (400 invalid_encrypted_content): the
    surviving branch's session is dead. Right: a checkpoint is kept while its position <= keep (only a response,
    whose output follows its position, needs position < keep)."""
    proxy = start(app_factory, fake_responses_server, upstream_url)
    fake_upstream.enqueue(Reply(content="done"))
    assert post(proxy, {"model": "local-codex", "input": history()[:5]}, CODEX).status_code == 200
    trigger = post(proxy, {"model": "local-codex", "input": [*history(), {"type": "compaction_trigger"}]}, CODEX)
    assert trigger.status_code == 200, trigger.text
    item = trigger.json()["output"][0]
    kept = [BASE, msg("user", "USER-1: hello"), msg("user", "USER-2: go on"), AGENTS, item]
    fake_upstream.enqueue(Reply(content="A-answer"))
    a = post(proxy, {"model": "local-codex", "input": [*kept, msg("user", "USER-3: by train")]})
    assert a.status_code == 200, a.text
    fake_upstream.enqueue(Reply(content="F-answer"))
    f = post(proxy, {"model": "local-codex", "input": [*kept, msg("user", "USER-3: by car")]})
    assert f.status_code == 200, f.text
    assert a.headers["x-lcm-conversation-id"] != f.headers["x-lcm-conversation-id"]
    deleted = proxy.client.delete(f"/lcm/conversations/{a.headers['x-lcm-conversation-id']}", headers=HEADERS)
    assert deleted.status_code == 200, deleted.text
    fake_upstream.enqueue(Reply(content="more"))
    more = post(proxy, {"model": "local-codex", "input": [*kept, msg("user", "USER-3: by car"),
                                                           *f.json()["output"], msg("user", "USER-4: and back?")]})
    assert more.status_code == 200, more.text
    assert "ZEBRA-9" in str(fake_upstream.requests[-1]), "the fork lost the history its checkpoint stands for"
