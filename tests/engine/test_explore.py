"""Exploration summaries: shape extraction per kind, the LLM path and its fallbacks, redaction, hostile input."""

from __future__ import annotations

import ast
import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import yaml

from proxy.engine.explore import kinds, output, structured
from proxy.engine.explore.code import explore_code
from proxy.engine.explore.excerpts import explore_text_fallback
from proxy.engine.explore.kinds import classify
from proxy.engine.explore.structured import explore_structured
from proxy.engine.explore.summary import exploration_summary
from proxy.redaction import redact_secrets

# Fake credentials, assembled at run time so that secret scanners do not flag this file.
OPENAI_KEY = "sk-" + "proj-" + "Zq8Xv3Lm9Tr2Wp5Ks7Nd4Hf6"
GH_TOKEN = "ghp" + "_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
GH_PAT = "github" + "_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"
SLACK = "xox" + "b-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOp"
AWS = "AKIA" + "IOSFODNN7EXAMPLE"
BEARER = "eyJhbGciOi" + "JIUzI1NiJ9abcdef1234567890"
PEM_LINES = [f"MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7{i:04d}x9Kq2ZfP3t" for i in range(20)]
PEM = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(PEM_LINES[:2]) + "\n-----END RSA PRIVATE KEY-----"
BIG_PEM = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(PEM_LINES) + "\n-----END PRIVATE KEY-----"
PASSWORD = "hunter2-correct-horse"
TOKENS = [OPENAI_KEY, GH_TOKEN, GH_PAT, SLACK, AWS, BEARER, PASSWORD, "s3cr3t-userinfo-pw"]


def run(coro_fn: object) -> str:
    result = asyncio.run(coro_fn)  # type: ignore[arg-type]
    assert isinstance(result, str)
    return result


def assert_no_secrets(text: str) -> None:
    for token in TOKENS:
        assert token not in text, token
    for line in PEM_LINES:  # no line of key material, not even a partial one
        assert line[-20:] not in text and line[:20] not in text, line


class FakeSummarizer:
    def __init__(self, reply: str = "", error: Exception | None = None) -> None:
        self.reply, self.error, self.calls = reply, error, 0

    async def summarize_text(self, text: str, *, name: str, max_tokens: int) -> str:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.reply


# --- classification ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "mime", "content", "kind"),
    [
        ("x.txt", "application/json; charset=utf-8", "not even json", "json"),
        ("x", "text/csv", "a,b", "csv"),
        ("x", "application/x-yaml", "a: 1", "yaml"),
        ("x", "text/xml", "<a/>", "xml"),
        ("x", "application/vnd.api+json", "{}", "json"),
        ("data.jsonl", None, '{"a": 1}', "json"),
        ("table.tsv", "text/plain", "a\tb", "csv"),
        ("conf.yml", None, "a: 1", "yaml"),
        ("main.go", "text/plain", "package main", "code"),
        ("App.TSX", None, "export {}", "code"),
        ("page.html", None, "<html><body>hi</body></html>", "text"),
        ("paste", None, '  {"a": [1, 2]}  ', "json"),
        ("paste", None, '{"a": 1}\n{"a": 2}\n', "json"),
        ("paste", None, '<?xml version="1.0"?><root/>', "xml"),
        ("paste", None, "<catalog><book id='1'/></catalog>", "xml"),
        ("paste", None, "<!DOCTYPE html><html></html>", "text"),
        ("paste", None, "{not json at all}", "text"),
        ("notes.md", None, "# Title\nbody", "text"),
        ("", None, "", "text"),
    ],
)
def test_classify(name: str, mime: str | None, content: str, kind: str) -> None:
    assert classify(name, mime, content) == kind


# --- structured data --------------------------------------------------------------------------------------


def test_json_lists_keys_types_array_lengths_and_item_key_union() -> None:
    doc = {
        "users": [{"id": i, "name": f"u{i}"} for i in range(120)] + [{"id": 999, "email": "late@x"}],
        "meta": {"version": "2", "paging": {"next": None, "size": 50}},
        "flags": [True, False],
        "count": 121,
    }
    doc["users"][3]["roles"] = ["admin"]
    summary = explore_structured("json", json.dumps(doc))
    assert summary.splitlines()[0] == "Kind: JSON document"
    assert "(root) (object, 4 keys)" in summary
    assert "users (array[121] of object; item keys: id, name, roles)" in summary
    assert "email" not in summary  # only the first ~20 items are sampled for keys
    assert "meta (object, 2 keys)" in summary and "paging (object, 2 keys)" in summary
    assert "flags (array[2] of boolean)" in summary and "count (number)" in summary
    assert "Nesting depth: 4" in summary


def test_json_lines_counts_every_record() -> None:
    lines = "\n".join(json.dumps({"ts": i, "level": "info", "msg": "m"}) for i in range(5000))
    summary = explore_structured("json", lines + "\n")
    assert summary.startswith("Kind: JSON Lines, 5000 records")
    assert "item keys: ts, level, msg" in summary


def test_invalid_json_falls_back_to_excerpts() -> None:
    summary = explore_structured("json", '{"a": 1, "b": [1, 2,,]} trailing')
    assert summary.startswith("Kind: text (excerpts)\nNote: could not be parsed as JSON")
    assert '"b": [1, 2,,]' in summary


def test_csv_headers_exact_row_count_and_samples() -> None:
    rows = ["id,name,comment"] + [f'{i},user{i},"multi\nline, with comma"' for i in range(1, 43)]
    summary = explore_structured("csv", "\n".join(rows) + "\n\n")
    assert summary.startswith("Kind: CSV table")
    assert "Delimiter: ','" in summary
    assert "Columns (3): id, name, comment" in summary
    assert "Data rows: 42 " in summary
    assert "Sample: id=1 | name=user1 | comment=multi\nline, with comma" in summary
    assert summary.count("Sample:") == 3


def test_tsv_is_detected_by_delimiter() -> None:
    text = "a\tb\tc\n" + "\n".join(f"{i}\tx,y\tz" for i in range(7))
    summary = explore_structured("csv", text)
    assert "Delimiter: tab" in summary and "Columns (3): a, b, c" in summary and "Data rows: 7 " in summary


def test_yaml_keys_and_multi_document_stream() -> None:
    doc = "server:\n  host: localhost\n  ports: [80, 443]\nreplicas: 3\nlabels:\n  - a\n  - b\n"
    summary = explore_structured("yaml", doc)
    assert summary.startswith("Kind: YAML document")
    for expected in ("server (object, 2 keys)", "ports (array[2] of number)", "replicas (number)", "labels (array[2]"):
        assert expected in summary
    stream = explore_structured("yaml", "a: 1\n---\nb: 2\n---\nc: 3\n")
    assert stream.startswith("Kind: YAML stream, 3 documents")


def test_cyclic_yaml_alias_is_bounded() -> None:
    summary = explore_structured("yaml", "a: &x [*x, *x]\n")
    assert summary.startswith("Kind: YAML document")
    assert "Nesting depth: at least" in summary
    assert len(summary) <= 1600


def test_xml_root_children_counts_and_attribute_names() -> None:
    books = "".join(f'<book id="{i}" lang="en"><title>T{i}</title></book>' for i in range(5))
    xml = f'<?xml version="1.0"?>\n<catalog xmlns:x="urn:x" owner="me">{books}<magazine issue="3"/></catalog>'
    summary = explore_structured("xml", xml)
    assert summary.startswith("Kind: XML document")
    assert "Root element: <catalog> (6 children, 12 elements, depth 3)" in summary
    assert "Child elements: book ×5, magazine ×1" in summary
    assert "id" in summary and "lang" in summary and "issue" in summary and "owner" in summary
    assert "T3" not in summary  # text content is not part of the shape


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<lolz>&lol9;</lolz>"""


def test_xml_with_dtd_is_not_parsed_or_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    parse = structured.ET.fromstring

    def spy(text: str, *args: Any, **kwargs: Any) -> Any:
        parsed.append(text)
        return parse(text, *args, **kwargs)

    monkeypatch.setattr(structured.ET, "fromstring", spy)
    summary = run(exploration_summary("bomb.xml", None, BILLION_LAUGHS, None))
    assert parsed == []  # the document never reached the parser that would expand its entities
    assert summary.startswith("Kind: text (excerpts)\nNote: could not be parsed as XML")
    assert "Root element" not in summary
    assert "lollol" not in summary  # the entities stayed unexpanded
    external = '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><r>&x;</r>'
    assert "root:" not in explore_structured("xml", external)
    assert explore_structured("xml", external).startswith("Kind: text (excerpts)")


# --- code -------------------------------------------------------------------------------------------------

PYTHON = '''"""Module doc."""
import os
from typing import Any

LIMIT = 3


def plain(a, b=2, *rest, key_only: int = 1, **kw) -> int:
    marker = "BODY_MARKER_PLAIN"
    return a


async def fetch(url: str) -> bytes:
    raise RuntimeError("BODY_MARKER_ASYNC")


class Store(Base, metaclass=Meta):
    def get(self, key):
        return "BODY_MARKER_METHOD"

    async def aclose(self) -> None: ...
'''


def test_python_signatures_without_bodies() -> None:
    summary = explore_code("store.py", PYTHON)
    assert summary.splitlines()[:2] == ["Kind: Python source", f"Lines: {PYTHON.count(chr(10))}"]
    assert "import os" in summary and "from typing import Any" in summary
    assert "def plain(a, b=2, *rest, key_only: int=1, **kw) -> int" in summary
    assert "async def fetch(url: str) -> bytes" in summary
    assert "class Store(Base): methods get, aclose" in summary
    assert "BODY_MARKER" not in summary and "LIMIT" not in summary


def test_invalid_python_uses_patterns_and_still_hides_bodies() -> None:
    source = "import sys\ndef broken(x):  return 'BODY_MARKER'\nclass K:\n    def m(self):\n  oops(\n"
    summary = explore_code("bad.py", source)
    assert "not valid Python" in summary
    assert "def broken(x)" in summary and "class K" in summary and "import sys" in summary
    assert "BODY_MARKER" not in summary


TYPESCRIPT = """import { readFile } from "fs";
import type { Config } from "./config";

export interface Options {
  verbose: boolean;
}

export function parse(input: string, opts: { strict: boolean }): Result {
  const secret = "BODY_MARKER_TS";
}

/**
 * Doubles the value(n)
 */
export const double = (n: number): number => n * 2 + BODY_MARKER_ARROW;
export default class Parser extends Base {
  private cache = new Map();
}
export async function load(path: string): Promise<void> { await readFile("BODY_MARKER_INLINE"); }
type Alias = string | number;
"""


def test_typescript_signatures_by_pattern() -> None:
    summary = explore_code("parser.ts", TYPESCRIPT)
    assert summary.startswith("Kind: TypeScript source")
    assert "Top-level declarations (6):" in summary and "Doubles" not in summary
    assert 'import { readFile } from "fs";' in summary
    for signature in (
        "export interface Options",
        "export function parse(input: string, opts: { strict: boolean }): Result",
        "export const double = (n: number): number",
        "export default class Parser extends Base",
        "export async function load(path: string): Promise<void>",
        "type Alias = string | number;",
    ):
        assert signature in summary
    assert "BODY_MARKER" not in summary and "verbose" not in summary and "cache" not in summary


GO = """package main

import (
\t"fmt"
\t"net/http"
)

type Server struct {
\taddr string
}

func (s *Server) Serve(w http.ResponseWriter, r *http.Request) error {
\tfmt.Println("BODY_MARKER_GO")
}

func main() {
}
"""


def test_go_signatures_and_import_block() -> None:
    summary = explore_code("main.go", GO)
    assert summary.startswith("Kind: Go source")
    assert '"fmt"' in summary and '"net/http"' in summary and "package main" in summary
    assert "type Server struct" in summary
    assert "func (s *Server) Serve(w http.ResponseWriter, r *http.Request) error" in summary
    assert "func main()" in summary
    assert "BODY_MARKER" not in summary and "addr string" not in summary


def test_structured_outline_is_capped() -> None:
    summary = explore_structured("json", json.dumps({f"key_number_{i}": {"x": [i]} for i in range(500)}), 700)
    assert len(summary) <= 700 and summary.endswith("…")
    assert "(root) (object, 500 keys)" in summary and "key_number_0 (object, 1 keys)" in summary


def test_code_outline_is_capped() -> None:
    source = "\n".join(f"def function_number_{i}(argument_{i}): pass" for i in range(500))
    summary = explore_code("many.py", source, max_chars=900)
    assert len(summary) <= 900
    assert "Top-level declarations (500)" in summary


# --- free text --------------------------------------------------------------------------------------------

DOC = (
    "HEAD_MARKER opening paragraph.\n# Introduction\nSome words here.\n\nInstallation Guide\n==================\n"
    + "filler text line\n" * 400
    + "REFERENCE NOTES\n"
    + "more filler\n" * 50
    + "## Closing\nfinal words TAIL_MARKER\n"
)


def test_text_fallback_counts_sections_and_excerpts() -> None:
    summary = explore_text_fallback(DOC)
    assert summary.startswith("Kind: text (excerpts)")
    assert f"Size: {len(DOC)} chars, {DOC.count(chr(10))} lines, {len(DOC.split())} words" in summary
    assert "  # Introduction\n  Installation Guide\n  REFERENCE NOTES\n  ## Closing" in summary
    beginning, end = summary.split("\nBeginning:\n")[1].split("\nEnd:\n")
    assert beginning.startswith("HEAD_MARKER") and "TAIL_MARKER" not in beginning
    assert end.rstrip().endswith("final words TAIL_MARKER") and "HEAD_MARKER" not in end
    assert len(summary) <= 1600


def test_llm_summary_is_used_for_text_and_thinking_is_stripped() -> None:
    fake = FakeSummarizer("<think>\nlet me reason about it\n</think>\nA guide to installing the tool.")
    summary = run(exploration_summary("guide.md", "text/markdown", DOC, fake, max_tokens=300))
    assert summary == "Kind: text (LLM summary)\nA guide to installing the tool."
    assert fake.calls == 1


@pytest.mark.parametrize(
    "fake",
    [
        FakeSummarizer(error=RuntimeError("upstream down")),
        FakeSummarizer(error=TimeoutError()),
        FakeSummarizer(""),
        FakeSummarizer("   \n "),
        FakeSummarizer("<think>only reasoning</think>"),
        FakeSummarizer("<think>cut off by max_tokens, never closed"),
        FakeSummarizer("x" * (16 * 100 + 1)),
    ],
)
def test_unusable_llm_output_falls_back_to_excerpts(fake: FakeSummarizer) -> None:
    summary = run(exploration_summary("guide.md", None, DOC, fake, max_tokens=100))
    assert fake.calls == 1
    assert summary.startswith("Kind: text (excerpts)")
    assert "HEAD_MARKER" in summary and "TAIL_MARKER" in summary
    assert "reasoning" not in summary


def test_structured_and_code_never_reach_the_llm() -> None:
    fake = FakeSummarizer("LLM WAS CALLED")
    json_summary = run(exploration_summary("a.json", None, '{"k": 1}', fake))
    code_summary = run(exploration_summary("a.py", None, "def f(): pass\n", fake))
    assert json_summary.startswith("Kind: JSON document") and code_summary.startswith("Kind: Python source")
    assert fake.calls == 0


# --- redaction --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (f"key is {OPENAI_KEY} ok", "key is [REDACTED] ok"),
        (f"clone with {GH_TOKEN}", "clone with [REDACTED]"),
        (f"pat {GH_PAT}", "pat [REDACTED]"),
        (f"slack {SLACK}", "slack [REDACTED]"),
        (f"aws {AWS}", "aws [REDACTED]"),
        (f"curl -H 'X: Bearer {BEARER}'", "curl -H 'X: Bearer [REDACTED]'"),
        (
            "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk",
            "jwt [REDACTED]",
        ),
        (f"before\n{PEM}\nafter", "before\n[REDACTED]\nafter"),
        (f"cut {PEM[:90]}", "cut [REDACTED]"),
        (f"{PEM[40:]}\nafter", "[REDACTED]\nafter"),
        (f"text: {PEM[40:]}", "text:[REDACTED]"),
        (
            "db postgres://admin:s3cr3t-userinfo-pw@db.example.com:5432/app",
            "db postgres://[REDACTED]@db.example.com:5432/app",
        ),
        (f"password = {PASSWORD}", "password = [REDACTED]"),
        (f"DB_PASSWD: {PASSWORD}", "DB_PASSWD: [REDACTED]"),
        (f'{{"api_key": "{PASSWORD} with spaces"}}', '{"api_key": "[REDACTED]"}'),
        (f"export SERVICE_TOKEN='{PASSWORD}'", "export SERVICE_TOKEN='[REDACTED]'"),
        (f"client_secret={PASSWORD}&x=1", "client_secret=[REDACTED]"),
        (f"apikey: {PASSWORD}", "apikey: [REDACTED]"),
        (f"Authorization: Basic {PASSWORD}", "Authorization: [REDACTED]"),
        (f"private.key={PASSWORD}", "private.key=[REDACTED]"),
        (f'def login(user: str, password: str = "{PASSWORD}")', 'def login(user: str, password: str = "[REDACTED]")'),
        # Not secrets: annotations, unrelated words, plain URLs.
        ("def login(user: str, password: str) -> bool", "def login(user: str, password: str) -> bool"),
        ("max_tokens: 400, monkey: banana, secretary: Bob", "max_tokens: 400, monkey: banana, secretary: Bob"),
        (
            "see https://example.com/a@b and task-abcdefghijklmnopqrstuv",
            "see https://example.com/a@b and task-abcdefghijklmnopqrstuv",
        ),
    ],
)
def test_redact_secrets(raw: str, expected: str) -> None:
    assert redact_secrets(raw) == expected


def test_secrets_in_json_and_yaml_are_redacted_but_key_names_kept() -> None:
    doc = {"tenants": {OPENAI_KEY: {"owner": "a"}}, "password": PASSWORD, "api_key": GH_TOKEN}
    summary = explore_structured("json", json.dumps(doc))
    assert_no_secrets(summary)
    assert "tenants (object, 1 keys)" in summary and "[REDACTED] (object, 1 keys)" in summary
    assert "password (string)" in summary and "api_key (string)" in summary
    broken = json.dumps(doc)[:-1]  # invalid JSON: the excerpt fallback shows values
    fallback = explore_structured("json", broken)
    assert fallback.startswith("Kind: text (excerpts)")
    assert_no_secrets(fallback)
    assert '"password": "[REDACTED]"' in fallback
    csv_text = f"user,token,url\nann,{SLACK},https://bob:{PASSWORD}@example.com/x\n"
    csv_summary = explore_structured("csv", csv_text)
    assert_no_secrets(csv_summary)
    assert "token=[REDACTED]" in csv_summary and "https://[REDACTED]@example.com/x" in csv_summary


def test_secrets_in_code_are_redacted() -> None:
    python = f'API_KEY = "{OPENAI_KEY}"\n\ndef connect(host, token="{GH_TOKEN}", password="{PASSWORD}"):\n    pass\n'
    summary = explore_code("client.py", python)
    assert_no_secrets(summary)
    assert 'def connect(host, token="[REDACTED]", password="[REDACTED]")' in summary.replace("'", '"')
    ts = f'export const AWS_KEY = "{AWS}";\nexport const SLACK_HOOK = "{SLACK}";\nexport function f(): void {{}}\n'
    ts_summary = explore_code("keys.ts", ts)
    assert_no_secrets(ts_summary)
    assert "export const AWS_KEY = " in ts_summary and "export function f(): void" in ts_summary


def test_secrets_in_text_excerpts_are_redacted_even_at_the_cut() -> None:
    short = f"config\npassword: {PASSWORD}\nAuthorization: Bearer {BEARER}\n{PEM}\nuse {OPENAI_KEY}\n"
    assert_no_secrets(explore_text_fallback(short))
    assert "password: [REDACTED]" in explore_text_fallback(short)
    # Key blocks straddle both excerpt boundaries of a long text: the head ends and the tail starts inside one.
    long_text = f"start {OPENAI_KEY}\n{BIG_PEM}\n" + "filler line\n" * 300 + f"{BIG_PEM}\nend {GH_TOKEN}"
    summary = explore_text_fallback(long_text)
    beginning, end = summary.split("\nBeginning:\n")[1].split("\nEnd:\n")
    assert beginning.startswith("start [REDACTED]") and end.rstrip().endswith("end [REDACTED]")
    assert_no_secrets(summary)


def test_excerpt_cuts_never_leave_a_partial_token() -> None:
    keys = [f"sk-{i:04d}{'A' * 36}" for i in range(60)]
    # The first line has no whitespace, so the head is cut inside a key; the tail starts inside the last line.
    summary = explore_text_fallback(",".join(keys) + "\n" + "filler\n" * 400 + " ".join(keys))
    assert "Beginning:\n[REDACTED],[REDACTED]," in summary and "End:\n[REDACTED] [REDACTED]" in summary
    assert "sk-" not in summary and "AAAAAAAA" not in summary


def test_llm_output_is_redacted() -> None:
    fake = FakeSummarizer(f"The file sets password={PASSWORD}, uses {OPENAI_KEY} and {AWS}; see {PEM}.")
    summary = run(exploration_summary("notes.txt", None, DOC, fake))
    assert summary.startswith("Kind: text (LLM summary)")
    assert_no_secrets(summary)
    assert "password=[REDACTED]" in summary


# --- hostile input ----------------------------------------------------------------------------------------

DEEP_JSON = "[" * 10_000 + "]" * 10_000
DEEP_OBJECTS = '{"a":' * 10_000 + "1" + "}" * 10_000
GARBAGE = bytes(range(256)).decode("latin-1") * 40


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty", ""),
        ("empty.json", ""),
        ("empty.py", ""),
        ("blob.bin", GARBAGE),
        ("blob.json", GARBAGE),
        ("blob.xml", GARBAGE),
        ("blob.csv", GARBAGE + "\x00,\x00\n"),
        ("blob.yaml", GARBAGE),
        ("blob.py", GARBAGE),
        ("deep.json", DEEP_JSON),
        ("deep", DEEP_OBJECTS),
        ("deep.yaml", DEEP_JSON),
        ("deep.py", "x = " + "(" * 10_000 + ")" * 10_000),
        ("deep.xml", "<a>" * 10_000 + "</a>" * 10_000),
    ],
)
def test_hostile_input_never_raises(name: str, content: str) -> None:
    summary = run(exploration_summary(name, None, content, FakeSummarizer(error=ValueError())))
    assert summary.startswith("Kind: ")
    assert len(summary) <= 2000
    assert "\x00" not in summary


def test_deep_yaml_depth_is_measured_without_recursion() -> None:
    # 990 levels: past what a recursive measurement survives (Python's limit is 1,000 frames), within what
    # PyYAML parses (6.0.4 and later refuse flow nesting beyond 1,000 levels).
    summary = explore_structured("yaml", "[" * 990 + "]" * 990)
    assert "Nesting depth: 990" in summary
    assert summary.count("array[1] of array") == 5  # the outline stops at depth 6


def test_yaml_deeper_than_the_parser_allows_gets_excerpts() -> None:
    summary = explore_structured("yaml", DEEP_JSON)  # 10,000 levels: measured, or refused by the parser
    assert "Nesting depth: 10000" in summary or "could not be parsed as YAML" in summary


def test_five_megabyte_inputs_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts cover every byte (C-speed scans), but whatever runs at Python speed (PyYAML, ``ast``, per-record
    JSON parsing, the redaction rules) sees a bounded part of a multi-megabyte paste, whatever its size."""
    largest: Counter[str] = Counter()
    calls: Counter[str] = Counter()

    def spy(name: str, function: Any) -> Any:
        def counted(text: str, *args: Any, **kwargs: Any) -> Any:
            largest[name], calls[name] = max(largest[name], len(text)), calls[name] + 1
            return function(text, *args, **kwargs)

        return counted

    monkeypatch.setattr(yaml, "load_all", spy("yaml", yaml.load_all))
    monkeypatch.setattr(ast, "parse", spy("ast", ast.parse))
    monkeypatch.setattr(json, "loads", spy("json", json.loads))
    monkeypatch.setattr(output, "redact_secrets", spy("redact", output.redact_secrets))
    text = ("lorem ipsum dolor sit amet " * 40 + "\n") * 4800
    rows = "a,b,c\n" + "1,2,3\n" * 900_000
    records = '{"k": 1, "v": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}\n' * 80_000
    assert run(exploration_summary("big.txt", None, text, None)).startswith("Kind: text (excerpts)\nSize: ")
    assert "Data rows: 900000 " in run(exploration_summary("big.csv", None, rows, None))
    assert "Kind: JSON Lines, 80000 records" in run(exploration_summary("big.jsonl", None, records, None))
    assert run(exploration_summary("big.py", None, "def f(): pass\n" * 400_000, None)).startswith("Kind: Python")
    assert run(exploration_summary("big.yaml", None, "k: v\n" * 1_200_000, None)).startswith("Kind: YAML")
    assert largest["yaml"] <= structured.YAML_LIMIT and largest["ast"] <= kinds.SNIFF_LIMIT
    assert calls["json"] <= 2001  # one whole-document attempt, then at most 2,000 records one by one
    assert largest["redact"] <= 16_384  # redaction runs over the summary's lines, never over the paste
