"""The fidelity benchmark (``bench/fidelity.py``): its generator, its judge, and what it measures.

After compaction the facts of a long conversation must still reach the model: through lcm-proxy at least
95% of the planted facts are present in what the upstream receives for their questions, and never fewer
than naive truncation keeps within the same budget. A second test asks a real local model (llama.cpp) and
runs only when ``LCM_FIDELITY_MODEL`` names a GGUF file and ``xllamacpp`` is installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fidelity import Settings, SizeResult, run, run_real, truncated
from bench.fidelity_data import TEMPLATES, generate, occurrences, shared_words
from proxy.tokens import count_messages

REPO = Path(__file__).resolve().parent.parent


def test_conversations_are_seeded_and_plant_each_answer_once() -> None:
    for seed, target, n in ((0, 20_000, 12), (1, 6_000, 6), (2, 6_000, 6)):
        conversation = generate(seed, target, n)
        assert conversation == generate(seed, target, n)
        assert 0.97 * target <= conversation.tokens <= 1.05 * target
        assert conversation.tokens == count_messages(conversation.messages)
        roles = [m["role"] for m in conversation.messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        text = "\n".join(m["content"] for m in conversation.messages)
        assert len(conversation.facts) == n
        assert len({f.kind for f in conversation.facts}) == min(n, 6)  # every kind represented
        for fact in conversation.facts:
            assert occurrences(text, fact.answer) == 1, fact
            assert fact.statement[1:] in conversation.messages[fact.message_index]["content"]  # maybe lower-cased
            assert not occurrences(fact.question, fact.answer)
        indexes = [f.message_index for f in conversation.facts]
        assert max(indexes) - min(indexes) > len(conversation.messages) / 2  # spread over the history
    assert generate(0, 6_000, 6) != generate(1, 6_000, 6)


def test_each_question_shares_exactly_its_cue_with_the_statement() -> None:
    for template in TEMPLATES:
        shared = shared_words(template.statement, template.question)
        assert len(shared) == 1 and next(iter(shared)).startswith(template.cue[:4]), (template.cue, shared)


def test_truncation_keeps_the_newest_whole_messages_within_the_budget() -> None:
    conversation = generate(3, 6_000, 6)
    question = {"role": "user", "content": conversation.facts[0].question}
    sent = truncated(conversation.messages, question, 2_000)
    assert sent[-1] == question
    assert sent[:-1] == conversation.messages[-(len(sent) - 1) :]
    assert count_messages(sent) <= 2_000 < count_messages([conversation.messages[-len(sent)], *sent])


def _present(size: SizeResult, way: str) -> tuple[int, int]:
    outcomes = size.ways[way].outcomes
    return sum(o.present for o in outcomes), len(outcomes)


def test_lcm_proxy_forwards_the_facts_that_truncation_loses() -> None:
    settings = Settings(budget=2_000, max_tokens=48)
    results = run([20_000, 6_000], conversations=1, n_facts=None, settings=settings)
    report = {
        size.history_tokens: {way: _present(size, way) for way in ("full context", "truncation", "lcm-proxy")}
        for size in results
    }
    for size in results:
        for way, result in size.ways.items():
            assert result.statuses[400] == 0, (size.history_tokens, way, result.errors[:3])
            assert set(result.statuses) <= {200}, (size.history_tokens, way, result.errors[:3])
        # The judge itself: full context carries every fact where it fits; truncation loses most.
        full = size.ways["full context"]
        assert full.skipped or _present(size, "full context") == (len(full.outcomes), len(full.outcomes))
        truncation, total = _present(size, "truncation")
        assert total == sum(len(c.facts) for c in size.conversations)
        assert truncation < total / 2, report
        proxy, total = _present(size, "lcm-proxy")
        assert proxy >= 0.95 * total, report
        assert proxy >= truncation, report
    assert results[0].ways["full context"].skipped  # ~20k tokens do not fit the 8k window


def test_the_command_prints_its_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "fidelity", "--quick", "--sizes", "6000", "--n", "3"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines() if line.startswith("| ")]
    ways = {cells[4].strip() for cells in rows if len(cells) > 6}
    assert {"full context", "truncation", "lcm-proxy"} <= ways


def _real_model() -> Path | None:
    path = os.environ.get("LCM_FIDELITY_MODEL")
    if not path or not Path(path).is_file() or importlib.util.find_spec("xllamacpp") is None:
        return None
    return Path(path)


@pytest.mark.skipif(
    _real_model() is None,
    reason="needs a real model: set LCM_FIDELITY_MODEL to a GGUF file and install xllamacpp"
    " (pip install -e '.[fidelity]'; python -m bench fidelity --fetch-model fetches the default model)",
)
def test_a_real_model_answers_through_lcm_proxy_at_least_as_well_as_with_truncation() -> None:
    model = _real_model()
    assert model is not None
    settings = Settings(budget=2_000, max_tokens=48, real=True)
    (size,) = run_real(model, [6_000], conversations=1, n_facts=4, settings=settings, threads=os.cpu_count() or 2)
    proxy, truncation = size.ways["lcm-proxy"], size.ways["truncation"]
    for result in size.ways.values():
        assert result.statuses[400] == 0, result.errors[:3]
    assert sum(o.present for o in proxy.outcomes) >= 0.95 * len(proxy.outcomes)
    assert sum(bool(o.correct) for o in proxy.outcomes) >= sum(bool(o.correct) for o in truncation.outcomes)
