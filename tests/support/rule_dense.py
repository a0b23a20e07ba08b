"""Sentences that set standing instructions, for the ledger's bounds: the benchmark scripts' own (``bench/
standing_data.py``, ``bench/fidelity_data.py``), and generated rules, limits, decisions and lifts dense enough
to make every sentence of a message an instruction (the hostile probe of issue 'bounded ledger': 4 KB messages
of rules, 300 of them in one request).
"""

from __future__ import annotations

import random
from typing import Any

from bench.fidelity_data import TEMPLATES, THEMES
from bench.standing_data import AGENT, AGENT_PLANTS, LAUNCH_PLANTS

VERBS = ("push", "deploy", "edit", "delete", "rename", "merge", "publish", "rebase", "commit", "log", "cache", "run")
QUALIFIERS = (
    "staging",
    "production",
    "legacy",
    "shared",
    "billing",
    "orders",
    "mobile",
    "internal",
    "vendor",
    "public",
)
NOUNS = ("branch", "database", "bucket", "config", "module", "endpoint", "cluster", "secrets", "tables", "queue")
TOOLS = ("httpx", "ruff", "Redis", "SQLite", "Kafka", "pytest", "Terraform", "nginx")
SHAPES = (
    "Never {v} the {q} {n} without a review.",
    "Always {v} the {q} {n} before noon.",
    "Keep the {q} {n} under {k} ms.",
    "The {q} budget is ${k}.",
    "We decided to use {t} for the {q} {n}.",
    "Do not {v} anything in the {q} {n}.",
    "The {q} {n} must stay below {k} GB.",
    "From now on, {v} the {q} {n} only on Fridays.",
    "You may {v} the {q} {n} again now.",
    "Feel free to {v} the {q} {n} from now on.",
    "The deadline for the {q} {n} is {k} March.",
    "The {q} {n} is called {q}-{k}.",
    "I'd prefer {t} for the {q} {n}.",
    "Our goal for the {q} {n} is to cut errors by {k} percent.",
)


def rule(rng: random.Random) -> str:
    """One generated sentence that sets something (most of them are read as standing instructions)."""
    shape = rng.choice(SHAPES)
    return shape.format(
        v=rng.choice(VERBS), q=rng.choice(QUALIFIERS), n=rng.choice(NOUNS), t=rng.choice(TOOLS), k=rng.randrange(1, 999)
    )


def rule_dense(rng: random.Random, size: int = 4000) -> str:
    """A message of about ``size`` characters made of nothing but such sentences."""
    out: list[str] = []
    length = 0
    while length < size:
        out.append(rule(rng))
        length += len(out[-1]) + 1
    return " ".join(out)


def rule_dense_request(messages: int, size: int = 4000, seed: int = 0) -> list[dict[str, Any]]:
    """A transcript of ``messages`` rule-dense user messages, each answered by a short assistant turn."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(messages):
        out.append({"role": "user", "content": rule_dense(rng, size)})
        if i < messages - 1:
            out.append({"role": "assistant", "content": f"Noted ({i})."})
    return out


def corpus(seed: int = 0) -> list[tuple[str, str]]:
    """(role, sentence): the benchmark scripts' planted instructions and filler, the fidelity benchmark's facts
    with drawn values, and generated rules of every shape above (each value drawn a few times, so that
    updates, repeats and lifts of one another occur)."""
    rng = random.Random(seed)
    out = [(plant.role, plant.text) for plant in (*LAUNCH_PLANTS, *AGENT_PLANTS)]
    things = AGENT.things
    for role, shapes in (("user", AGENT.user), ("assistant", AGENT.assistant)):
        out += [(role, shape.format(x=rng.choice(things), y=rng.choice(things))) for shape in shapes]
    theme = THEMES["coding"]
    for role in ("user", "assistant"):
        out += [(role, s.format(x=rng.choice(theme["things"]), y=rng.choice(theme["things"]), d="Monday"))
                for s in theme[role]]  # fmt: skip
    for template in TEMPLATES:
        out += [("user", template.statement.format(v=template.value(rng).answer)) for _ in range(2)]
    small = random.Random(seed + 1)  # few words and values: generated rules collide, update and lift each other
    for _ in range(300):
        shape = small.choice(SHAPES)
        out.append(("user", shape.format(v=small.choice(VERBS[:3]), q=small.choice(QUALIFIERS[:3]),
                                         n=small.choice(NOUNS[:3]), t=small.choice(TOOLS[:3]),
                                         k=small.choice((5, 50, 500)))))  # fmt: skip
    return out
