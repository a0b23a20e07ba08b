"""Seeded sessions with planted standing instructions, for ``python -m bench fidelity --standing``.

A standing instruction is something a user (or an agent) says once and that must stay in force without
anyone asking for it again: a rule, a hard constraint, a preference, a goal or task state, a decision, a
name (the kinds of ``proxy.store.records.LEDGER_KINDS``). Two scripts, of different kinds so that no
lexicon can be tuned to one of them:

- ``launch``: ordinary work chat (the coding filler of ``bench/fidelity_data.py``) of a team lead planning
  a product pilot;
- ``agent``: a user directing a coding agent, with the agent's own decisions stated in its replies.

Each script plants about twenty items, written the way users write them (varied phrasing, inside longer
messages, sometimes two in one message). Some are updated later in other words, some twice; some come
in near-duplicate pairs that must both stay (two budgets, two protected branch kinds). An item is scored
by its *current* value (any of its spellings counts as present) and its *stale* values (each must be
absent). Filler holds no digits and none of the value strings, so presence is unambiguous.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.fidelity_data import GENERAL, THEMES, Message
from proxy.tokens import count_message, count_messages

MIN_MESSAGE_TOKENS = 60
MAX_MESSAGE_TOKENS = 220
ROUND_TURNS = 4  # user/assistant exchanges of new filler per round of continued conversation


@dataclass(frozen=True)
class ItemSpec:
    key: str
    kind: str  # one of LEDGER_KINDS
    safety: bool  # a safety rule or hard constraint: must be forwarded every time
    current: tuple[str, ...]  # any of these in the forwarded text: the current value is present
    stale: tuple[str, ...] = ()  # values an update replaced: each must be absent


@dataclass(frozen=True)
class Plant:
    at: float  # where it is said, as a share of the session's exchanges
    role: str
    text: str
    key: str  # the item it states or updates


@dataclass(frozen=True)
class Item:
    key: str
    kind: str
    safety: bool
    current: tuple[str, ...]
    stale: tuple[str, ...]
    stated_at: int  # message index of its first statement
    updated_at: tuple[int, ...]  # message indexes of its updates, in order


@dataclass(frozen=True)
class Session:
    script: str
    messages: list[Message]  # the history: user first, alternating, ending with an assistant message
    rounds: list[list[Message]]  # continued conversation after it, ROUND_TURNS exchanges per round
    items: list[Item]
    tokens: int  # count_messages(messages)


@dataclass(frozen=True)
class Filler:
    things: tuple[str, ...]
    user: tuple[str, ...]
    assistant: tuple[str, ...]


# --- the agent session's filler (the launch session uses fidelity_data's coding theme) --------------------

# fmt: off
AGENT = Filler(
    things=(
        "the orders handler", "the session middleware", "the invoice renderer", "the webhook receiver",
        "the settings module", "the test helpers", "the logging calls", "the error messages", "the database layer",
        "the cache wrapper", "the admin views", "the serializer", "the rate limiter", "the docs folder",
        "the import paths", "the date parsing",
    ),
    user=(
        "Can you look at {x} next and tell me what you find?",
        "Before you touch {x}, read how {y} uses it.",
        "I don't like how {x} turned out, can you simplify it?",
        "Run the whole test suite again after the change to {x}.",
        "Leave {x} alone for now, we will come back to it.",
        "Please explain what {x} does before changing anything in it.",
        "Why did the change to {x} also touch {y}?",
        "Show me the diff for {x} when you are done.",
        "That looks fine, go ahead with {x}.",
        "I think {x} has the same bug as {y}, can you check?",
        "Keep the change to {x} small, I want to review it in one sitting.",
        "Is {x} covered by any test at all?",
        "Rename things in {x} only where the names are actually misleading.",
        "Write down what you learned about {x} in the pull request description.",
    ),
    assistant=(
        "I read through {x}; the logic is spread over several helpers that each do a little.",
        "The tests around {x} pass locally after the change.",
        "I left {y} untouched, the change to {x} did not need it.",
        "There was a leftover debug print in {x}, I removed it.",
        "I found that {x} swallows an exception, so failures there were silent.",
        "The diff for {x} is small: one function moved and two call sites updated.",
        "I added a test that reproduces the problem in {x} before fixing it.",
        "{x} and {y} share a helper, so I changed both in the same commit.",
        "I checked {x} against the documentation and they now agree.",
        "Nothing in {x} depends on {y}, so the two can be reviewed separately.",
        "I simplified {x} by removing a branch that could never be taken.",
        "The failure in {x} came from a stale fixture, which I regenerated.",
        "I wrote a short note on {x} in the pull request description.",
        "Running the suite twice in a row gives the same result now, including {x}.",
    ),
)
CODING = Filler(THEMES["coding"]["things"], THEMES["coding"]["user"], THEMES["coding"]["assistant"])

# --- the scripts -------------------------------------------------------------------------------------------

LAUNCH_ITEMS = (
    ItemSpec("push main", "rule", True, ("straight to main",)),
    ItemSpec("push release", "rule", True, ("direct pushes to release branches",)),
    ItemSpec("secrets", "rule", True, ("API keys or passwords",)),
    ItemSpec("commit language", "rule", False, ("commit messages in English",)),
    ItemSpec("cloud budget", "constraint", True, ("five hundred dollars", "$500"), ("$800",)),
    ItemSpec("marketing budget", "constraint", True, ("$5k",)),
    ItemSpec("travel budget", "constraint", True, ("$1,400",)),
    ItemSpec("data residency", "constraint", True, ("EU regions",)),
    ItemSpec("units", "preference", False, ("metric units",)),
    ItemSpec("answer style", "preference", False, ("plain paragraphs",), ("bullet points",)),
    ItemSpec("time zone", "preference", False, ("Lisbon time",)),
    ItemSpec("pilot goal", "goal", False, ("forty paying customers",)),
    ItemSpec(
        "oauth", "goal", False, ("rolling it out to staging",), ("waiting on the security review", "stuck on the vendor SDK")
    ),
    ItemSpec("database", "decision", False, ("SQLite",), ("PostgreSQL",)),
    ItemSpec("demo date", "decision", False, ("twenty-eighth of March", "28 March"), ("14 March", "21 March")),
    ItemSpec("cadence", "decision", False, ("every two weeks",)),
    ItemSpec("staging host", "name", False, ("stg-eu-west-07",)),
    ItemSpec("vendor contact", "name", False, ("Baptiste Moreau",), ("Ingrid Solberg",)),
    ItemSpec("web codename", "name", False, ("Bluefin",)),
    ItemSpec("mobile codename", "name", False, ("Marlin",)),
)
LAUNCH_PLANTS = (
    Plant(0.02, "user", "Internally we call the web project Bluefin, so if you see that name anywhere, that's us.", "web codename"),
    Plant(0.04, "user", "One ground rule before we start: nobody pushes straight to main, every change goes through a reviewed pull request.", "push main"),
    Plant(0.06, "user", "The goal for the pilot is simple, forty paying customers by the end of the quarter.", "pilot goal"),
    Plant(0.09, "user", "Finance gave us a hard cap for the pilot: cloud spend stays below $800 a month, and I'd rather we never get near it.", "cloud budget"),
    Plant(0.11, "user", "For the record, the staging host is stg-eu-west-07 and it is the only machine we deploy to by hand.", "staging host"),
    Plant(0.13, "user", "Small thing, but please give me every estimate in metric units, I can't picture feet and inches.", "units"),
    Plant(0.16, "user", "The big item this quarter is moving our login to OAuth; right now we are waiting on the security review before anyone can start.", "oauth"),
    Plant(0.18, "user", "The marketing budget for the launch is $5k, all in, agency included.", "marketing budget"),
    Plant(0.20, "user", "Our contact at the payments vendor is Ingrid Solberg, loop her in on anything about webhooks.", "vendor contact"),
    Plant(0.23, "user", "Separately, the travel budget for the team offsite is $1,400 and that one is not negotiable either.", "travel budget"),
    Plant(0.27, "user", "We settled the database question in the meeting, PostgreSQL for the new billing service.", "database"),
    Plant(0.30, "user", "Same story for the release branches, by the way: no direct pushes to release branches either, not even for a one-line hotfix.", "push release"),
    Plant(0.33, "user", "The customer demo is booked for 14 March, so plan backwards from that.", "demo date"),
    Plant(0.36, "user", "When you summarise options for me I like short bullet points, I skim a lot.", "answer style"),
    Plant(0.38, "user", "Commit messages in English, please, even though half the team writes Portuguese in chat.", "commit language"),
    Plant(0.41, "user", "We also agreed to ship every two weeks instead of the big monthly drops.", "cadence"),
    Plant(0.46, "user", "Legal was very clear with us: customer data must stay in EU regions, nothing gets replicated anywhere else.", "data residency"),
    Plant(0.49, "user", "The mobile app has its own codename, Marlin, don't mix the two up.", "mobile codename"),
    Plant(0.53, "user", "When you mention times, use Lisbon time, that is where most of the team sits.", "time zone"),
    Plant(0.56, "user", "Status on OAuth: security signed it off, so that is no longer the blocker, but we're stuck on the vendor SDK, which can't refresh tokens yet.", "oauth"),
    Plant(0.59, "user", "The demo slipped a week, the customer now wants it on 21 March.", "demo date"),
    Plant(0.63, "user", "Quick update from the finance call: keep the cloud bill under five hundred dollars a month from now on, they cut everyone's numbers.", "cloud budget"),
    Plant(0.67, "user", "The payments people reshuffled their account team; from now on we deal with Baptiste Moreau over there.", "vendor contact"),
    Plant(0.71, "user", "Change of plan on storage: billing will run on SQLite for the pilot, and we revisit after launch.", "database"),
    Plant(0.74, "user", "Never paste API keys or passwords into tickets or chat, use the vault links instead.", "secrets"),
    Plant(0.79, "user", "Actually, drop the lists: I paste your replies into emails now, so write plain paragraphs instead.", "answer style"),
    Plant(0.86, "user", "Good news, the SDK fix shipped, so the login migration is unblocked and Marisol is rolling it out to staging this week.", "oauth"),
    Plant(0.89, "user", "Final word on the demo: the twenty-eighth of March, the customer confirmed it in writing.", "demo date"),
)

AGENT_ITEMS = (
    ItemSpec("prod migrations", "rule", True, ("migrations against the production database",)),
    ItemSpec("vendor dir", "rule", True, ("under vendor/",)),
    ItemSpec("third party dir", "rule", True, ("under third_party/",)),
    ItemSpec("lint", "rule", False, ("linter before every commit",)),
    ItemSpec("python floor", "constraint", True, ("Python 3.11",), ("Python 3.9",)),
    ItemSpec("dependencies", "constraint", True, ("no new dependencies",)),
    ItemSpec("ci memory", "constraint", True, ("eight gigabytes", "8 GB"), ("4 GB",)),
    ItemSpec("test style", "preference", False, ("plain pytest asserts",)),
    ItemSpec("type hints", "preference", False, ("type hints",)),
    ItemSpec("report style", "preference", False, ("what changed and what is next",)),
    ItemSpec(
        "task", "goal", False, ("CSV export",), ("find out why and fix it", "add pagination to the orders endpoint")
    ),
    ItemSpec("refactor plan", "goal", False, ("split the billing module",)),
    ItemSpec("http client", "decision", False, ("httpx",)),
    ItemSpec("retries", "decision", False, ("three attempts",), ("5 attempts",)),
    ItemSpec("old endpoint", "decision", False, ("end of June",)),
    ItemSpec("new module", "name", False, ("billing_sync.py",)),
    ItemSpec("staging db", "name", False, ("orders-stg-2",)),
    ItemSpec("branch", "name", False, ("feat/orders-v2",), ("feat/orders-pagination",)),
    ItemSpec("ticket", "name", False, ("PAY-4821",)),
    ItemSpec("reviewer", "name", False, ("Henrike",)),
)
AGENT_PLANTS = (
    Plant(0.03, "user", "Ground rules for this repo: never run the migrations against the production database, not even a dry run.", "prod migrations"),
    Plant(0.05, "user", "Current task: the checkout test is flaky, find out why and fix it.", "task"),
    Plant(0.08, "user", "Hard requirement, the code has to keep running on Python 3.9 because one customer is stuck on it.", "python floor"),
    Plant(0.10, "user", "Style-wise I want plain pytest asserts, not unittest classes.", "test style"),
    Plant(0.12, "user", "The staging database is orders-stg-2, the credentials are in the usual place.", "staging db"),
    Plant(0.15, "user", "And no new dependencies without asking me first; every package needs a licence check.", "dependencies"),
    Plant(0.20, "user", "We're going with httpx for the new client code, not requests.", "http client"),
    Plant(0.23, "user", "Don't edit anything under vendor/, those files are generated and get overwritten.", "vendor dir"),
    Plant(0.27, "user", "Work on the branch feat/orders-pagination, I'll review from there.", "branch"),
    Plant(0.30, "user", "And type hints on every public function, please.", "type hints"),
    Plant(0.33, "user", "The flaky test is fixed and merged, nice. Next task: add pagination to the orders endpoint.", "task"),
    Plant(0.36, "user", "The CI runners only have 4 GB of memory, so the suite has to stay well under that.", "ci memory"),
    Plant(0.40, "assistant", "I've set the retry policy to exponential backoff with at most 5 attempts.", "retries"),
    Plant(0.44, "assistant", "Plan for the refactor: I'll split the billing module into smaller files and leave its public interface as it is.", "refactor plan"),
    Plant(0.48, "user", "The ticket for all of this is PAY-4821, mention it in every commit message.", "ticket"),
    Plant(0.51, "user", "Same goes for third_party: nothing under third_party/ gets edited, that copy is licence-audited.", "third party dir"),
    Plant(0.55, "user", "Keep your status reports short, just what changed and what is next.", "report style"),
    Plant(0.58, "assistant", "I'll name the new module billing_sync.py and put it next to the existing billing code.", "new module"),
    Plant(0.61, "user", "Good news, that customer finally upgraded, so our floor is Python 3.11 now and you can use the newer syntax.", "python floor"),
    Plant(0.64, "user", "Please move your work to the branch feat/orders-v2, the old one has a messy history.", "branch"),
    Plant(0.66, "user", "Run the linter before every commit, CI rejects whatever it flags.", "lint"),
    Plant(0.69, "user", "Let's lower the retries: three attempts is plenty, the upstream either recovers fast or not at all.", "retries"),
    Plant(0.72, "user", "Henrike owns the billing code, so she reviews anything you change there.", "reviewer"),
    Plant(0.76, "user", "Pagination is done. What's left is the CSV export, which waits until we agree on the column order.", "task"),
    Plant(0.81, "user", "They upgraded the runners over the weekend, the memory limit is eight gigabytes now.", "ci memory"),
    Plant(0.85, "user", "We keep the old endpoint alive until the end of June and remove it after that.", "old endpoint"),
)
# fmt: on
SCRIPTS: dict[str, tuple[Filler, tuple[ItemSpec, ...], tuple[Plant, ...]]] = {
    "launch": (CODING, LAUNCH_ITEMS, LAUNCH_PLANTS),
    "agent": (AGENT, AGENT_ITEMS, AGENT_PLANTS),
}
FULL_EXCHANGES = 130
QUICK_EXCHANGES = 45


# --- generation --------------------------------------------------------------------------------------------


def _sentences(rng: random.Random, filler: Filler, role: str, n: int) -> list[str]:
    patterns = [*rng.sample(getattr(filler, role), n - 1), rng.choice(GENERAL[role])]
    rng.shuffle(patterns)
    out = []
    for pattern in patterns:
        x, y = rng.sample(filler.things, 2)
        text = pattern.format(x=x, y=y, d="Thursday")
        out.append(text[0].upper() + text[1:])
    return out


def _message(rng: random.Random, filler: Filler, role: str, planted: list[str]) -> Message:
    """A filler message of MIN..MAX tokens with the ``planted`` sentences set in at random positions."""
    while True:
        sentences = _sentences(rng, filler, role, rng.randint(3, 6))
        for text in planted:
            sentences.insert(rng.randint(0, len(sentences)), text)
        message = {"role": role, "content": " ".join(sentences)}
        if MIN_MESSAGE_TOKENS <= count_message(message) <= MAX_MESSAGE_TOKENS:
            return message


def _exchanges(rng: random.Random, filler: Filler, n: int, plants: dict[int, list[str]]) -> list[Message]:
    """``n`` user/assistant exchanges; ``plants`` maps a message index to the sentences planted there."""
    return [_message(rng, filler, "user" if i % 2 == 0 else "assistant", plants.get(i, [])) for i in range(2 * n)]


def generate(script: str, exchanges: int = FULL_EXCHANGES, rounds: int = 3, seed: int = 0) -> Session:
    """The ``script``'s session: ``exchanges`` user/assistant exchanges with its plants, then ``rounds`` rounds
    of ROUND_TURNS exchanges of filler."""
    filler, specs, plants = SCRIPTS[script]
    rng = random.Random(f"lcm-standing/{script}/{exchanges}/{seed}")
    placed: dict[int, list[str]] = {}
    at: dict[str, list[int]] = {}
    for plant in plants:
        exchange = min(exchanges - 1, max(0, round(plant.at * exchanges) + rng.choice((-1, 0, 0, 1))))
        index = 2 * exchange + (plant.role == "assistant")
        placed.setdefault(index, []).append(plant.text)
        at.setdefault(plant.key, []).append(index)
    messages = _exchanges(rng, filler, exchanges, placed)
    items = [Item(s.key, s.kind, s.safety, s.current, s.stale, at[s.key][0], tuple(at[s.key][1:])) for s in specs]
    continued = [_exchanges(rng, filler, ROUND_TURNS, {}) for _ in range(rounds)]
    return Session(script, messages, continued, items, count_messages(messages))


def sessions(quick: bool, rounds: int, seed: int = 0) -> list[Session]:
    exchanges = QUICK_EXCHANGES if quick else FULL_EXCHANGES
    return [generate(script, exchanges, rounds, seed) for script in SCRIPTS]
