"""The readers' code quotes none of the evaluation sets' sentences: a pattern or a comment written from a planted
sentence makes the set a training set (issue 29). Five words in a row of any planted item or distractor, found
in the code of ``proxy/``, fail this test."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SETS = ROOT / "tests" / "engine" / "standing_eval"


def _fold(text: str) -> str:
    return " ".join(text.replace("’", "'").casefold().split())


def fragments() -> set[str]:
    found: set[str] = set()
    for path in sorted(SETS.glob("*/*.json")):
        conversation = json.loads(path.read_text(encoding="utf-8"))
        for planted in [*conversation["items"], *conversation.get("distractors", [])]:
            words = _fold(planted["quote"]).split()
            found |= {" ".join(words[i : i + 5]) for i in range(len(words) - 4)}
    return {f for f in found if len(f) >= 24}


def windows(text: str) -> set[str]:
    words = _fold(text).split()
    return {" ".join(words[i : i + 5]) for i in range(len(words) - 4)}


def test_no_planted_sentence_is_quoted_in_the_code() -> None:
    planted = fragments()
    assert len(planted) > 1000  # both sets were read
    quoted = {
        str(path.relative_to(ROOT)): sorted(planted & windows(path.read_text(encoding="utf-8")))
        for path in sorted((ROOT / "proxy").rglob("*.py"))
    }
    assert {path: found for path, found in quoted.items() if found} == {}
