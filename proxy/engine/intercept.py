"""Interception at ingest: oversized content moves out of line, losslessly.

Three kinds of payload leave the message and go to content-addressed files:

* ``<file name=… mime=…>…</file>`` blocks (and pasted texts) of at least ``large_file_token_threshold``
  tokens, in string content or text parts: replaced in what is forwarded by an ``[LCM File: …]`` stub with
  an exploration summary, even in the fresh tail (one such paste would otherwise eat the whole budget). Of a
  pasted text only the paste is stored and stubbed: the user's words around it stay in place
  (``proxy.engine.paste``);
* tool results of at least ``tool_result_token_threshold`` tokens: stored now, forwarded raw until compaction
  is due (then swapped for their stub, which is prepared here), or stubbed at once when they are as large as
  a huge file;
* base64 payloads (``image_url`` data URLs, ``file.file_data``, ``input_audio.data``): stored once by
  content so that the database keeps a reference, not megabytes of base64; forwarded intact.

The stored original keeps, at each *recorded path*, a ``{"$lcm_segments": [...]}`` object whose text pieces
and file references join back into the exact original string. Only recorded paths are restored, so a client
that happens to send such an object elsewhere cannot confuse export.

What is forwarded is described as *patches* (path → replacement string) applied to the client's own
message object, which every request carries anyway: the database never needs a second copy of the payload.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy import tokens
from proxy.dialects import Dialect
from proxy.dialects.base import Path
from proxy.engine import paste
from proxy.engine.neutralise import neutralise
from proxy.types import Message

SEGMENTS_KEY = "$lcm_segments"
MIN_BASE64_CHARS = 1024

MAX_TAG_CHARS = 2048
CLOSE_TAG = "</file>"
ATTRIBUTE = re.compile(r"""([A-Za-z_][\w-]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?((?:;[\w-]+=[^;,]*)*);base64,", re.I)
MIME_EXTENSIONS = {
    "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp",
    "application/pdf": "pdf", "audio/wav": "wav", "audio/mpeg": "mp3",
}  # fmt: skip


@dataclass
class Payload:
    file_id: str
    data: bytes
    name: str
    mime: str
    kind: str  # file_block | pasted_text | tool_output | base64
    text: str | None  # the payload as text, for exploration; None for binary


@dataclass
class Interception:
    original: Message  # the client's message with segment objects at ``paths``
    paths: list[Path]
    forward_patches: list[tuple[Path, str]]  # applied to what is forwarded from now on
    compact_patches: list[tuple[Path, str]]  # applied too once compaction is due
    payloads: list[Payload] = field(default_factory=list)
    segments: list[list[Any]] = field(default_factory=list)  # beside ``paths``, same order
    payload_ids: set[str] = field(default_factory=set)  # of ``payloads``: one check per part, not one scan

    @property
    def changed(self) -> bool:
        return bool(self.paths)


Explorer = Callable[[Payload], Awaitable[str]]


def file_id_for(scope: str, data: bytes, name: str = "", mime: str = "") -> str:
    """The id of a stored payload: per tenant, content, name and type. The same bytes sent under another name
    are a record of their own, so one conversation never shows another's file name or exploration summary
    (the bytes on disk are still stored once per tenant)."""
    content = hashlib.sha256(data).hexdigest()
    return "file_" + hashlib.sha256(f"{scope}\x00{content}\x00{name}\x00{mime}".encode()).hexdigest()[:16]


def apply_patches(message: Message, patches: list[tuple[Path, str]]) -> Message:
    """``message`` with the stored stubs in place. Identity takes a string content and one text block holding
    it for the same message (``proxy.engine.canonical``), and a client may send it either way: patches stored
    for the block apply to the string once it is spelled as that block."""
    if not patches:
        return message
    out = copy.deepcopy(message)
    if isinstance(out.get("content"), str) and any(p[:2] == ["content", 0] for p, _ in patches):
        out["content"] = [{"type": "text", "text": out["content"]}]
    try:
        for path, value in patches:
            _set(out, path, value)
    except (KeyError, IndexError, TypeError):
        return message  # another shape than the stored one: forwarded as the client sent it
    return out


def _get(obj: Any, path: Path) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def _set(obj: Any, path: Path, value: Any) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def restore(original: Message, paths: list[Path], read_file: Callable[[str], bytes]) -> Message:
    """Rebuild the client's exact message from a stored original and its payload files."""
    out = copy.deepcopy(original)
    for path in paths:
        pieces: list[str] = []
        for segment in _get(out, path)[SEGMENTS_KEY]:
            if isinstance(segment, str):
                pieces.append(segment)
            else:
                data = read_file(segment["ref"])
                pieces.append(base64.b64encode(data).decode() if segment.get("encoding") == "base64" else data.decode())
        _set(out, path, "".join(pieces))
    return out


def stub_text(payload: Payload, exploration: str, tool_name: str | None = None) -> str:
    size = len(payload.data)
    if payload.kind == "tool_output":
        head = f"[LCM Tool Output: {payload.file_id} | tool={tool_name or 'unknown'} | {size} bytes]"
        what = "output"
    else:
        head = f"[LCM File: {payload.file_id} | {payload.name} | {payload.mime} | {size} bytes]"
        what = "content"
    return (
        f"{head}\nExploration Summary:\n{neutralise(exploration.strip())}\n"
        f'(Stored out of line by lcm-proxy. Call lcm_describe with id "{payload.file_id}" to read the full {what}.)'
    )


STUB_HEADS = ("[LCM File: file_", "[LCM Tool Output: file_")
STUB_HINT = '(Stored out of line by lcm-proxy. Call lcm_describe with id "file_'
MAX_HINT_TAIL = 200  # from the hint's id to its closing ".)"


def outside_stubs(text: str) -> str:
    """``text`` without the stubs in it (each from its ``[LCM …]`` head to the closing hint): the words a user
    wrote around a paste. One linear scan (a stub's exploration summary quotes the payload: what a search
    for the user's words must not read)."""
    pieces: list[str] = []
    position = 0
    while (head := text.find("[LCM ", position)) >= 0:
        if not text.startswith(STUB_HEADS, head):
            pieces.append(text[position : head + 5])
            position = head + 5
            continue
        hint = text.find(STUB_HINT, head)
        if hint < 0:
            break  # no stub closes after this point
        close = text.find(".)", hint + len(STUB_HINT), hint + len(STUB_HINT) + MAX_HINT_TAIL)
        if close < 0:  # not a hint after all: what follows it cannot close a stub either
            pieces.append(text[position : hint + len(STUB_HINT)])
            position = hint + len(STUB_HINT)
            continue
        pieces.append(text[position:head])
        position = close + 2
    pieces.append(text[position:])
    return "".join(pieces)


@dataclass(frozen=True)
class FileBlock:
    start: int  # of "<file"
    inner_start: int
    inner_end: int
    end: int  # after "</file>"
    attributes: str


def find_file_blocks(text: str) -> list[FileBlock]:
    """``<file …>…</file>`` blocks, in one linear scan (a regex with ``.*?`` is quadratic on hostile input
    such as thousands of unclosed ``<file>`` tags)."""
    blocks: list[FileBlock] = []
    position = 0
    while True:
        start = text.find("<file", position)
        if start < 0:
            return blocks
        after = start + 5
        closing = text.find(">", after, after + MAX_TAG_CHARS)
        if after >= len(text) or text[after] not in " \t\r\n>" or closing < 0 or "<" in text[after:closing]:
            position = after
            continue
        close = text.find(CLOSE_TAG, closing + 1)
        if close < 0:
            return blocks  # no closing tag anywhere after this point: no further block can close either
        blocks.append(FileBlock(start, closing + 1, close, close + len(CLOSE_TAG), text[after:closing]))
        position = close + len(CLOSE_TAG)


def _attributes(tag: str) -> dict[str, str]:
    return {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3) for m in ATTRIBUTE.finditer(tag)}


class Interceptor:
    def __init__(
        self, scope: str, large_threshold: int, tool_threshold: int, explore: Explorer, dialect: Dialect
    ) -> None:
        self.scope = scope
        self.dialect = dialect
        self.large = large_threshold
        self.tool = tool_threshold
        self.explore = explore

    def _payload(self, data: bytes, name: str, mime: str, kind: str, text: str | None) -> Payload:
        return Payload(file_id_for(self.scope, data, name, mime), data, name, mime, kind, text)

    async def intercept(self, message: Message, tool_names: Mapping[str, str]) -> Interception:
        result = Interception(original=message, paths=[], forward_patches=[], compact_patches=[])
        # Where a message keeps its text, tool output and encoded bytes is the dialect's to say.
        for site in self.dialect.payload_sites(message):
            value = _get(message, site.path)
            if site.kind == "text":
                await self._text(value, site.path, result)
            elif site.kind == "tool_result":
                await self._tool_result(value, site.path, site.replace or site.path, tool_names.get(site.name), result)
            else:
                self._base64(value, site.path, site.name, result, site.mime)
        if result.paths:
            original = copy.deepcopy(message)
            for path, segments in zip(result.paths, result.segments, strict=True):
                _set(original, path, {SEGMENTS_KEY: segments})
            result.original = original
        return result

    @staticmethod
    def _record(result: Interception, path: Path, segments: list[Any], payloads: list[Payload]) -> None:
        result.paths.append(path)
        result.segments.append([s for s in segments if s != ""])
        for payload in payloads:
            if payload.file_id not in result.payload_ids:
                result.payload_ids.add(payload.file_id)
                result.payloads.append(payload)

    async def _text(self, text: str, path: Path, result: Interception) -> None:
        if not tokens.at_least(text, self.large):
            return
        # The stored original keeps the <file> tags literally and refers to the inner text; what is
        # forwarded replaces the whole block, tags included, by the stub.
        segments: list[Any] = []
        forward: list[str] = []
        stored_at = forwarded_at = 0
        payloads: list[Payload] = []
        for block in find_file_blocks(text):
            inner = text[block.inner_start : block.inner_end]
            if not tokens.at_least(inner, self.large):
                continue
            attrs = _attributes(block.attributes)
            payload = self._payload(
                inner.encode(), attrs.get("name") or "file", attrs.get("mime") or "text/plain", "file_block", inner
            )
            payloads.append(payload)
            segments += [text[stored_at : block.inner_start], {"ref": payload.file_id}]
            forward += [text[forwarded_at : block.start], stub_text(payload, await self.explore(payload))]
            stored_at, forwarded_at = block.inner_end, block.end
        if payloads:
            segments.append(text[stored_at:])
            forward.append(text[forwarded_at:])
        else:
            # No block is big enough on its own, yet the whole text is huge: a paste without <file> tags. The
            # user's own words around it (a line before, a question after) stay in place, outside the stub.
            found = paste.find(text, paste.words_budget(self.large)) or paste.whole(text)
            inner = text[found.inner_start : found.inner_end]
            payload = self._payload(inner.encode(), found.name, "text/plain", "pasted_text", inner)
            payloads.append(payload)
            segments = [text[: found.inner_start], {"ref": payload.file_id}, text[found.inner_end :]]
            forward = [text[: found.start], stub_text(payload, await self.explore(payload)), text[found.end :]]
        self._record(result, path, segments, payloads)
        result.forward_patches.append((path, "".join(forward)))

    async def _tool_result(
        self, text: str, path: Path, replace: Path, tool_name: str | None, result: Interception
    ) -> None:
        if not tokens.at_least(text, self.tool):
            return
        payload = self._payload(text.encode(), f"{tool_name or 'tool'}-output.txt", "text/plain", "tool_output", text)
        self._record(result, path, [{"ref": payload.file_id}], [payload])
        stub = stub_text(payload, await self.explore(payload), tool_name)
        # The stub replaces the whole output (``replace``): a list of parts becomes one string.
        patch: tuple[Path, str] = (replace, stub)
        if tokens.at_least(text, self.large):
            result.forward_patches.append(patch)
        else:
            result.compact_patches.append(patch)

    def _base64(self, value: Any, path: Path, name: str, result: Interception, mime: str | None = None) -> None:
        if not isinstance(value, str) or len(value) < MIN_BASE64_CHARS:
            return
        match = DATA_URL.match(value)
        prefix = match.group(0) if match else ""
        if match and match.group(1):
            mime = match.group(1).lower()
        encoded = value[len(prefix) :]
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return  # not base64 after all: leave it inline
        if base64.b64encode(data).decode() != encoded:
            return  # non-canonical encoding (line breaks, ...): keep it inline so export stays exact
        mime = mime or "application/octet-stream"
        extension = MIME_EXTENSIONS.get(mime, "bin")
        if "." not in name:
            name = f"{name}.{extension}"
        payload = self._payload(data, name, mime, "base64", None)
        self._record(result, path, [prefix, {"ref": payload.file_id, "encoding": "base64"}], [payload])
