"""The standing-instructions benchmark (``python -m bench fidelity --standing``): its data, its scoring, its
baselines, and the acceptance bar of issue 24.

Standing instructions (rules, hard constraints, preferences, goals, decisions, names) must stay in what is
forwarded without anyone asking for them: at a 20% budget, at least 95% of the current values present and at
most 5% of the stale ones at every round, and every safety rule and hard constraint kept exactly.
"""

from __future__ import annotations

import pytest

from bench import fidelity, standing
from bench.standing import RoundScore, Run, run_baselines, score, summarised_once
from bench.standing_data import FULL_EXCHANGES, QUICK_EXCHANGES, SCRIPTS, Item, Session, generate, sessions
from proxy.store.records import LEDGER_KINDS
from proxy.tokens import count_messages

# --- scoring -------------------------------------------------------------------------------------------------


def _item(key: str, kind: str, safety: bool, current: tuple[str, ...], stale: tuple[str, ...] = ()) -> Item:
    return Item(key, kind, safety, current, stale, stated_at=0, updated_at=(2,) if stale else ())


ITEMS = [
    _item("push main", "rule", True, ("never push to main",)),
    _item("cloud budget", "constraint", True, ("five hundred dollars", "$500"), ("$800",)),
    _item("units", "preference", False, ("metric units",)),
    _item("database", "decision", False, ("SQLite",), ("PostgreSQL", "MySQL")),
]


def test_score_finds_values_anywhere_in_the_forwarded_messages_ignoring_case() -> None:
    sent = [
        {"role": "system", "content": "Standing instructions:\n- Never push to MAIN."},
        {"role": "user", "content": [{"type": "text", "text": "The cap was $800. We picked sqlite."}]},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": '{"db": "PostgreSQL"}'}}]},
    ]
    result = RoundScore("s", 0.2, "lcm-proxy", 1, 0, score(ITEMS, sent))
    assert [(s.current, s.stale) for s in result.items] == [(True, 0), (False, 1), (False, 0), (True, 1)]
    assert result.current == (2, 4)
    assert result.stale == (2, 3)  # $800 and PostgreSQL, of $800, PostgreSQL and MySQL
    assert result.by_kind("rule") == (1, 1)
    assert result.by_kind("constraint") == (0, 1)
    assert result.by_kind("decision") == (1, 1)
    assert result.by_kind("goal") == (0, 0)
    assert result.safety == (1, 2)  # the budget is neither current nor free of its stale value


def test_a_safety_item_counts_as_kept_only_with_its_current_value_and_without_its_stale_one() -> None:
    updated = [{"role": "user", "content": "Keep spend under five hundred dollars; never push to main."}]
    both = [{"role": "user", "content": "never push to main. Cap $800, now $500."}]
    assert RoundScore("s", 0.2, "x", 1, 0, score(ITEMS, updated)).safety == (2, 2)
    assert RoundScore("s", 0.2, "x", 1, 0, score(ITEMS, both)).safety == (1, 2)
    assert RoundScore("s", 0.2, "x", 1, 0, score(ITEMS, [])).current == (0, 4)


# --- the data ------------------------------------------------------------------------------------------------

NEAR_DUPLICATES = {
    "launch": (
        ("push main", "push release"),
        ("marketing budget", "travel budget"),
        ("web codename", "mobile codename"),
    ),
    "agent": (("vendor dir", "third party dir"),),
}


def _text(messages: list[dict[str, str]]) -> str:
    return "\n".join(m["content"] for m in messages).lower()


@pytest.mark.parametrize("exchanges", [FULL_EXCHANGES, QUICK_EXCHANGES])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_session_plants_every_kind_with_updates_and_near_duplicates(script: str, exchanges: int) -> None:
    session = generate(script, exchanges, rounds=3)
    assert session == generate(script, exchanges, rounds=3)  # seeded
    assert len(session.messages) == 2 * exchanges and len(session.rounds) == 3
    assert session.tokens == count_messages(session.messages)
    assert 18 <= len(session.items) <= 22
    assert {i.kind for i in session.items} == set(LEDGER_KINDS)
    safety = [i for i in session.items if i.safety]
    assert {i.kind for i in safety} == {"rule", "constraint"} and len(safety) >= 5
    assert any(len(i.updated_at) == 2 for i in session.items)  # updated twice
    history, later = [m["content"].lower() for m in session.messages], _text([m for r in session.rounds for m in r])
    for item in session.items:
        said = (item.stated_at, *item.updated_at)
        assert list(said) == sorted(set(said)), item
        assert bool(item.stale) == bool(item.updated_at), item  # every update makes a stale value
        for value in item.current + item.stale:
            where = {i for i, text in enumerate(history) if value.lower() in text}
            assert where <= set(said) and value.lower() not in later, (item.key, value)  # never in filler
        last = history[said[-1]]
        assert any(v.lower() in last for v in item.current), item
        for stale in item.stale:
            assert all(stale.lower() not in c.lower() and c.lower() not in stale.lower() for c in item.current)
            assert stale.lower() in "\n".join(history[i] for i in said[:-1])
            assert stale.lower() not in last, item  # updated in other words
        if item.updated_at:
            assert not any(v.lower() in history[item.stated_at] for v in item.current), item
    keyed = {i.key: i for i in session.items}
    for a, b in NEAR_DUPLICATES[script]:
        assert keyed[a].kind == keyed[b].kind
        assert not set(map(str.lower, keyed[a].current)) & set(map(str.lower, keyed[b].current))


def test_the_two_scripts_are_different_kinds_of_session() -> None:
    launch, agent = sessions(quick=True, rounds=2)
    assert {launch.script, agent.script} == {"launch", "agent"}
    assert not {i.key for i in launch.items} & {i.key for i in agent.items}
    assert any(agent.messages[i.stated_at]["role"] == "assistant" for i in agent.items)  # the agent's own
    assert all(launch.messages[i.stated_at]["role"] == "user" for i in launch.items)


# --- the baselines -------------------------------------------------------------------------------------------


def _quick_run(session: Session) -> Run:
    run = Run(session, 0.2, round(0.2 * session.tokens))
    run_baselines(run)
    return run


def test_truncation_loses_the_items_stated_early_in_the_quick_session() -> None:
    for session in sessions(quick=True, rounds=2):
        run = _quick_run(session)
        truncation = [s for s in run.scores if s.way == "truncation"]
        assert [s.round for s in truncation] == [1, 2]
        for result in truncation:
            assert result.current[0] < result.current[1] / 2, result.current
            early = [
                s for s in result.items if max((s.item.stated_at, *s.item.updated_at)) < len(session.messages) // 2
            ]
            assert len(early) >= 8 and not any(s.current for s in early)
            assert result.tokens <= run.budget
            assert result.safety[0] < result.safety[1]


def test_summarise_once_summarises_at_the_first_overflow_then_keeps_the_summary_first() -> None:
    words = " ".join(f"word{i}" for i in range(40))
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i} {words}"} for i in range(12)]
    transcripts = [messages[: i + 1] for i in range(0, 12, 2)]
    budget = count_messages(messages[:5]) + 5  # three requests fit whole, the fourth (seven messages) does not
    sent = list(summarised_once(iter(transcripts), budget))
    assert sent[:3] == transcripts[:3]
    summary = sent[3][0]
    assert summary["content"] == "Summary: user: m0 " + " ".join(f"word{i}" for i in range(28))  # 30 words
    assert sent[3] == [summary, messages[6]]  # everything but the newest message went into the summary
    for request, transcript in zip(sent[4:], transcripts[4:], strict=True):
        assert request[0] is summary and request[1:] == transcript[-(len(request) - 1) :]
        assert count_messages(request) <= budget and len(request) - 1 <= len(transcript) - 6  # never re-sent
    assert len(sent[5]) < 1 + len(transcripts[5]) - 6  # the tail no longer fits whole: newest messages only


# --- through the proxy ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick_run() -> list[Run]:
    runs, _ = standing.run((0.2,), quick=True, rounds=2)
    return runs


def test_the_quick_run_scores_every_way_at_every_round(quick_run: list[Run]) -> None:
    assert [r.session.script for r in quick_run] == ["launch", "agent"]
    for run in quick_run:
        assert not run.errors, run.errors[:3]
        assert run.summarizer_calls > 0 and run.compaction["scheduled"] > 0  # the proxy did compact
        assert sorted((s.way, s.round) for s in run.scores) == sorted(
            (way, r) for way in ("truncation", "summarise once", "lcm-proxy") for r in (1, 2)
        )
        for result in run.scores:
            assert 0 < result.tokens <= run.budget + 200, (result.way, result.tokens, run.budget)


@pytest.fixture(scope="module")
def full_run() -> list[Run]:
    """Both ~130-exchange sessions at a fifth of their history, three rounds: the issue's acceptance setting."""
    runs, _ = standing.run((0.2,), quick=False, rounds=3)
    return runs


def test_acceptance_standing_instructions_stay_in_force_at_a_fifth_of_the_history(full_run: list[Run]) -> None:
    """Issue 24's bar, with the fake summariser (the deterministic path carries it): at every round, at least 95%
    of the current items present, at most 5% of the stale values, every safety rule and hard constraint."""
    assert [r.session.script for r in full_run] == ["launch", "agent"]
    for run in full_run:
        assert sorted(s.round for s in run.scores if s.way == "lcm-proxy") == [1, 2, 3]
        assert run.compaction["scheduled"] > 0  # the proxy did compact: the items are not simply still raw
        for result in (s for s in run.scores if s.way == "lcm-proxy"):
            (present, items), (stale, stale_values), (safe, safety) = result.current, result.stale, result.safety
            where = (run.session.script, result.round)
            assert present >= 0.95 * items, (where, result.current)
            assert stale <= 0.05 * stale_values, (where, result.stale)
            assert safe == safety, (where, result.safety)


def test_the_standing_flag_prints_a_table_per_session(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(standing, "sessions", lambda quick, rounds: [generate("agent", 24, rounds)])
    fidelity.main(quick=True, argv=["--standing"])
    out = capsys.readouterr().out
    assert "## standing instructions: agent session (24 exchanges" in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| 20%")]
    assert sorted((cells[2].strip(), cells[3].strip()) for cells in rows) == sorted(
        (way, r) for way in ("truncation", "summarise once", "lcm-proxy") for r in ("1", "2")
    )
    assert all(len(cells) == 15 for cells in rows)  # budget, way, round, current, stale, six kinds, safety, tokens
