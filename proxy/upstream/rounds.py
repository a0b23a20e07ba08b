"""One round of a chat completion answer: its text, its tool calls, how it finished, what it cost.

The recall loop reads every upstream answer through a ``Round``, streamed (chunk by chunk, ``add``) or not
(``Round.from_response``), and so does the wire layer to keep what it relayed. Having one reader matters
because providers stream tool calls in different shapes, and each shape read wrongly did harm:

* OpenAI numbers parallel calls with ``index`` 0, 1, ... and sends the ``id`` with a call's first delta only.
* Some servers number every call 0, others send no ``index`` at all. Merged by index, two calls became one
  call named ``lcm_greplcm_describe``, which then reached the client as a tool call of its own. So a delta
  with an ``id`` not seen before starts a new call whatever its index says; a delta without an id continues
  the call last seen at its index, or else the latest call.
* A finish chunk may carry the round's last text (or a tool-call delta) as well as its ``finish_reason``.
* Some servers (MiniMax through NVIDIA NIM) send the id and the whole name again on every delta of a call:
  a name equal to the call's is not appended again. LM Studio sends every fragment of a call's arguments
  under a fresh id and no name: a delta without a name, at an index already seen, continues that call
  whatever its id (a delta without a name cannot start a call).

One rule holds for both paths: an answer whose calls cannot be told apart or cannot be run is malformed.
Two calls under one id (two entries of a JSON answer; streamed, a known id at another index, or naming
another function) and a call that ends without a function name are a 502, before any call is run or
relayed; streamed, when the delta that shows it arrives, or at choice 0's finish, so the client never gets
``finish_reason: tool_calls`` for a call it cannot make.

Only choice 0 is accumulated (the recall loop runs for one choice); every choice is checked. What the
upstream sent in a shape no reader can trust (an ``index`` of ``"x"``, a function name that is a number, a
choice that is not an object) is the upstream's fault: a 502 ``UpstreamError`` naming the upstream, code
``upstream_bad_stream`` for a stream (``check_chunk``, used by the SSE reader for every relayed chunk, and
``add``), ``upstream_bad_response`` for a JSON body. Never the proxy's 500. The error names the field that
was wrong, never what it held: the answer's content stays out of errors and logs.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import UpstreamError

DEFAULT_SOURCE = "the upstream provider"


class _Malformed(Exception):
    """A field of the upstream's answer in a shape it must not have; the message says which field."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise _Malformed(what)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(value: Any, kind: type, what: str) -> None:
    _require(value is None or isinstance(value, kind), what)


def _content_text(content: Any) -> str:
    """A message's content as text. A list of parts (some providers stream reasoning that way) gives its
    text parts; anything else that is not a string is malformed."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    _require(isinstance(content, list), "content that is neither a string nor a list of parts")
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return "".join(t for t in texts if isinstance(t, str))


def _check_tool_delta(tool_delta: Any) -> None:
    _require(isinstance(tool_delta, dict), "a tool call that is not an object")
    index = tool_delta.get("index")
    _require(index is None or _is_int(index), "a tool call index that is not an integer")
    _optional(tool_delta.get("id"), str, "a tool call id that is not a string")
    function = tool_delta.get("function")
    _optional(function, dict, "a tool call whose function is not an object")
    _optional((function or {}).get("name"), str, "a function name that is not a string")
    _optional((function or {}).get("arguments"), str, "function arguments that are not a string")


def _stream_choices(chunk: Any) -> list[dict[str, Any]]:
    """The chunk's choices, once every field a reader of a streamed chunk uses has the right shape."""
    _require(isinstance(chunk, dict), "an event that is not a JSON object")
    _optional(chunk.get("usage"), dict, "'usage' that is not an object")
    choices = chunk.get("choices")
    _optional(choices, list, "'choices' that is not a list")
    for choice in choices or []:
        _require(isinstance(choice, dict), "a choice that is not an object")
        _require(_is_int(choice.get("index", 0)), "a choice index that is not an integer")
        _optional(choice.get("finish_reason"), str, "a finish_reason that is not a string")
        delta = choice.get("delta")
        _optional(delta, dict, "a delta that is not an object")
        _optional((delta or {}).get("role"), str, "a role that is not a string")
        _content_text((delta or {}).get("content"))
        tool_calls = (delta or {}).get("tool_calls")
        _optional(tool_calls, list, "'tool_calls' that is not a list")
        for tool_delta in tool_calls or []:
            _check_tool_delta(tool_delta)
    return choices or []


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def bad_stream(source: str, what: str) -> UpstreamError:
    return UpstreamError(
        f"{_capital(source)} sent a malformed stream event: {what}.", status=502, code="upstream_bad_stream"
    )


def check_chunk(chunk: Any, source: str = DEFAULT_SOURCE) -> list[dict[str, Any]]:
    """A streamed chunk's choices; ``upstream_bad_stream`` when the chunk is malformed."""
    try:
        return _stream_choices(chunk)
    except _Malformed as error:
        raise bad_stream(source, str(error)) from None


class Round:
    def __init__(self, source: str = DEFAULT_SOURCE) -> None:
        """``source`` names the upstream in errors ("the upstream provider for model 'x' at http://...")."""
        self._source = source
        self._text: list[str] = []
        self._calls: list[dict[str, Any]] = []
        self._deltas: list[list[dict[str, Any]]] = []  # each call's tool-call deltas as received
        self._at_index: dict[int, int] = {}  # a delta's index -> the position of the call it last named
        self._first_index: list[int | None] = []  # each call's index in its first delta
        self._by_id: dict[str, int] = {}
        self.role: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None  # the last usage seen (providers that repeat it count up)

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def calls(self) -> list[dict[str, Any]]:
        """The tool calls in order, each ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
        return [{"id": c["id"], "type": "function", "function": dict(c["function"])} for c in self._calls]

    def call_deltas(self, position: int) -> list[dict[str, Any]]:
        """The streamed deltas of call ``position`` as the upstream sent them (to relay them later)."""
        return list(self._deltas[position])

    def message(self) -> dict[str, Any]:
        """The assistant message as OpenAI would store it."""
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self._calls:
            message["tool_calls"] = self.calls
        return message

    # --- streamed ------------------------------------------------------------------------------------------

    def add(self, chunk: Any) -> None:
        """Take one streamed chunk (a ``chat.completion.chunk`` object)."""
        choices = check_chunk(chunk, self._source)
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        try:
            for choice in choices:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or {}
                self._take(delta.get("role"), delta.get("content"), choice.get("finish_reason"))
                for tool_delta in delta.get("tool_calls") or []:
                    self._add_call_delta(tool_delta)
                if choice.get("finish_reason"):
                    self._check_names()
        except _Malformed as error:
            raise bad_stream(self._source, str(error)) from None

    def end(self) -> None:
        """The stream is over: every call must have a name (checked at the finish too)."""
        try:
            self._check_names()
        except _Malformed as error:
            raise bad_stream(self._source, str(error)) from None

    def _check_names(self) -> None:
        _require(all(c["function"]["name"] for c in self._calls), "a tool call without a function name")

    def _take(self, role: str | None, content: Any, finish_reason: str | None) -> None:
        self.role = role or self.role
        self._text.append(_content_text(content))
        self.finish_reason = finish_reason or self.finish_reason

    def _add_call_delta(self, tool_delta: dict[str, Any]) -> None:
        index = tool_delta.get("index")
        call_id = tool_delta.get("id") or None
        function = tool_delta.get("function") or {}
        name = function.get("name") or ""
        position = self._position(index, call_id, bool(name))
        call = self._calls[position]
        known = call["function"]["name"]
        if name and name != known:  # the same name again is a server repeating it on every delta
            # Under its own id a call does not change its name: that is another call with the same id. A
            # delta without an id may carry the next piece of a name.
            _require(not known or call_id is None, "two tool calls with the same id")
            call["function"]["name"] = known + name
        call["function"]["arguments"] += function.get("arguments") or ""
        self._deltas[position].append(tool_delta)

    def _position(self, index: int | None, call_id: str | None, named: bool) -> int:
        """Which call a delta belongs to. A known id continues its call (at another index it is a second call
        with that id: malformed). A new id starts a call, unless the delta names nothing and its index was
        seen (a fresh id per fragment). Else the call last seen at its index, else (an index not seen yet
        from a server that numbers its calls: a new call; no index: the latest call)."""
        if call_id is not None and call_id in self._by_id:
            position = self._by_id[call_id]
            first = self._first_index[position]
            if index is not None and first is not None and index != first:
                self._start(call_id, index)  # raises: two calls with one id
        elif call_id is not None and (named or index is None or index not in self._at_index):
            position = self._start(call_id, index)
        elif index is not None and index in self._at_index:
            position = self._at_index[index]
        elif self._calls and (index is None or not self._at_index):
            position = len(self._calls) - 1
        else:
            position = self._start(None, index)
        if index is not None:
            self._at_index[index] = position
        return position

    def _start(self, call_id: str | None, index: int | None = None) -> int:
        _require(call_id is None or call_id not in self._by_id, "two tool calls with the same id")
        self._calls.append({"id": call_id, "function": {"name": "", "arguments": ""}})
        self._deltas.append([])
        self._first_index.append(index)
        position = len(self._calls) - 1
        if call_id is not None:
            self._by_id[call_id] = position
        return position

    # --- not streamed --------------------------------------------------------------------------------------

    @classmethod
    def from_response(cls, result: Any, source: str = DEFAULT_SOURCE) -> Round:
        """Read a non-streamed ``chat.completion`` result (choice 0)."""
        answer = cls(source)
        try:
            answer._read(result)
        except _Malformed as error:
            message = f"{_capital(source)} sent a malformed response: {error}."
            raise UpstreamError(message, status=502, code="upstream_bad_response") from None
        return answer

    def _read(self, result: Any) -> None:
        _require(isinstance(result, dict), "a body that is not a JSON object")
        _optional(result.get("usage"), dict, "'usage' that is not an object")
        self.usage = result.get("usage")
        choices = result.get("choices")
        _require(isinstance(choices, list), "'choices' that is not a list")
        if not choices:
            return
        choice = choices[0]
        _require(isinstance(choice, dict), "a choice that is not an object")
        message = choice.get("message")
        _require(isinstance(message, dict), "a choice without a message object")
        _optional(message.get("role"), str, "a role that is not a string")
        _optional(choice.get("finish_reason"), str, "a finish_reason that is not a string")
        self._take(message.get("role"), message.get("content"), choice.get("finish_reason"))
        tool_calls = message.get("tool_calls")
        _optional(tool_calls, list, "'tool_calls' that is not a list")
        for call in tool_calls or []:
            function: Any = call.get("function") if isinstance(call, dict) else None
            _require(isinstance(function, dict), "a tool call without a function object")
            _optional(call.get("id"), str, "a tool call id that is not a string")
            _require(function.get("name") not in (None, ""), "a tool call without a function name")
            _require(isinstance(function["name"], str), "a function name that is not a string")
            _optional(function.get("arguments"), str, "function arguments that are not a string")
            position = self._start(call.get("id") or None)
            self._calls[position]["function"] = {"name": function["name"], "arguments": function.get("arguments") or ""}
            self._deltas[position].append(call)
