"""The benchmark command keeps working (its numbers are read by people, not asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_ingest_benchmark_prints_a_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "ingest", "--quick"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["10", "100", "1000", "5000"]
    assert all(float(cell) > 0 for row in rows for cell in row.strip("|").split("|")[1:5])


def test_ledger_benchmark_prints_its_tables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "ledger", "--quick"], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    assert out.returncode == 0, out.stderr
    planning, _, http = out.stdout.partition("## ledger: the hostile request through HTTP")
    rows = [line.strip("|").split("|") for line in planning.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row[0].strip() for row in rows] == ["10", "30"]
    assert all(float(row[5]) > 1 for row in rows)  # all pairs cost more than the index (a ratio, not a time)
    requests = [line.strip("|").split("|") for line in http.splitlines() if line.startswith("| ") and "×" in line]
    assert [(row[2].strip(), row[3].strip()) for row in requests] == [("off", "200"), ("auto", "200")] * 2
    assert all(0 < int(row[10]) <= 300 for row in requests if row[2].strip() == "auto")  # open items, within the cap


def test_overhead_benchmark_prints_its_tables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "overhead", "--quick"], capture_output=True, text=True, cwd=REPO, timeout=900
    )
    assert out.returncode == 0, out.stderr
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]] for line in out.stdout.splitlines() if line.startswith("| ")
    ]
    servers = {row[0] for row in rows}
    assert {"upstream directly (baseline)", "bare aiohttp forwarder", "bare litellm.acompletion forwarder"} <= servers
    # Every door, every kind of deployment, every request users send, through lcm-proxy, with its CPU per request.
    for door in ("/v1/chat/completions", "Anthropic /v1/messages", "OpenAI /v1/responses"):
        assert f"## overhead: {door}, one client at a time" in out.stdout
    latency = {(row[0], row[1], row[2]) for row in rows if len(row) == 8 and row[0] == "lcm-proxy"}
    for kind in ("openai/", "anthropic/ (native)", "openai/ (translated)", "openai/responses/ (native)"):
        for request in (
            "first turn",
            "continuation (+1 exchange)",
            "re-send (identical)",
            "streaming first turn: first byte",
        ):
            assert ("lcm-proxy", kind, request) in latency, (kind, request)
    assert all(float(row[7]) > 0 for row in rows if len(row) == 8 and row[0] == "lcm-proxy")  # CPU ms per request
    # The ratio table against the targets, for each door.
    figures = {(row[0], row[2]) for row in rows if len(row) == 8 and row[0].startswith("/v1/")}
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
        assert {
            (path, "added p50, first turn"),
            (path, "added p50, continuation"),
            (path, "req/s at 64 clients"),
        } <= figures
    # LiteLLM's own proxy runs only when its virtualenv already exists (--quick never creates it).
    assert "LiteLLM proxy" in servers or "LiteLLM proxy skipped" in out.stdout


def test_delete_benchmark_prints_a_table_for_both_stores() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "delete", "--quick"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "## delete:" in out.stdout
    cost, _, during = out.stdout.partition("### another tenant's ingests")
    assert during, "the table of another tenant's ingests during deletions is missing"

    def rows_of(table: str) -> list[list[str]]:
        return [
            line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()
        ]

    rows = rows_of(cost)
    assert [(row[0].strip(), row[2].strip()) for row in rows] == [
        ("500", "SQLite"),
        ("500", "PostgreSQL"),
        ("2000", "SQLite"),
        ("2000", "PostgreSQL"),
    ]
    assert all(float(cell) > 0 for row in rows for cell in row[3:])
    others = rows_of(during)
    assert [(row[0].strip(), row[1].strip()) for row in others] == [
        ("500", "SQLite"),
        ("500", "PostgreSQL"),
        ("2000", "SQLite"),
        ("2000", "PostgreSQL"),
    ]
    assert all(int(row[3]) > 0 and float(row[4]) > 0 and float(row[5]) > 0 for row in others)  # ingests measured


def test_compaction_benchmark_prints_the_prompt_cache_tables() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "compaction", "--quick"], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    assert out.returncode == 0, out.stderr
    assert "## compaction: simulated session" in out.stdout  # the tables before it stay
    tables = out.stdout.split("## compaction: prompt cache, ")[1:]
    assert [table.partition(" (")[0] for table in tables] == [
        "the simulated session of tests/support/sim.py",
        "an agent session with tool outputs of 1,000 to 6,000 tokens",
        "issue 32's chat: a new fact every turn, tool results every 10th, every 5th streamed",
    ]
    for table in tables:
        rows = [
            line.strip("|").split("|") for line in table.splitlines() if line.startswith("| ") and "---" not in line
        ]
        ways = ("lcm-proxy", "client sends everything", "client compacts like Claude Code")
        assert len(rows) == 4 and all(row[0].strip().startswith(way) for row, way in zip(rows[1:], ways, strict=True))
        assert all(float(row[7]) > 0 and float(row[8]) > 0 for row in rows[1:]), "billed input measured"
    assert "Anthropic: a cache breakpoint at the end of every request" in out.stdout


def test_kit_benchmark_ranks_lcm_proxy_within_the_budget() -> None:
    """``python -m bench kit --quick`` at one budget: the kit's leaderboard with lcm-proxy on it, through a live
    proxy, within the kit's character budget in every round (compaction-conformance-kit is the ``bench`` extra)."""
    pytest.importorskip("compaction_kit")
    out = subprocess.run(
        [sys.executable, "-m", "bench", "kit", "--quick", "--budgets", "20"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr
    rows = [
        line.strip("|").split("|") for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line
    ]
    board = {row[1].strip(): row for row in rows if len(row) == 8 and row[0].strip().isdigit()}
    assert {"lcm-proxy", "semantic-checklist", "lossy-truncation"} <= set(board)
    assert board["lcm-proxy"][2].strip() == "yes", "lcm-proxy's output went over the kit's budget"
    assert "%" in board["lcm-proxy"][3]  # survival, scored by the kit
    windows = [row for row in rows if len(row) == 11 and row[0].strip() == "20%"]
    assert [row[1].strip() for row in windows] == ["1", "2"], "one row per round of the window search"
    assert all(float(row[4]) <= 1.0 for row in windows), "output chars / budget"
    assert "### Why lcm-proxy lost canaries" in out.stdout


def test_standing_eval_real_proposer_asks_as_the_leaf_pass_and_verifies_what_it_gets() -> None:
    """``standing-eval --real`` without a model: a canned chat-completions answer stands for the model's."""
    import json
    from typing import Any

    import httpx

    from bench import standing_eval
    from proxy.engine.summarize import LEAF_PROMPT

    conversation = standing_eval.load()[0]
    planted = next(p for p in conversation["items"] if p["message"] < 8)
    seen: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        content = f"- notes\nSTANDING:\n{planted['kind']} | {planted['quote']}\nrule | not said by anyone here at all"
        return httpx.Response(200, json={"choices": [{"message": {"content": content}, "finish_reason": "stop"}]})

    client = httpx.Client(base_url="http://model", transport=httpx.MockTransport(answer))
    proposer = standing_eval.RealProposer("http://model", client=client)
    items = standing_eval.run({**conversation, "messages": conversation["messages"][:8]}, proposer)
    system, user = (m["content"] for m in seen[0]["messages"])
    assert system == LEAF_PROMPT and "<conversation>" in user and "STANDING:" in user.split("</conversation>")[1]
    assert seen[0]["temperature"] == 0
    call = proposer.calls[0]
    assert call.standing and len(call.offered) == 2 and len(call.accepted) == 1 and call.notes_usable
    assert any(standing_eval.matches(i.text, planted["quote"]) for i in items)
    assert "accepted by verification: 1" in standing_eval.report_calls(proposer.calls)


def test_scale_benchmark_prints_its_tables() -> None:
    """``python -m bench scale`` (the proxy's own time per request as a conversation grows), small sizes."""
    result = subprocess.run(
        [sys.executable, "-m", "bench", "scale", "--quick", "--sizes", "10,100", "--repeats", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "## scale: the proxy's own time per request, in process" in result.stdout
    assert "| identity (lookup) |" in result.stdout
    assert "## scale: whole request over HTTP" in result.stdout


def test_clients_benchmark_compares_httpx_and_aiohttp() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "clients", "--quick"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| ")}
    assert {"httpx", "aiohttp"} <= set(rows)
    assert rows["aiohttp"].rstrip(" |").endswith("1.00x")  # the ratios are to aiohttp's CPU per request


def test_local_turns_benchmark_prints_its_tables_with_the_fake_llama_cpp() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "local-turns", "--quick", "--fake", "--pause", "2"],  # a busy machine too
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.stdout.splitlines() if line.startswith("| ")}
    assert {"lcm-proxy", "client sends everything", "client truncates"} <= set(rows)
    assert rows["lcm-proxy"][2].strip() == "16/16"
    inside, _, between = rows["lcm-proxy"][13].strip().partition(" / ")
    assert inside == "0" and int(between) > 0  # summaries between the turns, never inside one
