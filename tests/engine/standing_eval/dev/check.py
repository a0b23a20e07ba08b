#!/usr/bin/env python3
"""Validate the frozen standing-instructions evaluation set.

Standard library only. Usage:  python3 check.py [folder]
Exits non-zero if any file violates the format or the set-level minimums.
"""
import collections
import glob
import hashlib
import json
import os
import re
import sys

KINDS = {"rule", "constraint", "preference", "goal", "decision", "name"}
ROLES = {"system", "user", "assistant", "tool"}
WHYS = {"hypothetical", "reported speech", "pasted email", "quoted customer", "tool output",
        "assistant", "question", "uncertain", "one-off", "traceback", "code", "other"}
TOP_KEYS = {"id", "languages", "description", "messages", "items", "distractors"}
ITEM_KEYS = {"id", "message", "quote", "kind", "language", "about", "value",
             "replaces", "revokes", "current_at_end"}
DIS_KEYS = {"message", "quote", "why"}
LANG_RE = re.compile(r"^[a-z]{2}$")
REQUIRED_LANGS = ("de", "fr")


def check_file(path, errors):
    def err(msg):
        errors.append(f"{os.path.basename(path)}: {msg}")

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        err(f"invalid JSON: {e}")
        return None
    if not isinstance(doc, dict) or set(doc) != TOP_KEYS:
        err(f"top-level keys must be exactly {sorted(TOP_KEYS)}")
        return None
    stem = os.path.splitext(os.path.basename(path))[0]
    if doc["id"] != stem:
        err(f"id {doc['id']!r} does not match file name {stem!r}")
    if not re.match(r"^[a-d]\d\d-[a-z0-9-]+$", str(doc["id"])):
        err("id must look like 'a01-some-name' (a-d: the helper who wrote it)")
    langs = doc["languages"]
    if not isinstance(langs, list) or not langs or not all(isinstance(l, str) and LANG_RE.match(l) for l in langs):
        err("languages must be a non-empty list of ISO 639-1 codes")
        langs = []
    if not isinstance(doc["description"], str) or not doc["description"].strip():
        err("description must be a non-empty string")

    msgs = doc["messages"]
    if not isinstance(msgs, list) or not (20 <= len(msgs) <= 40):
        err(f"needs 20-40 messages, has {len(msgs) if isinstance(msgs, list) else '?'}")
        if not isinstance(msgs, list):
            return None
    for i, mm in enumerate(msgs):
        if not isinstance(mm, dict) or set(mm) != {"role", "content"}:
            err(f"message {i}: must have exactly role and content")
            continue
        if mm["role"] not in ROLES:
            err(f"message {i}: bad role {mm['role']!r}")
        if not isinstance(mm["content"], str) or not mm["content"].strip():
            err(f"message {i}: empty content")
    roles = [mm.get("role") if isinstance(mm, dict) else None for mm in msgs]
    start = 1 if roles and roles[0] == "system" else 0
    if start < len(roles) and roles[start] != "user":
        err("first non-system message must be from the user")
    for i in range(start + 1, len(roles)):
        r, prev = roles[i], roles[i - 1]
        if r == "system":
            err(f"message {i}: system message only allowed first")
        elif r == "user" and prev != "assistant":
            err(f"message {i}: user message must follow an assistant message")
        elif r == "assistant" and prev not in ("user", "tool"):
            err(f"message {i}: assistant message must follow a user or tool message")
        elif r == "tool" and prev not in ("assistant", "tool"):
            err(f"message {i}: tool message must follow an assistant message")
    # a tool message must be followed by the assistant (or another tool)
    for i in range(len(roles) - 1):
        if roles[i] == "tool" and roles[i + 1] not in ("assistant", "tool"):
            err(f"message {i + 1}: must be an assistant reply after tool output")

    def content(idx):
        if isinstance(idx, int) and not isinstance(idx, bool) and 0 <= idx < len(msgs) and isinstance(msgs[idx], dict):
            return msgs[idx].get("content", "")
        return None

    items = doc["items"]
    if not isinstance(items, list):
        err("items must be a list")
        return None
    if not (8 <= len(items) <= 20):
        err(f"needs 8-20 items, has {len(items)}")
    seen = {}
    targeted = collections.Counter()
    for n, it in enumerate(items):
        if not isinstance(it, dict) or set(it) != ITEM_KEYS:
            err(f"item #{n}: keys must be exactly {sorted(ITEM_KEYS)}")
            continue
        iid = it["id"]
        if not isinstance(iid, str) or not iid:
            err(f"item #{n}: bad id")
            continue
        if iid in seen:
            err(f"item {iid}: duplicate id")
        c = content(it["message"])
        if c is None:
            err(f"item {iid}: message index {it['message']!r} out of range")
        else:
            if roles[it["message"]] not in ("user", "system"):
                err(f"item {iid}: stated in a {roles[it['message']]} message (only user/system may state items)")
            if not isinstance(it["quote"], str) or not it["quote"].strip():
                err(f"item {iid}: empty quote")
            elif it["quote"] not in c:
                err(f"item {iid}: quote not found verbatim in message {it['message']}: {it['quote']!r}")
        if it["kind"] not in KINDS:
            err(f"item {iid}: bad kind {it['kind']!r}")
        if not isinstance(it["language"], str) or not LANG_RE.match(it["language"]):
            err(f"item {iid}: bad language {it['language']!r}")
        elif langs and it["language"] not in langs:
            err(f"item {iid}: language {it['language']!r} not listed in conversation languages {langs}")
        if not isinstance(it["about"], str) or not it["about"].strip():
            err(f"item {iid}: empty about")
        if not isinstance(it["current_at_end"], bool):
            err(f"item {iid}: current_at_end must be a boolean")
        rep, rev = it["replaces"], it["revokes"]
        if rep is not None and rev is not None:
            err(f"item {iid}: cannot both replace and revoke")
        for field, target in (("replaces", rep), ("revokes", rev)):
            if target is None:
                continue
            if target not in seen:
                err(f"item {iid}: {field} {target!r} is not an earlier item")
                continue
            prev = seen[target]
            if isinstance(prev.get("message"), int) and isinstance(it["message"], int) and prev["message"] > it["message"]:
                err(f"item {iid}: {field} {target} which is stated in a later message")
            if prev.get("kind") != it["kind"]:
                err(f"item {iid}: kind {it['kind']!r} differs from {field} target {target} ({prev.get('kind')!r})")
            if prev.get("revokes") is not None:
                err(f"item {iid}: {field} {target}, which is itself a revocation")
            targeted[target] += 1
        if rev is not None:
            if it["value"] is not None:
                err(f"item {iid}: a revocation must have value null")
            if it["current_at_end"] is not False:
                err(f"item {iid}: a revocation must have current_at_end false")
        else:
            if not isinstance(it["value"], str) or not it["value"].strip():
                err(f"item {iid}: value must be a non-empty string (null only for revocations)")
        seen[iid] = it
    for iid, it in seen.items():
        if targeted[iid] > 1:
            err(f"item {iid}: replaced/revoked more than once (chain updates instead)")
        expected = targeted[iid] == 0 and it.get("revokes") is None
        if it.get("current_at_end") is not expected:
            err(f"item {iid}: current_at_end should be {expected}")
    n_upd = sum(1 for it in seen.values() if it.get("replaces"))
    n_rev = sum(1 for it in seen.values() if it.get("revokes"))
    if n_upd + n_rev < 3:
        err(f"needs at least 3 updates/revocations, has {n_upd + n_rev}")

    dis = doc["distractors"]
    if not isinstance(dis, list):
        err("distractors must be a list")
        dis = []
    if len(dis) < 4:
        err(f"needs at least 4 distractors, has {len(dis)}")
    item_quotes = {(it.get("message"), it.get("quote")) for it in seen.values()}
    for n, d in enumerate(dis):
        if not isinstance(d, dict) or set(d) != DIS_KEYS:
            err(f"distractor #{n}: keys must be exactly {sorted(DIS_KEYS)}")
            continue
        c = content(d["message"])
        if c is None:
            err(f"distractor #{n}: message index {d['message']!r} out of range")
        elif not isinstance(d["quote"], str) or not d["quote"].strip():
            err(f"distractor #{n}: empty quote")
        elif d["quote"] not in c:
            err(f"distractor #{n}: quote not found verbatim in message {d['message']}: {d['quote']!r}")
        if d["why"] not in WHYS:
            err(f"distractor #{n}: bad why {d['why']!r}")
        if (d["message"], d["quote"]) in item_quotes:
            err(f"distractor #{n}: same quote as an expected item")
    return doc


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    paths = sorted(glob.glob(os.path.join(folder, "*.json")))
    errors = []
    docs = [d for d in (check_file(p, errors) for p in paths) if d]

    per_lang = collections.Counter()
    per_kind = collections.Counter()
    per_why = collections.Counter()
    n_items = n_upd = n_rev = n_dis = n_current = 0
    non_en = []
    typographic = False
    for d in docs:
        its = d["items"] if isinstance(d["items"], list) else []
        for it in its:
            if not isinstance(it, dict):
                continue
            n_items += 1
            per_lang[it.get("language")] += 1
            per_kind[it.get("kind")] += 1
            n_upd += bool(it.get("replaces"))
            n_rev += bool(it.get("revokes"))
            n_current += it.get("current_at_end") is True
            if any(ch in str(it.get("quote")) for ch in "’‘“”"):
                typographic = True
        for x in d["distractors"] if isinstance(d["distractors"], list) else []:
            if isinstance(x, dict):
                n_dis += 1
                per_why[x.get("why")] += 1
        if isinstance(d["languages"], list) and "en" not in d["languages"]:
            non_en.append(d["id"])

    if len(paths) < 20:
        errors.append(f"set: needs at least 20 conversation files, has {len(paths)}")
    if n_items < 350:
        errors.append(f"set: needs at least 350 items, has {n_items}")
    if n_upd + n_rev < 100:
        errors.append(f"set: needs at least 100 updates/revocations, has {n_upd + n_rev}")
    if n_dis < 200:
        errors.append(f"set: needs at least 200 distractors, has {n_dis}")
    for lang in REQUIRED_LANGS:
        if per_lang[lang] < 8:
            errors.append(f"set: needs at least 8 items in {lang!r}, has {per_lang[lang]}")
    if len(non_en) < 2:
        errors.append(f"set: needs at least 2 conversations wholly in a non-English language, has {non_en}")
    if not typographic:
        errors.append("set: no item quote uses typographic apostrophes/quotes")

    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode())
        with open(p, "rb") as f:
            h.update(f.read())

    print(f"files: {len(paths)}")
    for d in docs:
        its = d["items"]
        print(f"  {d['id']:<26} msgs={len(d['messages']):>2} items={len(its):>2} "
              f"upd/rev={sum(1 for i in its if i.get('replaces') or i.get('revokes')):>2} "
              f"distractors={len(d['distractors']):>2} langs={','.join(d['languages'])}")
    print(f"items: {n_items} (current at end: {n_current})")
    print("per language: " + ", ".join(f"{k}={v}" for k, v in sorted(per_lang.items())))
    print("per kind: " + ", ".join(f"{k}={v}" for k, v in sorted(per_kind.items())))
    print(f"updates: {n_upd}  revocations: {n_rev}  total: {n_upd + n_rev}")
    print(f"distractors: {n_dis}  (" + ", ".join(f"{k}={v}" for k, v in sorted(per_why.items())) + ")")
    print(f"wholly non-English conversations: {', '.join(non_en)}")
    print(f"sha256 of *.json (name+bytes, sorted): {h.hexdigest()}")
    if errors:
        print(f"\n{len(errors)} violation(s):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
