"""Seeded synthetic conversations with planted facts, for the fidelity benchmark (``bench/fidelity.py``).

A conversation is about one project (a service migration, a trip, a renovation): user and assistant turns
of ordinary work chat, 60-150 tokens each, with facts planted in user messages spread evenly over the
history — a name, a quantity with its unit, a date or time, an identifier, a preference. Each fact comes
with a question in other words that shares exactly one content word (its ``cue``) with the sentence that
stated it, as a real user would ask it much later, and with the exact answer string, which occurs exactly
once in the whole history (never in filler, in another fact or in a question). Filler holds no digits, so
numbers cannot collide.

Everything is derived from the seed: the same seed and size give the same conversation on every machine.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.tokens import count_message, count_messages

Message = dict[str, Any]

MIN_MESSAGE_TOKENS = 60
MAX_MESSAGE_TOKENS = 150

# --- facts ---------------------------------------------------------------------------------------------------

# fmt: off
NAMES = (
    "Ingrid", "Thorvald", "Marisol", "Anneliese", "Baptiste", "Ottilie", "Leopold", "Zuzana", "Ignatius",
    "Rosalind", "Evander", "Henrike", "Casimir", "Philippa", "Svetlana", "Benedikt", "Oriane", "Radomir",
    "Wilhelmina", "Lysander", "Perpetua", "Ansgar", "Clementine", "Faustina", "Gunnhild", "Hyacinth",
)
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
    "November", "December",
)
# fmt: on
WORDS = ("amber", "basalt", "cobalt", "delta", "ember", "fjord", "granite", "harbor", "juniper", "kestrel")


@dataclass(frozen=True)
class Value:
    """A drawn value: the exact answer string and the spellings accepted in a model's reply."""

    answer: str
    accept: tuple[str, ...]


def _name(rng: random.Random) -> Value:
    name = rng.choice(NAMES)
    return Value(name, (name,))


def _quantity(low: float, high: float, decimals: int, unit: str) -> Callable[[random.Random], Value]:
    def draw(rng: random.Random) -> Value:
        number = f"{rng.uniform(low, high):.{decimals}f}"
        return Value(f"{number} {unit}", (f"{number} {unit}", f"{number}{unit}", number))

    return draw


def _date(rng: random.Random) -> Value:
    day, month = rng.randint(2, 28), rng.choice(MONTHS)
    suffix = "nd" if day in (2, 22) else "rd" if day in (3, 23) else "th"
    return Value(
        f"{day} {month}",
        (f"{day} {month}", f"{month} {day}", f"{day}{suffix} {month}", f"{day}{suffix} of {month}"),
    )


def _time(rng: random.Random) -> Value:
    text = f"{rng.randint(6, 21)}:{rng.choice(('05', '15', '20', '35', '40', '50'))}"
    return Value(text, (text,))


def _pattern(template: str) -> Callable[[random.Random], Value]:
    """``#`` a digit, ``?`` a hex digit, ``@`` an upper-case letter, ``{w}`` a word."""

    def draw(rng: random.Random) -> Value:
        out = template.replace("{w}", rng.choice(WORDS))
        out = re.sub("#", lambda _: rng.choice("123456789"), out)
        out = re.sub(r"\?", lambda _: rng.choice("0123456789abcdef"), out)
        out = re.sub("@", lambda _: rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ"), out)
        return Value(out, (out,))

    return draw


def _choice(*options: str) -> Callable[[random.Random], Value]:
    def draw(rng: random.Random) -> Value:
        option = rng.choice(options)
        return Value(option, (option,))

    return draw


@dataclass(frozen=True)
class FactTemplate:
    kind: str
    cue: str  # the one content word the question shares with the statement
    statement: str  # ``{v}`` is replaced by the drawn answer
    question: str
    value: Callable[[random.Random], Value]


# fmt: off
TEMPLATES = (
    FactTemplate("name", "sister", "My sister's name is {v}, and she is visiting us in spring.", "What is my sister called?", _name),
    FactTemplate("name", "plumber", "The plumber who came round on Tuesday is called {v}.", "Remind me, who was our plumber?", _name),
    FactTemplate("name", "reviewer", "{v} from the platform team agreed to be the reviewer for this work.", "Which person did I say is our reviewer?", _name),
    FactTemplate("name", "guide", "Our hiking guide for the mountain day will be a woman named {v}.", "Who is the guide?", _name),
    FactTemplate("name", "landlord", "The landlord, {v}, wants to be told before anyone drills into the walls.", "What was the landlord called again?", _name),
    FactTemplate("name", "dentist", "I finally found a dentist I trust near the station, Dr {v}.", "Which dentist do I go to?", _name),
    FactTemplate("name", "cat", "We adopted a cat last week and the kids chose the name {v}.", "What is our cat called?", _name),
    FactTemplate("number", "boiler", "The engineer said the boiler should run at {v} when the heating is on.", "What pressure should the boiler have?", _quantity(1.1, 2.4, 1, "bar")),
    FactTemplate("number", "ceiling", "I measured the hallway again and the ceiling is {v} high.", "What was the ceiling height?", _quantity(2.3, 3.4, 2, "metres")),
    FactTemplate("number", "luggage", "The airline lets each of us check in {v} of luggage.", "What's the luggage allowance per person?", _quantity(18, 32, 0, "kg")),
    FactTemplate("number", "payments", "The payments provider throttles us at {v}.", "What rate limit does the payments API enforce?", _quantity(120, 900, 0, "requests per minute")),
    FactTemplate("number", "checkout", "Our latency goal for the checkout endpoint is {v} at the ninety-fifth percentile.", "How fast must checkout respond?", _quantity(140, 480, 0, "ms")),
    FactTemplate("number", "paint", "We need {v} of paint to cover the living room twice.", "How much paint should we buy?", _quantity(6, 19, 0, "litres")),
    FactTemplate("number", "cabin", "The drive from the airport to the cabin is {v} each way.", "How far away is the cabin?", _quantity(40, 260, 0, "km")),
    FactTemplate("date", "release", "We agreed the release goes out on {v}, not a day later.", "When do we ship the release?", _date),
    FactTemplate("date", "inspection", "The electrician booked the inspection for {v}.", "On what day is the inspection?", _date),
    FactTemplate("date", "anniversary", "Our anniversary is on {v}, so please keep that evening free.", "Which date is the anniversary?", _date),
    FactTemplate("date", "freeze", "The code freeze begins on {v} for everyone.", "When does the freeze start?", _date),
    FactTemplate("time", "flight", "Our flight leaves at {v} from the small terminal.", "What time does the flight depart?", _time),
    FactTemplate("time", "standup", "From now on the standup starts at {v} sharp.", "When is our daily standup?", _time),
    FactTemplate("time", "guesthouse", "Check-in at the guesthouse opens at {v}.", "What time can we arrive at the guesthouse?", _time),
    FactTemplate("id", "ticket", "I filed the crash as ticket {v} so we can track it.", "What was the ticket for that problem?", _pattern("OPS-####")),
    FactTemplate("id", "bucket", "The nightly exports now land in the bucket {v}.", "What's the bucket called?", _pattern("{w}-archive-????")),
    FactTemplate("id", "hotel", "The hotel booking reference is {v}, under my surname.", "What's our reservation code at the hotel?", _pattern("@@@###")),
    FactTemplate("id", "branch", "I pushed the half-finished work to the branch feature/{v}.", "Which branch has my changes?", _pattern("{w}-###")),
    FactTemplate("id", "commit", "The regression came in with commit {v}, I bisected it this morning.", "Which commit broke things?", _pattern("???????")),
    FactTemplate("id", "tiles", "The tiles were ordered under order number {v}.", "How can I track the tiles delivery?", _pattern("#######")),
    FactTemplate("preference", "units", "Please always give me figures in {v} units, I can't think in anything else.", "What units do I want?", _choice("metric", "imperial")),
    FactTemplate("preference", "repository", "In every repository I indent with {v}, never the other way.", "What whitespace style do I use in my repository?", _choice("tabs")),
    FactTemplate("preference", "tea", "In the afternoon I only drink {v} tea, no coffee.", "What kind of tea should be offered to me?", _choice("oolong", "rooibos", "jasmine")),
    FactTemplate("preference", "seat", "When I fly I always want an {v} seat, whatever the price.", "Which seat should be booked for me?", _choice("aisle")),
    FactTemplate("preference", "bedroom", "For the bedroom walls I want {v}, nothing darker.", "What colour did I pick for the bedroom?", _choice("sage green", "terracotta", "dusty blue")),
    FactTemplate("preference", "editor", "My editor of choice is {v} and I won't switch.", "Which editor do I use?", _choice("Neovim", "Emacs", "Helix")),
    FactTemplate("preference", "restaurants", "Only pick restaurants with {v} menus, I stopped eating meat.", "What should I keep in mind when choosing restaurants?", _choice("vegetarian", "vegan")),
)
# fmt: on
KINDS = ("name", "number", "date", "time", "id", "preference")


@dataclass(frozen=True)
class Fact:
    kind: str
    cue: str
    statement: str  # the sentence planted in a user message
    question: str  # asked as a new user message after the whole history
    answer: str  # occurs exactly once in the history (case-insensitive)
    accept: tuple[str, ...]  # spellings accepted in a model's reply (case-insensitive substrings)
    message_index: int  # where the statement was planted


@dataclass(frozen=True)
class Conversation:
    seed: int
    theme: str
    messages: list[Message]  # user first, alternating, ending with an assistant message
    facts: list[Fact]
    tokens: int  # count_messages(messages), tiktoken o200k


# --- filler --------------------------------------------------------------------------------------------------

# fmt: off
THEMES: dict[str, dict[str, tuple[str, ...]]] = {
    "coding": {
        "things": (
            "the retry logic", "the invoice worker", "the queue consumer", "the schema change", "the deploy script",
            "the feature flag", "the integration tests", "the logging setup", "the error handling", "the README",
            "the database indexes", "the health check", "the config loader", "the rollback plan", "the dashboards",
        ),
        "user": (
            "I looked at {x} again this morning and it still feels fragile.",
            "Could you help me think through {x} before we touch {y}?",
            "The team asked whether {x} is ready for review yet.",
            "I'm worried that {x} hides failures instead of reporting them.",
            "Yesterday {x} behaved differently on the staging box than on my laptop.",
            "My plan is to finish {x} first and only then look at {y}.",
            "Someone suggested we rewrite {x} from scratch, which sounds risky to me.",
            "I'd like {x} to be boring and predictable, even if it is a bit slower.",
            "We lost half a day on {x} because nobody wrote down how it works.",
            "Do you think {x} needs its own tests, or are the end-to-end ones enough?",
            "I keep going back and forth on whether {x} belongs in this change at all.",
            "The old cron job handled {x} implicitly, and now we have to make it explicit.",
            "On {d} I want to demo the new flow, including {x}.",
            "Honestly I don't fully understand why {x} was written this way.",
        ),
        "assistant": (
            "For {x}, I would start with a small failing test that shows the current behaviour.",
            "Keeping {x} separate from {y} makes both easier to review and to roll back.",
            "A simple approach is to log every decision {x} makes, with enough context to replay it.",
            "If {x} can fail halfway, make each step idempotent so a retry is always safe.",
            "I would not rewrite {x}; changing one piece at a time keeps the blast radius small.",
            "It helps to write down what {x} must guarantee before choosing how to implement it.",
            "Staging and laptops often differ in environment variables, so compare those first for {x}.",
            "Put {x} behind a switch so you can turn it off without a deploy if something looks wrong.",
            "End-to-end tests catch wiring mistakes, but {x} deserves fast unit tests of its own.",
            "Once {x} is stable, the work on {y} should be mostly mechanical.",
            "A short design note on {x} will save the next person the half day you lost.",
            "Review {x} with someone who owns the downstream consumers; they will spot surprises early.",
            "Measure before and after the change to {x}, otherwise it is hard to argue it helped.",
            "The demo on {d} will go smoother if {x} has a dry run the day before.",
        ),
    },
    "travel": {
        "things": (
            "the train connections", "the rental car", "the packing list", "the museum tickets", "the ferry crossing",
            "the hiking route", "the travel insurance", "the restaurant list", "the day trips", "the weather plan",
            "the currency exchange", "the itinerary", "the airport transfer", "the souvenir budget", "the photo spots",
        ),
        "user": (
            "I spent the evening reading about {x} and I'm a bit overwhelmed.",
            "Could you help me sort out {x} before we book {y}?",
            "My partner thinks {x} is overkill, but I'd rather be prepared.",
            "We still haven't decided anything about {x}.",
            "A friend told me {x} was the highlight of her trip last year.",
            "I'd like to keep {x} flexible in case the weather turns.",
            "Is it silly to plan {x} this far ahead?",
            "On {d} we have a free afternoon, maybe for {x}.",
            "The guidebook is vague about {x}, which makes me nervous.",
            "I want the kids to enjoy {x} without spending the whole day in transit.",
            "We argued about {x} at dinner and didn't reach a conclusion.",
            "I found a forum thread about {x}, but the advice is all over the place.",
            "Last time we travelled, {x} went badly and I want to avoid a repeat.",
            "Let's not overthink {x}; I mostly want a relaxed pace.",
        ),
        "assistant": (
            "For {x}, booking early usually gives more choice, and many options can still be cancelled.",
            "A relaxed pace works best if {x} leaves a free half day every few days.",
            "It makes sense to settle {x} first, because {y} depends on it.",
            "Local tourist offices are often more reliable than forums for {x}.",
            "Keep a paper copy of anything important about {x}, phones run out of battery at the worst moment.",
            "If the weather turns, an indoor alternative for {x} keeps the day from being lost.",
            "With children, shorter legs and regular breaks make {x} far more pleasant.",
            "Planning {x} ahead is not silly; it frees your attention for the trip itself.",
            "A shared list for {x} avoids the dinner-table arguments, everyone can add ideas in advance.",
            "The free afternoon on {d} is a good slot for {x}, since nothing else is fixed then.",
            "What went badly last time is a good checklist; write it down before planning {x}.",
            "Guidebooks age quickly, so confirm the details of {x} a week before you leave.",
            "Splitting {x} into must-do and nice-to-have items keeps the plan light.",
            "Once {x} is settled, {y} becomes a matter of picking dates.",
        ),
    },
    "home": {
        "things": (
            "the kitchen cabinets", "the bathroom floor", "the wiring in the hall", "the skip hire", "the window frames",
            "the radiators", "the worktop", "the shower tray", "the garden shed", "the loft insulation",
            "the lighting plan", "the tiling in the hall", "the building permit", "the skirting boards", "the front door",
        ),
        "user": (
            "I had another look at {x} and it's in worse shape than I thought.",
            "Could you help me decide about {x} before we order {y}?",
            "The builder wants to start with {x}, but I'm not convinced.",
            "We're trying to keep {x} within the budget we set in spring.",
            "My neighbour redid {x} last year and regrets some of the choices.",
            "I'd like to do {x} myself, at least the easy parts.",
            "Is it worth paying extra for {x} to be done properly?",
            "On {d} the house is empty, so that could be a good day for {x}.",
            "The quotes for {x} differ wildly and I don't know why.",
            "I keep changing my mind about {x}, which is slowing everything down.",
            "Dust from {x} got everywhere last weekend.",
            "We found something odd behind {x} when we opened it up.",
            "I want {x} finished before the cold weather arrives.",
            "The old owners clearly improvised with {x}.",
        ),
        "assistant": (
            "For {x}, ask each contractor what exactly their quote includes; the differences usually hide there.",
            "Starting with {x} makes sense only if {y} cannot be damaged by the work afterwards.",
            "Doing the easy parts of {x} yourself can save money, but leave anything structural to a professional.",
            "Photograph {x} before and during the work, it helps with later repairs and disputes.",
            "A dust sheet and a sealed doorway make a big difference when working on {x}.",
            "If you keep changing your mind about {x}, write down the two options and their costs side by side.",
            "An empty house on {d} is ideal for {x}, nobody has to work around the mess.",
            "Improvised work like that on {x} often hides older problems, so budget a little extra.",
            "Getting {x} done before the cold weather is realistic if materials are ordered now.",
            "Paying for {x} to be done properly is usually worth it where water or electricity is involved.",
            "What you found behind {x} should be looked at before it is closed up again.",
            "Order {x} early, lead times for anything custom tend to slip.",
            "Your neighbour's regrets about {x} are a cheap lesson, ask what they would change.",
            "Once {x} is settled, {y} can follow without holding anything up.",
        ),
    },
}
# fmt: on
GENERAL = {
    "user": (
        "Sorry for the long message, I wanted to get it all down while I remember.",
        "Let's keep going with the plan we made earlier.",
        "I'll check with the others and come back to this.",
        "Thanks for the patience, this is taking longer than I hoped.",
        "Nothing urgent, but I'd like your opinion.",
        "I think we're close, just a few loose ends left.",
    ),
    "assistant": (
        "That sounds like a sensible order of work.",
        "Happy to help; let me know how it goes.",
        "Nothing here needs to be decided today.",
        "It is normal for this part to take longer than expected.",
        "Writing down the decisions as you go will make the next steps easier.",
        "That is a reasonable worry, and it is easy to check.",
    ),
}
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
OPENERS = {
    "user": ("", "", "Quick update.", "Another thing.", "Okay, next topic.", "Back to the project."),
    "assistant": ("", "", "Good question.", "Understood.", "That makes sense.", "Sure."),
}
CONNECTORS = ("By the way, ", "Oh, and ", "Before I forget: ", "", "Also, ")
LOWER_AFTER_CONNECTOR = frozenset(("The", "Our", "My", "We", "In", "When", "For", "From", "Only", "Please", "Check-in"))


def _sentences(rng: random.Random, theme: str, role: str, n: int) -> list[str]:
    """``n`` different sentence patterns, mostly from the theme, each filled with the theme's things."""
    patterns = [*rng.sample(THEMES[theme][role], n - 1), rng.choice(GENERAL[role])]
    if rng.random() < 0.5:
        patterns.pop()
        patterns.append(rng.choice([p for p in THEMES[theme][role] if p not in patterns]))
    rng.shuffle(patterns)
    out = []
    for pattern in patterns:
        x, y = rng.sample(THEMES[theme]["things"], 2)
        out.append(pattern.format(x=x, y=y, d=rng.choice(DAYS)))
    return out


def _message(rng: random.Random, theme: str, role: str, planted: str | None = None) -> Message:
    """A message of MIN..MAX tokens; ``planted`` (a fact sentence) goes in at a random position."""
    while True:
        sentences = _sentences(rng, theme, role, rng.randint(3, 7))
        if planted is not None:
            connector = rng.choice(CONNECTORS)
            if connector and planted.split(" ", 1)[0] in LOWER_AFTER_CONNECTOR:
                planted = planted[0].lower() + planted[1:]
            sentences.insert(rng.randint(0, len(sentences)), connector + planted)
        opener = rng.choice(OPENERS[role])
        message = {"role": role, "content": " ".join(([opener] if opener else []) + sentences)}
        if MIN_MESSAGE_TOKENS <= count_message(message) <= MAX_MESSAGE_TOKENS:
            return message


def _pick_templates(rng: random.Random, n: int) -> list[FactTemplate]:
    """``n`` distinct templates, the kinds taken in turn so every kind is represented."""
    by_kind = {kind: [t for t in TEMPLATES if t.kind == kind] for kind in KINDS}
    for templates in by_kind.values():
        rng.shuffle(templates)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    picked: list[FactTemplate] = []
    while len(picked) < n:
        progress = False
        for kind in kinds:
            if by_kind[kind] and len(picked) < n:
                picked.append(by_kind[kind].pop())
                progress = True
        if not progress:
            raise ValueError(f"at most {len(TEMPLATES)} facts per conversation")
    rng.shuffle(picked)
    return picked


def occurrences(haystack: str, needle: str) -> int:
    return haystack.lower().count(needle.lower())


def _attempt(rng: random.Random, seed: int, target_tokens: int, n_facts: int) -> Conversation | None:
    theme = rng.choice(sorted(THEMES))
    messages: list[Message] = []
    total = 3
    while total < target_tokens - 20 * n_facts:  # a planted sentence adds ~20 tokens to its message
        for role in ("user", "assistant"):
            message = _message(rng, theme, role)
            messages.append(message)
            total += count_message(message)
    pairs = len(messages) // 2
    if n_facts > pairs:
        raise ValueError(f"{n_facts} facts do not fit in {pairs} user messages")
    facts: list[Fact] = []
    for i, template in enumerate(_pick_templates(rng, n_facts)):
        value = template.value(rng)
        statement = template.statement.format(v=value.answer)
        statement = statement[0].upper() + statement[1:]
        # Evenly spread: fact i lands somewhere in the i-th of n equal stretches of the history.
        pair = int((i + rng.uniform(0.1, 0.9)) * pairs / n_facts)
        messages[2 * pair] = _message(rng, theme, "user", planted=statement)
        facts.append(
            Fact(template.kind, template.cue, statement, template.question, value.answer, value.accept, 2 * pair)
        )
    text = "\n".join(str(m["content"]) for m in messages)
    questions = "\n".join(f.question for f in facts)
    for fact in facts:
        if occurrences(text, fact.answer) != 1 or occurrences(questions, fact.answer):
            return None  # a drawn value collides with another; draw again
    return Conversation(seed, theme, messages, facts, count_messages(messages))


def generate(seed: int, target_tokens: int, n_facts: int) -> Conversation:
    """A conversation of about ``target_tokens`` (its last pair may go a little over) with ``n_facts`` facts."""
    rng = random.Random(f"lcm-fidelity/{seed}/{target_tokens}/{n_facts}")
    for _ in range(100):
        conversation = _attempt(rng, seed, target_tokens, n_facts)
        if conversation is not None:
            return conversation
    raise RuntimeError(f"no collision-free conversation for seed {seed}")


STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "a about again all also an and any are as at be been before but by can could did do does each every for from"
        " get give go goes had has have how i in is it its just me my never no not now of on one only or our out"
        " please remind said say should so that the them then there they this to up us was we what when where which"
        " who whose why will with would you your",
    )
)


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2 and w not in STOPWORDS}


def shared_words(statement: str, question: str) -> set[str]:
    """Content words of the question that also occur in the statement (a shared stem of 4+ letters counts)."""
    said = content_words(statement)
    return {
        w
        for w in content_words(question)
        if any(w == s or (min(len(w), len(s)) >= 4 and (w.startswith(s) or s.startswith(w))) for s in said)
    }
