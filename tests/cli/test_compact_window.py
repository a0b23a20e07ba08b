"""``lcm-proxy compact`` summarises as the server would: its summariser's calls are capped to the summary
model's window (``proxy.relay.policy.ModelPolicy``), not sized for a large model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.cli.main import main
from proxy.config.loading import load_config
from proxy.relay.policy import ModelPolicy, router_of
from proxy.tokens import count_messages
from tests.support.engine import open_engine, run
from tests.support.fakes import FakeUpstream
from tests.support.sim import ScriptedModel, is_summary_request

SUMMARY_WINDOW = 2000  # the summary model's model_info.max_input_tokens


def history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.append({"role": "user", "content": f"Question {i}: " + "tell me about the design of the system. " * 8})
        out.append({"role": "assistant", "content": f"Answer {i}: " + "the design has layers and invariants. " * 8})
    return out


def stored_conversation(data_dir: Path) -> str:
    async def ingest() -> str:
        async with open_engine(data_dir) as (ingestor, _, _):
            result = await ingestor.ingest("default", history(40))
        assert result.conversation_id is not None
        return result.conversation_id

    return str(run(ingest()))


def write_config(tmp_path: Path, upstream_url: str) -> Path:
    config = tmp_path / "proxy.yaml"
    where = f"api_base: '{upstream_url}/v1', api_key: k-12345678"
    config.write_text(
        "model_list:\n"
        f"  - {{model_name: big, litellm_params: {{model: openai/big, {where}}}, model_info: {{max_input_tokens: 128000}}}}\n"
        f"  - {{model_name: tiny, litellm_params: {{model: openai/tiny, {where}}},"
        f" model_info: {{max_input_tokens: {SUMMARY_WINDOW}}}}}\n"
        f"general_settings: {{data_dir: '{tmp_path}'}}\n"
        "lcm_settings: {summary_model: tiny, fresh_tail_count: 4}\n"
    )
    return config


def test_compact_caps_each_summary_call_to_the_summary_models_window(
    tmp_path: Path, upstream_url: str, fake_upstream: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_upstream.responder = ScriptedModel()
    conversation = stored_conversation(tmp_path)
    config = write_config(tmp_path, upstream_url)

    assert main(["compact", conversation, "--config", str(config)]) == 0
    assert f"compacted {conversation} with tiny" in capsys.readouterr().out

    summaries = [r.body for r in fake_upstream.requests if is_summary_request(r.body)]
    assert summaries, "compact sent no summary request"
    # The server's summariser for a request to ``big`` would get this window: the CLI's gets the same one.
    loaded = load_config(str(config))
    policy = ModelPolicy(loaded, router_of(loaded), _NoFacts())
    window = policy.summary_window(policy.summary_target(policy.router.resolve("big")))
    assert window <= SUMMARY_WINDOW
    for body in summaries:
        assert body["model"] == "tiny"
        assert count_messages(body["messages"]) <= window, "a summary call larger than the summary model's window"


class _NoFacts:
    """Every window here is in the config: nothing to look up."""

    def __init__(self) -> None:
        from proxy.upstream.windows import ServerWindows

        self.windows = ServerWindows()

    def context_window(self, model: str) -> int | None:
        return None

    def supports_function_calling(self, model: str) -> bool | None:
        return None
