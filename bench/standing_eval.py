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

``--real`` adds a third way: the proposals come from a real local model, Qwen2.5-Coder-0.5B-Instruct served by
llama.cpp (the model and server of ``python -m bench fidelity --real``), asked for every chunk exactly as the leaf
pass asks the summary model: the chunk's messages rendered as the summariser reads them (``render_message``), the
notes it wrote for the previous chunk, the current items (``standing_so_far``), then the leaf task with the
standing request (``leaf_prompt(..., standing=True)``); its answer is split and parsed (``proposals.split``,
``proposals.parse``) and verified like any other (``proposals.accept``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy.engine.standing import ledger
from proxy.engine.standing.flow import read_statements
from proxy.store.records import LedgerItem

SETS = Path(__file__).resolve().parent.parent / "tests" / "engine" / "standing_eval"
FROZEN = SETS / "frozen"  # the evaluation set: never edited, never read while changing the reader
DEV = SETS / "dev"  # the development set: written the same way by other helpers, the one to read misses on

# A summariser's proposals for a run of messages, given the ledger's items so far: dicts of kind, quote, changes
# (the id or words of the item it changes or lifts) and lifts, as ``proposals.parse`` returns them.
Proposer = Callable[[dict[str, Any], Sequence[int], Sequence[LedgerItem]], list[dict[str, Any]]]


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
    missed: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("planted", "found", "kept", "true", "changes", "changes_seen", "current", "current_held"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.stale_shown += other.stale_shown
        self.stale_examples += other.stale_examples
        self.distractors_taken += other.distractors_taken
        self.missed += other.missed

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
            offered = proposer(conversation, run_indices, items)
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
        # An id as the store writes them ("led_" and 16 hex digits: the only form ``proposals.parse`` reads back).
        key = hashlib.sha256(f"{cid}/{seq}/{n}/{len(items)}".encode()).hexdigest()[:16]
        item = LedgerItem(
            id=f"led_{key}", conversation_id=cid, kind=statement.kind,
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
        if item is None:
            t.missed.append(f"{conversation['id']}#{p['message']} ({p['kind']}): {p['quote'][:110]}")
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


def eager(
    conversation: dict[str, Any], indices: Sequence[int], items: Sequence[LedgerItem] = ()
) -> list[dict[str, Any]]:
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


# --- a real summariser: Qwen2.5-Coder-0.5B-Instruct through llama.cpp (as ``python -m bench fidelity --real``) ---

LEAF_TARGET = 200  # the notes' target, as ``leaf_prompt(target=...)`` asks
MAX_TOKENS = 300  # room for the notes and the STANDING section after them
BASE_TIME = 1_700_000_000.0  # the frozen messages carry no times: one a minute from here, for the rendering


def leaf_request(
    conversation: dict[str, Any], indices: Sequence[int], items: Sequence[LedgerItem], previous: str = ""
) -> tuple[str, str, str]:
    """(system, user, the rendered chunk) of the leaf pass's summary call for the messages ``indices``, built as
    ``Passes.leaf_pass`` and ``summarize`` build it: the previous notes, the current items, the chunk rendered as
    the summariser reads it (``render_message``), then the leaf task with the standing request."""
    from proxy.dialects.chat import CHAT
    from proxy.engine.neutralise import defang_markers
    from proxy.engine.render import render_message
    from proxy.engine.standing.proposals import standing_so_far
    from proxy.engine.summarize import leaf_prompt

    messages = conversation["messages"]
    source = "\n\n".join(render_message(messages[i], BASE_TIME + 60 * i, CHAT) for i in indices)
    context = f"<previous_notes>\n{defang_markers(previous)}\n</previous_notes>\n\n" if previous else ""
    material = f"{context}{standing_so_far(items)}<conversation>\n{source}\n</conversation>"
    system, task = leaf_prompt(LEAF_TARGET, False, standing=True)
    return system, f"{material}\n\n{task}", source


@dataclass
class Call:
    conversation: str
    indices: tuple[int, int]
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    finish: str
    standing: bool  # the answer had a STANDING section
    offered: list[dict[str, Any]]
    accepted: list[str]  # the statements verification kept (as the leaf pass would merge them)
    already: int  # of them, items the deterministic reader already held
    answer: str
    notes_usable: bool  # ``summarize`` would take these notes (else it asks again with the aggressive prompt)
    # the proposals read from the same section once the model's layout is undone (``lenient``: a diagnostic)
    lenient: list[dict[str, Any]] = field(default_factory=list)
    lenient_accepted: list[str] = field(default_factory=list)
    lenient_new: int = 0  # of them, not already held by the deterministic reader


class RealProposer:
    """A ``Proposer`` backed by a chat-completions server (``url``): one leaf-pass call per chunk, temperature 0."""

    def __init__(self, url: str, max_tokens: int = MAX_TOKENS, timeout: float = 1800.0, client: Any = None) -> None:
        import httpx

        self.client: httpx.Client = client or httpx.Client(base_url=url, timeout=timeout)
        self.max_tokens = max_tokens
        self.calls: list[Call] = []
        self._notes: dict[str, str] = {}  # conversation id -> the notes of its previous chunk

    def __call__(
        self, conversation: dict[str, Any], indices: Sequence[int], items: Sequence[LedgerItem] = ()
    ) -> list[dict[str, Any]]:
        from proxy import tokens
        from proxy.engine.facts import clean_generation
        from proxy.engine.injection import remove_instruction_overrides
        from proxy.engine.render import strip_reasoning
        from proxy.engine.standing import proposals
        from proxy.engine.summarize import clip_lines, echoes

        cid = conversation["id"]
        previous = "" if indices[0] == 0 else self._notes.get(cid, "")
        system, user, source = leaf_request(conversation, indices, items, previous)
        body = {
            "model": "summarizer", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": self.max_tokens, "temperature": 0,
        }  # fmt: skip
        start = time.perf_counter()
        response = self.client.post("/v1/chat/completions", json=body)
        seconds = time.perf_counter() - start
        response.raise_for_status()
        payload = response.json()
        choice = (payload.get("choices") or [{}])[0]
        answer = str((choice.get("message") or {}).get("content") or "")
        notes, section = proposals.split(strip_reasoning(answer))
        # The notes as ``summarize`` checks them: unusable ones (empty, an echo, no smaller than the source) make
        # it ask again with the aggressive prompt, and this answer's section is never read.
        content = clip_lines(remove_instruction_overrides(clean_generation(notes)), LEAF_TARGET * 3 // 2 + 16)
        usable = bool(content) and tokens.count_text(content) < tokens.count_text(source) and not echoes(content)
        self._notes[cid] = content if usable else ""
        offered = proposals.parse(section) if section else []
        messages = conversation["messages"]
        chunk = {i: messages[i] for i in indices}
        plans = proposals.accept(offered, chunk, items)
        loose = lenient(section)
        loose_plans = proposals.accept(loose, chunk, items)
        usage = payload.get("usage") or {}
        self.calls.append(
            Call(
                cid, (indices[0], indices[-1]), seconds, int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)), str(choice.get("finish_reason")),
                proposals.HEADER in answer, offered, [p.statement.text for p in plans],
                sum(p.existing is not None for p in plans), answer, usable, loose,
                [p.statement.text for p in loose_plans], sum(p.existing is None for p in loose_plans),
            )
        )  # fmt: skip
        return offered

    def close(self) -> None:
        self.client.close()


_LAYOUT = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*(?:STANDING:\s*)?", re.I)
_OWN_ID = re.compile(r"^\s*led_[0-9a-f]{16}\s*\|\s*")


def lenient(section: str) -> list[dict[str, Any]]:
    """A diagnostic only (never what the table is scored on): the proposals of ``section`` once two layouts a small
    model writes are undone, a 'STANDING:' header repeated on every line and an item's own id put first (the
    layout of ``standing_so_far``, copied), so that the report can say what a parser reading them would gain."""
    from proxy.engine.standing import proposals

    lines = [_OWN_ID.sub("", _LAYOUT.sub("", line, count=1), count=1) for line in section.splitlines()]
    return proposals.parse("\n".join(lines))


def report_calls(calls: Sequence[Call], examples: int = 6) -> str:
    """The summariser's side of the real run: sections written, proposals offered and accepted, timings, examples."""
    n = len(calls)
    sections = sum(c.standing for c in calls)
    empty = sum(c.standing and not c.offered for c in calls)
    offered = sum(len(c.offered) for c in calls)
    accepted = sum(len(c.accepted) for c in calls)
    already = sum(c.already for c in calls)
    cut = sum(c.finish == "length" for c in calls)
    seconds = sum(c.seconds for c in calls)
    unusable = sum(not c.notes_usable for c in calls)
    loose = sum(len(c.lenient) for c in calls)
    loose_accepted = sum(len(c.lenient_accepted) for c in calls)
    loose_new = sum(c.lenient_new for c in calls)
    lines = [
        f"chunks: {n}; with a STANDING section: {sections}/{n} ({empty} of them with no readable proposal);"
        f" answers cut at max_tokens: {cut}; notes summarize() would reject (so that in the proxy this"
        f" answer's section is never read, the aggressive prompt is tried instead): {unusable}/{n}",
        f"proposals offered: {offered}; accepted by verification: {accepted}"
        f" ({already} of them already held by the deterministic reader)",
        f"diagnostic, not scored: read leniently (a 'STANDING:' on every line, an item's own id first), the same"
        f" sections offer {loose} proposals; verification would accept {loose_accepted} ({loose_new} not already"
        " held by the deterministic reader)",
        f"model time: {seconds:.0f} s, {seconds / n if n else 0:.1f} s a chunk; prompt tokens"
        f" {sum(c.prompt_tokens for c in calls)}, completion tokens {sum(c.completion_tokens for c in calls)}",
    ]
    lines.append("")
    for label, loose in (("", False), ("read leniently, ", True)):
        taken = {id(c): c.lenient_accepted if loose else c.accepted for c in calls}
        kept = _unique((c, q) for c in calls for q in taken[id(c)])
        refused = _unique(
            (c, f"{p['kind']} | {p['quote']}" + (f" | {p['changes']}" if p["changes"] else ""))
            for c in calls
            for p in (c.lenient if loose else c.offered)
            if not any(_fold(p["quote"]) in _fold(a) for a in taken[id(c)])
        )
        lines.append(f"Accepted proposals, {label}{len(kept)} distinct (examples):")
        lines += [f"  {c.conversation} #{c.indices[0]}-{c.indices[1]}: {q[:120]!r}" for c, q in kept[:examples]]
        lines.append(f"Refused proposals, {label}{len(refused)} distinct (examples):")
        lines += [f"  {c.conversation} #{c.indices[0]}-{c.indices[1]}: {q[:120]!r}" for c, q in refused[:examples]]
    return "\n".join(lines)


def _unique(pairs: Iterable[tuple[Call, str]]) -> list[tuple[Call, str]]:
    seen: set[tuple[str, str]] = set()
    out: list[tuple[Call, str]] = []
    for call, text in pairs:
        if (call.conversation, text) not in seen:
            seen.add((call.conversation, text))
            out.append((call, text))
    return out


def main(quick: bool = False, argv: Sequence[str] = ()) -> None:
    from bench import fidelity

    parser = argparse.ArgumentParser(prog="python -m bench standing-eval", description=__doc__)
    parser.add_argument("--verbose", action="store_true", help="list stale values shown and distractors taken")
    parser.add_argument(
        "--set", choices=("frozen", "dev"), default="frozen",
        help="frozen: the evaluation set (the score to report); dev: the development set, where --verbose also"
        " lists every planted item missed",
    )  # fmt: skip
    parser.add_argument("--real", action="store_true", help="a third way: proposals from a real local model")
    parser.add_argument(
        "--model", type=Path, help=f"GGUF file for --real (default: ${fidelity.MODEL_ENV}, else the fetched one)"
    )
    parser.add_argument(
        "--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
        help="llama.cpp threads (default: one core fewer than the machine's; on a busy machine more threads than "
        "free cores slow llama.cpp down many times over)",
    )  # fmt: skip
    parser.add_argument("--window", type=int, default=8192, help="the model's context window (llama n_ctx)")
    parser.add_argument("--limit", type=int, help="only the first N conversations (every way)")
    parser.add_argument(
        "--minutes", type=float,
        help="with --real: start no further conversation after this many minutes (every way is then scored on "
        "the conversations the real model finished)",
    )  # fmt: skip
    parser.add_argument("--answers", action="store_true", help="with --real: print every answer of the model")
    args = parser.parse_args(list(argv))
    folder = DEV if args.set == "dev" else FROZEN
    conversations = load(folder)
    real = args.real or args.model is not None
    if args.limit:
        conversations = conversations[: args.limit]
    print(f"{args.set} set {digest(folder)[:12]}: {len(conversations)} conversations\n")
    if not real:
        for title, proposer in (("Deterministic reader alone", None), ("With a summariser that proposes items", eager)):
            _print_way(title, evaluate(conversations, proposer), args.verbose, missed=args.set == "dev")
        return
    model = args.model or fidelity.default_model_path() or fidelity.fetch_model()
    if not model.exists():
        raise SystemExit(f"no model at {model}")
    start = time.perf_counter()
    done: list[dict[str, Any]] = []
    real_totals: dict[str, Tally] = {}
    with fidelity.llama_server(model, args.window, args.threads) as url:
        loaded = time.perf_counter() - start
        real_proposer = RealProposer(url)
        try:
            for conversation in conversations:
                if args.minutes is not None and time.perf_counter() - start > args.minutes * 60:
                    break
                began, calls = time.perf_counter(), len(real_proposer.calls)
                for language, t in score(conversation, run(conversation, real_proposer)).items():
                    real_totals.setdefault(language, Tally()).add(t)
                done.append(conversation)
                print(
                    f"  {conversation['id']}: {len(real_proposer.calls) - calls} chunks,"
                    f" {time.perf_counter() - began:.0f} s",
                    flush=True,
                )  # fmt: skip
        finally:
            real_proposer.close()
    wall = time.perf_counter() - start
    print(
        f"\nscored on {len(done)} of the {len(conversations)} conversations: " + ", ".join(c["id"] for c in done) + "\n"
    )
    for title, proposer in (("Deterministic reader alone", None), ("With a summariser that proposes items", eager)):
        _print_way(title, evaluate(done, proposer), args.verbose)
    title = "With the real 0.5B summariser (Qwen2.5-Coder-0.5B-Instruct, llama.cpp)"
    _print_way(title, real_totals, args.verbose)
    print(report_calls(real_proposer.calls))
    if args.answers:
        for call in real_proposer.calls:
            print(f"\n--- {call.conversation} #{call.indices[0]}-{call.indices[1]} ({call.seconds:.1f} s)")
            print(call.answer)
    print(
        f"\nmodel {model.name}, {args.threads} llama.cpp thread(s); model load {loaded:.0f} s;"
        f" wall time of the real way: {wall:.0f} s"
    )


def _print_way(title: str, totals: dict[str, Tally], verbose: bool, missed: bool = False) -> None:
    print(table(title, totals) + "\n")
    if verbose and missed:
        for line in totals["all"].missed:
            print("  missed:", line)
    if verbose:
        for line in totals["all"].stale_examples:
            print("  stale shown:", line)
        for line in totals["all"].distractors_taken:
            print("  distractor taken:", line)
        print()
