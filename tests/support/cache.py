"""Prompt-cache metrics of a sequence of requests: how much of each request repeats the previous one's prefix,
and what its input costs under Anthropic's and OpenAI's cache pricing.

A provider caches token prefixes, so both are measured on tokens (o200k, the proxy's own counter): a request
is serialised into a canonical token sequence, the tool schemas first, then each message as its role line and
its content (a string as it is, list content or tool calls as sorted JSON, any other field as sorted JSON
after it), messages separated by a fixed separator. Each message is encoded on its own, so a change in one
message never shifts the tokens of those before it.

Pricing assumptions, in "uncached-token equivalents" (1.0 = one input token at the normal price):

- **Anthropic**: the client puts a cache breakpoint at the end of every request, as Claude Code does. The
  prefix shared with the previous request is a cache read at 0.1x when it is at least 1,024 tokens (Claude
  Sonnet's and Opus's minimum cacheable length); the rest of the request is a cache write at 1.25x. A request
  shorter than 1,024 tokens is not cached at all and costs 1x. Anthropic looks cached prefixes up at content
  block boundaries, so a request that diverges inside a message may read less than this: for Anthropic the
  figure is a lower bound of what is billed.
- **OpenAI** (automatic caching, GPT-5 family prices): a prompt of at least 1,024 tokens whose prefix shared
  with the previous request is at least 1,024 tokens reads that prefix rounded down to a multiple of 128
  tokens from the cache at 0.1x; every other token costs 1x.
- The previous request is the only cache entry that counts (one conversation, requests minutes apart, within
  both providers' cache lifetime).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from proxy import tokens

SEPARATOR = "\n\n"
MIN_CACHED = 1024  # both providers: the shortest prefix they cache
OPENAI_STEP = 128  # OpenAI caches in increments of 128 tokens
CACHE_READ = 0.1
ANTHROPIC_WRITE = 1.25
PRICING_ASSUMPTIONS = (
    "Billed input is in uncached-token equivalents. Anthropic: a cache breakpoint at the end of every request"
    " (as Claude Code sets it); the prefix shared with the previous request is read from the cache at 0.1x when it"
    " is at least 1,024 tokens, the rest is written at 1.25x; a request under 1,024 tokens costs 1x (lower bound:"
    " Anthropic matches cached prefixes at content-block boundaries only). OpenAI (automatic caching, GPT-5"
    " prices): a shared prefix of at least 1,024 tokens in a prompt of at least 1,024 is read at 0.1x, rounded"
    " down to a multiple of 128 tokens; the rest costs 1x. The proxy's summariser prompts cost 1x (no cache)."
)

Segments = tuple[tuple[int, ...], ...]


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@lru_cache(maxsize=65536)
def _encode(text: str) -> tuple[int, ...]:
    encoding = tokens._encoding()  # the proxy's o200k, loaded offline from LiteLLM's bundled files
    assert encoding is not None, "tiktoken's o200k encoding is needed to measure token prefixes"
    return tuple(encoding.encode(text, disallowed_special=()))


def message_text(message: dict[str, Any]) -> str:
    """One message in the canonical form: its role line, its content, then its other fields as JSON."""
    content = message.get("content")
    text = content if isinstance(content, str) else "" if content is None else _json(content)
    rest = {k: v for k, v in message.items() if k not in ("role", "content")}
    extra = "\n" + _json(rest) if rest else ""
    return f"{message.get('role')}\n{text}{extra}{SEPARATOR}"


def serialise(body: dict[str, Any]) -> Segments:
    """A request body (``messages`` and optional ``tools``) as token segments: the tools, then each message."""
    head = [_encode("tools\n" + _json(body["tools"]) + SEPARATOR)] if body.get("tools") else []
    return (*head, *(_encode(message_text(m)) for m in body["messages"]))


def size(request: Segments) -> int:
    return sum(len(segment) for segment in request)


def common_prefix(a: Segments, b: Segments) -> int:
    """How many tokens ``b`` shares with the start of ``a``."""
    shared = 0
    for x, y in zip(a, b, strict=False):
        if x is y or x == y:
            shared += len(x)
            continue
        for s, t in zip(x, y, strict=False):
            if s != t:
                break
            shared += 1
        return shared
    return shared


def anthropic_billed(size: int, shared: int) -> float:
    """One request of ``size`` tokens whose first ``shared`` tokens repeat the previous request's."""
    if size < MIN_CACHED:
        return float(size)
    read = shared if shared >= MIN_CACHED else 0
    return CACHE_READ * read + ANTHROPIC_WRITE * (size - read)


def openai_billed(size: int, shared: int) -> float:
    cached = shared // OPENAI_STEP * OPENAI_STEP if size >= MIN_CACHED and shared >= MIN_CACHED else 0
    return CACHE_READ * cached + (size - cached)


@dataclass(frozen=True)
class CacheUse:
    """A sequence of requests, measured: each one's size and the tokens it shares with the previous one."""

    sizes: tuple[int, ...]
    shared: tuple[int, ...]  # the first request shares 0

    @classmethod
    def of(cls, requests: Sequence[Segments]) -> CacheUse:
        shared = [0, *(common_prefix(a, b) for a, b in itertools.pairwise(requests))]
        return cls(tuple(size(r) for r in requests), tuple(shared))

    @property
    def tokens(self) -> int:
        return sum(self.sizes)

    @property
    def repeated_share(self) -> float:
        """The share of all tokens that repeat the previous request's prefix (the first request counts 0)."""
        return sum(self.shared) / max(1, self.tokens)

    @property
    def extending(self) -> int:
        """How many requests carry all of the previous request as their prefix."""
        return sum(1 for previous, shared in zip(self.sizes, self.shared[1:], strict=False) if shared == previous)

    @property
    def extending_share(self) -> float:
        return self.extending / max(1, len(self.sizes) - 1)

    def anthropic(self) -> float:
        return sum(anthropic_billed(n, s) for n, s in zip(self.sizes, self.shared, strict=True))

    def openai(self) -> float:
        return sum(openai_billed(n, s) for n, s in zip(self.sizes, self.shared, strict=True))
