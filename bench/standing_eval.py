"""Score the standing-instructions readers on the frozen evaluation set (``tests/engine/standing_eval/frozen/``).

``python -m bench standing-eval`` prints, per language and in all: the reader's recall of the planted standing
items, its precision (items it kept that no annotator planted count against it: distractors, filler), the
updates and revocations it recognised, the current items it still holds at the end, and the cases where a
replaced or revoked value is shown as current without its successor (the failure that must never happen).

The set was written by a helper who never saw the readers' code and is never edited to make code pass
(``tests/engine/standing/test_frozen_eval.py`` pins its hash). Each conversation runs through the ledger as
ingest runs it: every message read as it arrives (``flow.read``), reconciled against the items so far
(``ledger.reconcile``); with ``--model``, the items a summariser proposes for the same messages are verified
and merged as the leaf pass merges them (``proposals.accept``), from a scripted summariser that proposes what an
eager model would: every planted item and every distractor (verification must turn the distractors away).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.engine.standing import ledger
from proxy.engine.standing.flow import read_statements
from proxy.store.records import LedgerItem

FROZEN = Path(__file__).resolve().parent.parent / "tests" / "engine" / "standing_eval" / "frozen"

# A summariser's proposals for a run of messages: (message index, kind, quote, id of the item it changes or lifts).
Proposer = Callable[[dict[str, Any], Sequence[int]], list[dict[str, Any]]]


def load(folder: Path = FROZEN) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]


def digest(folder: Path = FROZEN) -> str:
    """One hash over every file of the set (names and bytes), what the test pins."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES).casefold()
    return " ".join(re.findall(r"\w+", text))


_QUOTES = str.maketrans({"’": "'", "‘": "'", "“": '"', "”": '"', "«": '"', "»": '"'})


def matches(item_text: str, quote: str) -> bool:
    """Whether an item's sentence is the planted ``quote`` (the same clause, cut or joined differently)."""
    a, b = _fold(item_text), _fold(quote)
    if not a or not b:
        return False
    if a in b or b in a:
        return True
    wa, wb = a.split(), b.split()
    shared = len(set(wa) & set(wb))
    return shared >= 0.6 * min(len(set(wa)), len(set(wb)))


@dataclass
class Tally:
    planted: int = 0
    found: int = 0
    kept: int = 0  # items the reader kept
    true: int = 0  # of them, items that match a planted one
    changes: int = 0  # planted updates and revocations
    changes_seen: int = 0
    current: int = 0  # planted items current at the end
    current_held: int = 0
    stale_shown: int = 0  # a replaced or revoked value current at the end, its successor not after it
    stale_examples: list[str] = field(default_factory=list)
    distractors_taken: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("planted", "found", "kept", "true", "changes", "changes_seen", "current", "current_held"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.stale_shown += other.stale_shown
        self.stale_examples += other.stale_examples
        self.distractors_taken += other.distractors_taken

    @property
    def recall(self) -> float:
        return self.found / self.planted if self.planted else 1.0

    @property
    def precision(self) -> float:
        return self.true / self.kept if self.kept else 1.0


def run(conversation: dict[str, Any], proposer: Proposer | None = None, chunk: int = 8) -> list[LedgerItem]:
    """Every item the ledger holds at the end of ``conversation`` (current and superseded), message by message as
    ingest reads them; with ``proposer``, the leaf pass's verified proposals merged for each ``chunk`` of messages
    as they would leave the raw view."""
    from proxy.engine.standing import proposals

    messages = conversation["messages"]
    items: list[LedgerItem] = []
    for seq, message in enumerate(messages):
        role, statements = read_statements(message)
        items = _apply(items, seq, role, statements, conversation["id"])
        if proposer is not None and ((seq + 1) % chunk == 0 or seq == len(messages) - 1):
            run_indices = list(range(seq - (seq % chunk), seq + 1))
            offered = proposer(conversation, run_indices)
            for plan in proposals.accept(offered, {i: messages[i] for i in run_indices}, items):
                if plan.existing is not None:
                    items = _supersede(items, plan.changes, plan.existing, plan.seq)
                else:
                    items = _apply(items, plan.seq, plan.role, [plan.statement], conversation["id"], plan.changes)
    return items


def _supersede(items: list[LedgerItem], ids: Sequence[str], by: str, seq: int) -> list[LedgerItem]:
    return [replace(i, superseded_seq=seq, superseded_by=by) if i.id in ids and i.id != by else i for i in items]


def _apply(
    items: list[LedgerItem], seq: int, role: str, statements: Sequence[ledger.Statement], cid: str,
    changes: Sequence[str] = (),
) -> list[LedgerItem]:  # fmt: skip
    for n, (statement, superseded) in enumerate(ledger.reconcile(items, statements, role)):
        superseded = [*superseded, *(c for c in changes if c not in superseded)]
        item = LedgerItem(
            id=f"led_{seq:05d}{n:03d}{len(items):05d}", conversation_id=cid, kind=statement.kind,
            slot=statement.slot, value=statement.value, text=statement.text, seq=seq, message_id=seq, role=role,
            created_at=0.0,
        )  # fmt: skip
        items = [replace(i, superseded_seq=seq, superseded_by=item.id) if i.id in superseded else i for i in items]
        items.append(item)
    return items


def score(conversation: dict[str, Any], items: Sequence[LedgerItem]) -> dict[str, Tally]:
    """Per language (and "all"): the tallies of one conversation's run."""
    planted = conversation["items"]
    by_id = {p["id"]: p for p in planted}
    found: dict[str, LedgerItem] = {}
    true_ids: set[str] = set()
    for p in planted:
        for item in items:
            if item.seq == p["message"] and matches(item.text, p["quote"]):
                found.setdefault(p["id"], item)
                true_ids.add(item.id)
    tallies: dict[str, Tally] = {}

    def tally(language: str) -> Tally:
        return tallies.setdefault(language, Tally())

    for item in items:
        language = _language_of(conversation, item, planted)
        t = tally(language)
        t.kept += 1
        t.true += item.id in true_ids
        if item.id not in true_ids:
            for d in conversation.get("distractors", []):
                if d["message"] == item.seq and matches(item.text, d["quote"]):
                    t.distractors_taken.append(f"{conversation['id']}#{d['message']} ({d['why']}): {item.text[:90]}")
                    break
    successors: dict[str, str] = {}
    for p in planted:
        old = p.get("replaces") or p.get("revokes")
        if old:
            successors[old] = p["id"]
    for p in planted:
        t = tally(p.get("language", "en"))
        t.planted += 1
        item = found.get(p["id"])
        t.found += item is not None
        old_id = p.get("replaces") or p.get("revokes")
        if old_id:
            t.changes += 1
            old = found.get(old_id)
            t.changes_seen += item is not None and (old is None or not old.current)
        if p.get("current_at_end"):
            t.current += 1
            t.current_held += item is not None and item.current
        elif p["id"] in successors and item is not None and item.current:
            successor = found.get(successors[p["id"]])
            shown_after = successor is not None and successor.current and successor.seq > item.seq
            if not shown_after and not by_id[successors[p["id"]]].get("revokes"):
                t.stale_shown += 1
                t.stale_examples.append(f"{conversation['id']}: {item.text[:100]}")
            elif not shown_after:  # a revoked item still current, and the revocation not shown after it
                t.stale_shown += 1
                t.stale_examples.append(f"{conversation['id']} (revoked): {item.text[:100]}")
    total = Tally()
    for t in tallies.values():
        total.add(t)
    tallies["all"] = total
    return tallies


def _language_of(conversation: dict[str, Any], item: LedgerItem, planted: list[dict[str, Any]]) -> str:
    for p in planted:
        if p["message"] == item.seq:
            return str(p.get("language", "en"))
    languages = conversation.get("languages") or ["en"]
    return str(languages[0])


def eager(conversation: dict[str, Any], indices: Sequence[int]) -> list[dict[str, Any]]:
    """A scripted summariser that proposes, for the messages ``indices``, every planted item (with the item it
    changes, by the quote the proxy showed it) and every distractor, as an eager model would."""
    chosen = set(indices)
    out: list[dict[str, Any]] = []
    by_id = {p["id"]: p for p in conversation["items"]}
    for p in conversation["items"]:
        if p["message"] in chosen:
            old = by_id.get(p.get("replaces") or p.get("revokes") or "")
            out.append({
                "kind": p["kind"], "about": p.get("about", ""), "value": p.get("value") or "",
                "quote": p["quote"], "changes": old["quote"] if old else None,
                "lifts": bool(p.get("revokes")),
            })  # fmt: skip
    for d in conversation.get("distractors", []):
        if d["message"] in chosen:
            out.append({"kind": "rule", "about": "", "value": "", "quote": d["quote"], "changes": None})
    return out


def evaluate(conversations: Sequence[dict[str, Any]], proposer: Proposer | None = None) -> dict[str, Tally]:
    totals: dict[str, Tally] = {}
    for conversation in conversations:
        for language, t in score(conversation, run(conversation, proposer)).items():
            totals.setdefault(language, Tally()).add(t)
    return totals


def table(title: str, totals: dict[str, Tally]) -> str:
    rows = [
        f"{title}",
        "| language | planted | recall | precision | updates and revocations seen | current held at the end "
        "| replaced shown as current |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for language in sorted(totals, key=lambda k: (k == "all", k)):
        t = totals[language]
        rows.append(
            f"| {language} | {t.planted} | {t.found}/{t.planted} ({t.recall:.0%}) | {t.true}/{t.kept} "
            f"({t.precision:.2f}) | {t.changes_seen}/{t.changes} | {t.current_held}/{t.current} | {t.stale_shown} |"
        )
    return "\n".join(rows)


def main(quick: bool = False, argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench standing-eval", description=__doc__)
    parser.add_argument("--verbose", action="store_true", help="list stale values shown and distractors taken")
    args = parser.parse_args(list(argv))
    conversations = load()
    print(f"frozen set {digest()[:12]}: {len(conversations)} conversations\n")
    for title, proposer in (("Deterministic reader alone", None), ("With a summariser that proposes items", eager)):
        totals = evaluate(conversations, proposer)
        print(table(title, totals) + "\n")
        if args.verbose:
            for line in totals["all"].stale_examples:
                print("  stale shown:", line)
            for line in totals["all"].distractors_taken:
                print("  distractor taken:", line)
            print()
