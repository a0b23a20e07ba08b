"""The corpus the deterministic reader was tuned on: statements, updates and near-duplicates the lexicon was
edited against until they passed (it went from 48 to 126 of 128 that way), so it is a regression guard and a
training set, not a measure of how the reader does on words it has not seen. That measure is the frozen set
(``tests/engine/standing/test_frozen_eval.py``, ``python -m bench standing-eval``).

It also runs extraction over every filler sentence of the benchmarks (``bench/fidelity_data.py`` and
``bench/standing_data.py``): ordinary work chat, which must give (almost) nothing."""

from __future__ import annotations

import itertools

import pytest

from bench.fidelity_data import GENERAL, THEMES
from bench.standing_data import AGENT
from proxy.engine.standing.ledger import Statement, extract, supersedes

OWNER = ("name", "decision")  # who owns or handles what: a name, or the decision that assigns it

STATEMENTS: list[tuple[str, str | tuple[str, ...]]] = [
    # rules: standing orders, imperatives with a habit, obligations, prohibitions
    ("Run the linter before every push.", "rule"),
    ("Squash your commits before every merge, please.", "rule"),
    ("Nobody deploys on a Friday afternoon.", "rule"),
    ("Nothing goes to production without a second reviewer.", "rule"),
    ("Every migration needs a rollback script.", "rule"),
    ("Hard rule: secrets never go into the repository.", "rule"),
    ("You have to write a regression test for every bug you fix.", "rule"),
    ("Don't commit generated files.", "rule"),
    ("Policy is that all external calls go through the gateway.", "rule"),
    ("Label every pull request with the component it touches.", "rule"),
    ("Commit messages should follow the conventional commits format.", "rule"),
    ("Changelog entries in the same pull request as the change, please.", "rule"),
    ("Always ask before deleting a database table.", "rule"),
    # constraints: limits, caps, deadlines, required versions
    ("Hard requirement: the service has to run on Node 18.", "constraint"),
    ("Total monthly spend on the analytics vendor must stay under $2,000.", "constraint"),
    ("The whole migration has to be finished by the 30th of April.", "constraint"),
    ("Page loads need to stay under two seconds on a mid-range phone.", "constraint"),
    ("The Docker image can't be bigger than 500 MB.", "constraint"),
    ("We only get 50 GB of disk on the build machines.", "constraint"),
    ("The contract caps us at 10,000 API calls a day.", "constraint"),
    ("The mobile app needs to support Android 12 at minimum.", "constraint"),
    ("Our hosting allowance is three thousand euros per quarter.", "constraint"),
    ("Support tickets must get a first reply within four hours.", "constraint"),
    ("The frontend budget is $3k for the quarter.", "constraint"),
    ("The backend budget is $4k for the quarter.", "constraint"),
    # preferences: how to answer or to work
    ("I'd like answers with code examples rather than long explanations.", "preference"),
    ("Use British spelling in anything customer-facing.", "preference"),
    ("Dates in ISO format, please.", "preference"),
    ("Please show amounts in euros, not dollars.", "preference"),
    ("I prefer squash merges over merge commits.", "preference"),
    ("Tables work better for me than bullet lists.", "preference"),
    ("When you give durations, use hours rather than days.", "preference"),
    ("Call me Jo, not Joanna.", "preference"),
    ("I want tests written with pytest fixtures, not setUp methods.", "preference"),
    ("Write to me in Dutch, please.", "preference"),
    ("When you talk about deadlines, use Tokyo time.", "preference"),
    # goals and task state
    ("Next task: migrate the cron jobs to the scheduler.", "goal"),
    ("What's left is the invoice PDF layout.", "goal"),
    ("Next up is the search page redesign.", "goal"),
    ("We're blocked on the design team's mockups.", "goal"),
    ("Still waiting on legal to approve the new terms.", "goal"),
    ("The plan is to move all reporting to the warehouse by summer.", "goal"),
    ("Our aim for this sprint is zero flaky tests.", "goal"),
    ("Your task for today: clean up the deprecated endpoints.", "goal"),
    ("I'm stuck on the certificate renewal, it keeps failing.", "goal"),
    ("The objective for the third quarter is to halve the support queue.", "goal"),
    # decisions
    ("We settled on Terraform for the infrastructure.", "decision"),
    ("Decided: the mobile release goes out every month.", "decision"),
    ("We're going with Tailwind for the new dashboard.", "decision"),
    ("Final word: the offsite is in Porto.", "decision"),
    ("Change of plan: the public API will be REST, not GraphQL.", "decision"),
    ("We keep the legacy importer until September.", "decision"),
    ("The kickoff is booked for 3 June.", "decision"),
    ("Agreed with the team that we release on Tuesdays.", "decision"),
    ("We picked Sentry for error tracking.", "decision"),
    # names and identifiers
    ("The ticket is ABC-12.", "name"),
    ("Dana owns the payments service.", OWNER),
    ("We call the internal admin tool Lighthouse.", "name"),
    ("The production cluster is called eu-prod-3.", "name"),
    ("The staging cluster is called eu-stg-1.", "name"),
    ("Our main point of contact at the bank is Rafael Ortiz.", "name"),
    ("The shared specs folder is /teams/platform/specs.", "name"),
    ("The release branch for this cycle is release/5.2.", "name"),
    ("Work on the branch fix/login-timeout.", "name"),
    ("The Sentry project is named web-frontend.", "name"),
    ("Our on-call alias is platform-oncall@example.com.", "name"),
    ("The new service will be called Ledgerly.", "name"),
    ("Henrik is responsible for the data pipeline.", OWNER),
]

UPDATES = [  # (old, new): the new one replaces the old, in other words, with a new value of the same type
    ("Hard requirement: the service has to run on Node 18.", "Node 20 is the minimum now, we dropped 18."),
    (
        "Total monthly spend on the analytics vendor must stay under $2,000.",
        "The analytics vendor bill has to come down to fifteen hundred dollars a month.",
    ),
    (
        "The whole migration has to be finished by the 30th of April.",
        "The migration deadline moved to the fifteenth of May.",
    ),
    ("The kickoff is booked for 3 June.", "The kickoff got pushed to 10 June."),
    pytest.param(
        "The Docker image can't be bigger than 500 MB.",
        "The image size limit is one gigabyte now.",
        marks=pytest.mark.xfail(strict=True, reason="'the image' unqualified vs 'the Docker image': kept apart"),
    ),
    ("We only get 50 GB of disk on the build machines.", "The build machines were upgraded to 200 GB of disk."),
    ("The ticket is ABC-12.", "Use ticket ABC-40 from now on, the old one was closed."),
    ("Work on the branch fix/login-timeout.", "Switch to the branch fix/login-timeout-v2 for the rest of this."),
    ("Dana owns the payments service.", "From now on Luis owns the payments service."),
    ("Our main point of contact at the bank is Rafael Ortiz.", "At the bank our contact is Mei Tanaka now."),
    ("We're going with Tailwind for the new dashboard.", "The new dashboard will use Bootstrap after all."),
    ("We settled on Terraform for the infrastructure.", "Change of plan: the infrastructure moves to Pulumi."),
    ("Final word: the offsite is in Porto.", "The offsite moved to Valencia."),
    ("Next task: migrate the cron jobs to the scheduler.", "Cron jobs are done; next task is the audit log."),
    ("We're blocked on the design team's mockups.", "The mockups arrived, so the redesign is unblocked."),
    ("The contract caps us at 10,000 API calls a day.", "The new contract allows 25,000 API calls a day."),
    (
        "Support tickets must get a first reply within four hours.",
        "First replies on support tickets are due within two hours now.",
    ),
    ("Call me Jo, not Joanna.", "Please call me Joanna after all."),
    ("Tables work better for me than bullet lists.", "Drop the tables, plain prose is easier to paste."),
    ("Don't commit generated files.", "You can commit the generated files again, the build needs them."),
    ("Nobody deploys on a Friday afternoon.", "Deploying on Friday afternoons is allowed again."),
    ("We keep the legacy importer until September.", "The legacy importer stays until the end of November."),
    (
        "Our hosting allowance is three thousand euros per quarter.",
        "The hosting budget got raised to €4,500 per quarter.",
    ),
    ("The production cluster is called eu-prod-3.", "The production cluster is eu-prod-4 since the migration."),
    ("Write to me in Dutch, please.", "Switch to English for your replies."),
]

APART = [  # (a, b): both stay, whichever comes later
    (
        "Total monthly spend on the analytics vendor must stay under $2,000.",
        "Our hosting allowance is three thousand euros per quarter.",
    ),
    ("The frontend budget is $3k for the quarter.", "The backend budget is $4k for the quarter."),
    ("The ticket is ABC-12.", "The release branch for this cycle is release/5.2."),
    ("Work on the branch fix/login-timeout.", "The release branch for this cycle is release/5.2."),
    ("Don't commit generated files.", "Never commit credentials."),
    ("Dana owns the payments service.", "Henrik is responsible for the data pipeline."),
    ("We call the internal admin tool Lighthouse.", "The new service will be called Ledgerly."),
    ("The production cluster is called eu-prod-3.", "The staging cluster is called eu-stg-1."),
    ("The kickoff is booked for 3 June.", "The whole migration has to be finished by the 30th of April."),
    ("Hard requirement: the service has to run on Node 18.", "The mobile app needs to support Android 12 at minimum."),
    ("The Docker image can't be bigger than 500 MB.", "We only get 50 GB of disk on the build machines."),
    ("The contract caps us at 10,000 API calls a day.", "Support tickets must get a first reply within four hours."),
    pytest.param(
        "We're blocked on the design team's mockups.",
        "Still waiting on legal to approve the new terms.",
        marks=pytest.mark.xfail(strict=True, reason="task status is one item: a new blocker replaces the old"),
    ),
    ("Run the linter before every push.", "Run the unit tests before every push."),
    ("We're going with Tailwind for the new dashboard.", "We picked Sentry for error tracking."),
    ("Please show amounts in euros, not dollars.", "Dates in ISO format, please."),
    ("I prefer squash merges over merge commits.", "Tables work better for me than bullet lists."),
    ("Our main point of contact at the bank is Rafael Ortiz.", "Dana owns the payments service."),
    ("Final word: the offsite is in Porto.", "The kickoff is booked for 3 June."),
]

CHAT = [  # said in passing: nothing to keep
    "Can you check why the nightly build is red?",
    "The migration script printed 42 warnings.",
    "I pushed a fix for the flaky test this morning.",
    "Looks good, thanks!",
    "Run the tests again.",
    "Show me the stack trace.",
    "The release branch had three merge conflicts yesterday.",
    "Our old CI bill was around $300 a month.",
    "Maria said the demo went well.",
    "I'm not sure the cache helps here.",
    "That took about four hours last time.",
    "Let me think about it over lunch.",
    "The ticket from last week is still open.",
    "Which branch are you on?",
    "It crashed twice on 3 June.",
]
ONE_OFF = [  # added after the rework, from a review of what it wrongly kept: one-off requests and history
    "Check the logs for every request that failed.",
    "Add a test for every edge case you can think of.",
    "The handler needs to return early here.",
    "I set the timeout to 30 seconds for this run.",
    "The server runs on Ubuntu 22.04.",
    "The build moved to GitHub Actions last year.",
]


def only(sentence: str) -> Statement:
    found = extract(sentence, "user")
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize(("sentence", "kind"), STATEMENTS)
def test_a_statement_is_extracted_with_its_kind(sentence: str, kind: str | tuple[str, ...]) -> None:
    found = only(sentence)
    assert found.kind in ((kind,) if isinstance(kind, str) else kind)
    assert found.slot.strip() and found.value.strip()


@pytest.mark.parametrize(("old", "new"), UPDATES)
def test_an_update_replaces_its_original(old: str, new: str) -> None:
    assert supersedes(only(new), only(old))
    assert only(new).value != only(old).value


@pytest.mark.parametrize(("a", "b"), APART)
def test_near_duplicates_stay_apart(a: str, b: str) -> None:
    assert not supersedes(only(b), only(a))
    assert not supersedes(only(a), only(b))


@pytest.mark.parametrize("sentence", [*CHAT, *ONE_OFF])
def test_chat_in_passing_is_no_statement(sentence: str) -> None:
    assert extract(sentence, "user") == []


def _filler() -> list[tuple[str, str]]:
    """Every filler sentence of both benchmarks, by role, with each of its theme's things filled in."""
    out: list[tuple[str, str]] = []
    themes = [(t["things"], t["user"], t["assistant"]) for t in THEMES.values()]
    for things, user, assistant in [*themes, (AGENT.things, AGENT.user, AGENT.assistant)]:
        for role, patterns in (("user", (*user, *GENERAL["user"])), ("assistant", (*assistant, *GENERAL["assistant"]))):
            for pattern, (x, y) in itertools.product(patterns, itertools.pairwise(things)):
                text = pattern.format(x=x, y=y, d="Thursday")
                out.append((role, text[0].upper() + text[1:]))
    return out


FILLER_BOUND = 15  # one template, "We're trying to keep {x} within the budget we set in spring", reads as a goal


def test_benchmark_filler_gives_nothing() -> None:
    filler = _filler()
    assert len(filler) > 2_000  # every pattern with many things: the bound is over a real population
    found = [(role, text) for role, text in filler if extract(text, role)]
    assert len(found) <= FILLER_BOUND, sorted(set(found))[:20]
