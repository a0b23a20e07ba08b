"""Secret redaction, in one place: what a model is shown, what is stored, what an error or a log line says.

Two functions:

* ``redact_secrets(text)`` masks anything shaped like a credential: the token formats of a maintained secret
  scanner (Yelp's detect-secrets: its regex plugins' ``denylist`` patterns), the formats it lacks (each
  named below), private-key blocks, credentials in URLs, ``name = value`` assignments to secret-sounding
  names and prose such as "the password is X". Key names, URL schemes and hosts are kept.
* ``redact_credentials(text, credentials)`` also masks *known* values: the credentials a call carried and
  those in the proxy's environment, exactly and as partial echoes ("sk-upstr**********6789"). The upstream
  error boundary and the log formatter use it.

Every pattern stays linear on hostile input (megabytes of base64, runs of one prefix repeated):
``tests/test_redaction.py`` runs each rule over such input. detect-secrets is imported on first use (about
0.1 s), never at module import.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Callable, Iterable
from typing import Any

MARKER = "[REDACTED]"
KNOWN_MARKER = "[redacted]"  # a known credential value (the call's key, an environment key) was masked here

Rule = Callable[[str], str]

# --- detect-secrets ----------------------------------------------------------------------------------------

# The detect-secrets regex plugins used as they are. Left out, each for a reason:
# * JwtTokenDetector, OpenAIDetector, NpmDetector, BasicAuthDetector: quadratic on hostile input ("eyJ" or
#   "sk-" repeated thousands of times, a line of "//"); JWTs, OpenAI keys and npm tokens have linear rules
#   of ours below, and credentials in URLs are masked keeping the host.
# * CloudantDetector, IbmCloudIamDetector, IbmCosHmacDetector, SoftlayerDetector: "name = value" assignment
#   patterns whose " *", " +", " *" backtrack quadratically on runs of spaces; the assignment rule below
#   covers every secret-sounding name.
# * PrivateKeyDetector matches the BEGIN line only; the block rules below mask the whole key (PEM, PGP, PuTTY).
# * IPPublicDetector: an IP address is no credential, and summaries need them. KeywordDetector and the
#   high-entropy plugins are not regex plugins (and flag hashes and ids, which summaries need).
DETECT_SECRETS_PLUGINS = (
    ("artifactory", "ArtifactoryDetector"),
    ("aws", "AWSKeyDetector"),
    ("azure_storage_key", "AzureStorageKeyDetector"),
    ("discord", "DiscordBotTokenDetector"),
    ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"),
    ("mailchimp", "MailchimpDetector"),
    ("pypi_token", "PypiTokenDetector"),
    ("sendgrid", "SendGridDetector"),
    ("slack", "SlackDetector"),
    ("square_oauth", "SquareOAuthDetector"),
    ("stripe", "StripeDetector"),
    ("telegram_token", "TelegramBotTokenDetector"),
    ("twilio", "TwilioKeyDetector"),
)

# detect-secrets patterns find a secret but may cover only its first part (Stripe's matches 24 characters;
# current keys are longer): the rest of the token goes too, up to a bound that keeps the rule linear.
_TOKEN_TAIL = re.compile(r"[A-Za-z0-9_\-+/=]{0,512}")
_EDGE = " \t\r\n\"'=:"  # separators some patterns include around the secret (Artifactory's)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")  # a name some patterns include ("AccountKey="): it is kept


def _replace_spans(text: str, spans: list[tuple[int, int]], marker: str = MARKER) -> str:
    """``text`` with each span (overlapping ones merged) replaced by ``marker``."""
    if not spans:
        return text
    out: list[str] = []
    position = 0
    for start, end in sorted(spans):
        if end <= position:
            continue  # inside the span just replaced
        if start < position:
            position = end  # overlaps it: extend the replacement
            continue
        out += [text[position:start], marker]
        position = end
    out.append(text[position:])
    return "".join(out)


def _detector_rule(pattern: re.Pattern[str]) -> Rule:
    """A detect-secrets pattern as a rule: its groups (the secret, where it has groups) or its match (less
    the separators it includes), extended to the end of the token, become the marker."""

    def apply(text: str) -> str:
        spans: list[tuple[int, int]] = []
        for match in pattern.finditer(text):
            found = [match.span(g) for g in range(1, pattern.groups + 1) if match.group(g)]
            if not found:
                start, end = match.span()
                while start < end and text[start] in _EDGE:
                    start += 1
                name = _NAME.match(text, start, end)
                start = name.end() if name else start
                while end > start and text[end - 1] in _EDGE:
                    end -= 1
                found = [(start, end)]
            spans += [(start, m.end()) for start, end in found if (m := _TOKEN_TAIL.match(text, end))]
        return _replace_spans(text, spans)

    return apply


def _detect_secrets_rules() -> list[Rule]:
    rules: list[Rule] = []
    for module, name in DETECT_SECRETS_PLUGINS:
        plugin: Any = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        rules += [_detector_rule(pattern) for pattern in plugin.denylist]
    return rules


# --- our own rules -----------------------------------------------------------------------------------------


def _sub(pattern: str | re.Pattern[str], replacement: str | Callable[[re.Match[str]], str] = MARKER) -> Rule:
    compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
    return functools.partial(compiled.sub, replacement)


_SECRET_NAME = r"(?:api[_-]?key|apikey|access[_-]?key|secret|token|passw(?:or)?d|authorization|credentials?)"
# Annotations like `token: str` are code, not secrets; `token: str = "..."` still has its value redacted.
_TYPE_WORD = r"(?:optional\[|[&*]\s*)?(?:str|int|bool|bytes|string|number|boolean|float|none|null|any|secretstr)\b"
_ASSIGNMENT = re.compile(
    rf"\b((?:[\w.-]{{0,40}}?{_SECRET_NAME}|(?:[\w.-]{{0,40}}[_.-])?key)[\"']?(?:\s*:\s*{_TYPE_WORD}\]?)?\s*[:=]\s*)"
    rf"(?!{_TYPE_WORD}|\[redacted\])(?:(?:bearer|basic|token)\s+)?(\"[^\"\n]*\"|'[^'\n]*'|[^\s'\",;]+)",
    re.I,
)


# Every assignment names one of these: texts without any skip the (slower) assignment pattern.
_ASSIGNMENT_HINT = re.compile(r"key|secret|token|passw|authorization|credential", re.I)


def _mask_value(match: re.Match[str]) -> str:
    """Group 1 (the name and its verb or sign) kept; group 2 (the value) masked, keeping its quotes."""
    quote = match.group(2)[0] if match.group(2)[0] in "\"'" else ""
    return f"{match.group(1)}{quote}{MARKER}{quote}"


def _hinted(pattern: re.Pattern[str], hint: re.Pattern[str]) -> Rule:
    """``pattern``'s values masked, on texts where the cheap ``hint`` finds a name it needs at all."""

    def apply(text: str) -> str:
        return pattern.sub(_mask_value, text) if hint.search(text) else text

    return apply


# Prose: "the password is hunter2", "my API key was X", "the access token is now X". The word after the verb
# is kept when it is ordinary English ("the token is invalid", "the password is too short").
_PROSE_NAME = (
    r"pass(?:word|wd|phrase)|(?:api|access|secret)[ _-]?key|apikey|secret|credentials?"
    r"|(?:(?:access|auth|api|bearer|refresh|session)[ _-]?)?token"
)
_NOT_A_SECRET = (
    "a|an|the|this|that|it|not|no|now|then|still|also|only|just|always|never|usually|too|very|being|been|"
    "valid|invalid|expired|missing|required|optional|wrong|incorrect|correct|empty|blank|null|none|unset|set|"
    "stored|saved|kept|hidden|redacted|masked|used|needed|sent|passed|read|loaded|generated|created|checked|"
    "validated|verified|encrypted|hashed|rotated|revoked|changed|updated|reset|provided|shown|given|same|"
    "different|in|on|at|for|from|to|of|by|with|and|or|as|here|there|below|above|case|ok|fine|good|bad|weak|"
    "strong|long|short|what|why|how|where|when|which|who|your|my|our|their|his|her|its"
)
_PROSE = re.compile(
    # "the password is X", "the password for the prod database is X" (up to five words between), "password's X"
    rf"\b((?:{_PROSE_NAME})(?:\s+(?:for|of|to|on)(?:\s+[\w.-]+){{1,5}}?)?(?:'s|\s+(?:is|was|are|were))"
    rf"(?:\s+(?:now|set\s+to))?:?\s+)"
    rf"(?!(?:{_NOT_A_SECRET})\b|\[)(\"[^\"\n]{{1,200}}\"|'[^'\n]{{1,200}}'|[^\s'\"]*[^\s'\".,;:!?)\]])",
    re.I,
)


_PROSE_HINT = re.compile(r"pass|key|secret|credential|token", re.I)
_assignments = _hinted(_ASSIGNMENT, _ASSIGNMENT_HINT)
_prose = _hinted(_PROSE, _PROSE_HINT)


def _leading_rules() -> list[Rule]:
    return [
        # A key block cut off by an excerpt or the cap has no END line: redact to the end of the text. PEM
        # ("-----BEGIN RSA PRIVATE KEY-----") and PGP ("-----BEGIN PGP PRIVATE KEY BLOCK-----") blocks.
        _sub(
            re.compile(
                r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
                r"(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|.*)",
                re.S,
            )
        ),
        # A tail excerpt may start inside a key block. The lookbehind anchors the match at the start of a run,
        # which keeps this linear on long base64 runs.
        _sub(r"(?<![A-Za-z0-9+/=\s])[A-Za-z0-9+/=\s]{16,}-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"),
        # PuTTY private keys: everything from the header on is the key (its lines carry no END marker).
        _sub(re.compile(r"PuTTY-User-Key-File-\d+:.*", re.S)),
    ]


def _own_token_rules() -> list[Rule]:
    """Formats detect-secrets 1.5 lacks, or matches too narrowly. Each starts with its literal prefix (the
    regex engine then skips ahead to it) followed by a lookbehind that refuses a prefix inside a longer run
    of the token's characters: a prefix repeated through a long run is scanned once, not once per repeat."""
    return [
        # OpenAI and Anthropic ("sk-proj-…", "sk-ant-…"): detect-secrets knows only legacy keys ("T3BlbkFJ").
        _sub(r"sk-(?<![A-Za-z0-9_-]sk-)[A-Za-z0-9_-]{16,}"),
        # GitHub: fine-grained "github_pat_" tokens, and classic tokens of any length.
        _sub(r"gh[pousr]_(?<![A-Za-z0-9_]gh[pousr]_)[A-Za-z0-9]{20,}"),
        _sub(r"github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{20,}"),
        # Slack tokens without digit groups ("xoxb-…" of app-level and newer formats).
        _sub(r"xox[abprs]-(?<![A-Za-z0-9-]xox[abprs]-)[A-Za-z0-9-]{10,}"),
        # JWT: detect-secrets' pattern is quadratic on "eyJ" repeated and ends lazily (before the signature).
        _sub(r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"),
        # Google API keys ("AIza" and 35 more).
        _sub(r"AIza(?<![A-Za-z0-9_-]AIza)[0-9A-Za-z_-]{35}"),
        # npm access tokens outside an .npmrc line (detect-secrets only knows "//host/:_authToken=npm_…").
        _sub(r"npm_(?<![A-Za-z0-9_]npm_)[A-Za-z0-9]{36,}"),
        # Hugging Face access tokens.
        _sub(r"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z0-9]{30,}"),
        # DigitalOcean personal access, OAuth and refresh tokens: "dop_v1_", "doo_v1_", "dor_v1_" and 64 hex.
        _sub(r"do[opr]_v1_(?<![A-Za-z0-9_]do[opr]_v1_)[a-f0-9]{64,}"),
        # Databricks personal access tokens: "dapi", 32 hex, sometimes a "-2" style suffix.
        _sub(r"dapi(?<![A-Za-z0-9_]dapi)[a-f0-9]{32,}(?:-\d{1,3})?"),
        # Mailgun API keys: "key-" and 32 hex (also after a name such as "mailgun-key-…"); exactly 32, since
        # "key-" is no rare prefix and a longer run is a hash ("cache-key-" and a SHA-256), which summaries need.
        _sub(r"key-(?<![A-Za-z0-9]key-)[a-f0-9]{32}(?![A-Za-z0-9])"),
        # Square access tokens ("sq0atp-", 22 base64url characters) and OAuth secrets ("sq0csp-", 43; the
        # detect-secrets pattern wants exactly 43).
        _sub(r"sq0(?:atp|csp)-(?<![A-Za-z0-9_-]sq0atp-)(?<![A-Za-z0-9_-]sq0csp-)[A-Za-z0-9_-]{22,}"),
        # Shopify access tokens, shared secrets, custom-app and private-app tokens: a prefix and 32 hex.
        _sub(
            r"shp(?:at|ss|ca|pa)_(?<![A-Za-z0-9_]shpat_)(?<![A-Za-z0-9_]shpss_)(?<![A-Za-z0-9_]shpca_)"
            r"(?<![A-Za-z0-9_]shppa_)[a-fA-F0-9]{32,}"
        ),
    ]


def _trailing_rules() -> list[Rule]:
    return [
        _sub(re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{6,}", re.I), rf"\1 {MARKER}"),
        # user:password@ (or :password@, as redis://:pw@host has it); keep scheme and host
        _sub(r"\b([a-zA-Z][a-zA-Z0-9+.-]{0,30}://)[^\s/@:]*:[^\s/@]*@", rf"\1{MARKER}@"),
        _prose,
        _assignments,  # keeps the key name, and the quotes of a quoted value
    ]


@functools.cache
def rules() -> tuple[Rule, ...]:
    """Every rule, in order. The first call imports detect-secrets."""
    return (*_leading_rules(), *_detect_secrets_rules(), *_own_token_rules(), *_trailing_rules())


def redact_secrets(text: str) -> str:
    """Replace likely credentials with ``[REDACTED]``, keeping key names, URL schemes and hosts."""
    for rule in rules():
        text = rule(text)
    return text


# --- known credential values -------------------------------------------------------------------------------

MIN_KNOWN = 6  # shorter values are no credentials, and masking them would mangle ordinary words
MIN_ENVIRONMENT = 8
MIN_ECHO = 6  # a partial echo of a known credential is masked from this length on
# Names of environment variables LiteLLM (and the SDKs under it) read credentials from: OPENAI_API_KEY,
# ANTHROPIC_API_KEY, AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID, AWS_SESSION_TOKEN, AZURE_AD_TOKEN, HF_TOKEN,
# WATSONX_APIKEY, GOOGLE_APPLICATION_CREDENTIALS, DB_PASSWORD… ("PWD" alone is the working directory).
_CREDENTIAL_VARIABLE = re.compile(r"_(?:API_?KEY|KEY|KEY_ID|TOKEN|SECRET|PASSWORD|PASSWD|PWD|CREDENTIALS?)$", re.I)
_SCHEMES = frozenset({"bearer", "basic", "token"})
_ECHO_RUN = re.compile(rf"[^\s\"'`*…<>()\[\]{{}},;|]{{{MIN_ECHO},}}")


@functools.cache
def environment_credentials() -> frozenset[str]:
    """Values of the proxy's environment variables named like credentials (read once)."""
    return frozenset(
        value
        for name, value in os.environ.items()
        if _CREDENTIAL_VARIABLE.search(name) and len(value) >= MIN_ENVIRONMENT
    )


@functools.lru_cache(maxsize=256)
def _known(
    credentials: tuple[str, ...], environment: frozenset[str]
) -> tuple[tuple[str, ...], frozenset[str], frozenset[str]]:
    """Values to mask exactly (longest first); those whose partial echoes are masked too: single tokens,
    including each token of a short value such as ``Bearer sk-…`` (a JSON credentials file is masked whole);
    and their ``MIN_ECHO``-character pieces. Cached: a deployment's credentials are the same on every call."""
    exact: set[str] = set()
    echoed: set[str] = set()
    for value in (*credentials, *environment):
        if not isinstance(value, str) or len(value.strip()) < MIN_KNOWN:
            continue
        value = value.strip()
        exact.add(value)
        if len(value) > 512:
            continue
        for token in value.split():
            if len(token) >= MIN_KNOWN and token.lower() not in _SCHEMES:
                exact.add(token)
                echoed.add(token)
    grams = frozenset(token[i : i + MIN_ECHO] for token in echoed for i in range(len(token) - MIN_ECHO + 1))
    return tuple(sorted(exact, key=len, reverse=True)), frozenset(echoed), grams


def _echo_spans(text: str, echoed: frozenset[str], grams: frozenset[str]) -> list[tuple[int, int]]:
    """Runs of at least ``MIN_ECHO`` characters that are part of a known credential: what a provider shows
    of a rejected key ("sk-upstr**********6789"). A lowercase word ("stream" in "sk-upstream-…") is no echo:
    a random key rarely has one, and masking it would mangle ordinary messages."""
    if not grams:
        return []
    spans: list[tuple[int, int]] = []
    for run in _ECHO_RUN.finditer(text):
        i, end = run.start(), run.end()
        while i + MIN_ECHO <= end:
            if text[i : i + MIN_ECHO] not in grams:
                i += 1
                continue
            j = i + MIN_ECHO
            while j < end and any(text[i : j + 1] in token for token in echoed):
                j += 1
            piece = text[i:j]
            if not (piece.isalpha() and piece.islower()):
                spans.append((i, j))
                i = j
            else:
                i += 1
    return spans


def redact_credentials(text: str, credentials: Iterable[str] = ()) -> str:
    """``redact_secrets``, after masking the given credential values and the environment's, exactly and as
    partial echoes, with ``[redacted]``."""
    exact, echoed, grams = _known(tuple(credentials), environment_credentials())
    for value in exact:
        text = text.replace(value, KNOWN_MARKER)
    text = _replace_spans(text, _echo_spans(text, echoed, grams), KNOWN_MARKER)
    return redact_secrets(text)


_CREDENTIAL_PARAM = re.compile(r"key|token|secret|passw|credential|auth")


def credential_values(params: Any) -> list[str]:
    """The credential-looking values of a call's parameters (LiteLLM's ``litellm_params``): every string
    under a name with key/token/secret/password/credential in it, and every header value."""
    found: list[str] = []
    if isinstance(params, dict):
        for key, value in params.items():
            key_name = str(key).lower()
            if key_name in ("extra_headers", "headers") or _CREDENTIAL_PARAM.search(key_name):
                found += _strings(value)
    return found


def _strings(value: Any, depth: int = 0) -> list[str]:
    if isinstance(value, str):
        return [value]
    if depth > 8:
        return []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v, depth + 1)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v, depth + 1)]
    return []
