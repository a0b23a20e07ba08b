"""Operator commands over the database: ``conversations``, ``show``, ``export``, ``grep``, ``describe``,
``compact``, ``ledger`` (``proxy.cli.ledger``), ``delete`` and ``purge``.

They read the same SQLite file as the server (WAL allows that while it runs), and need nothing but its
directory: only ``compact`` calls a model, so only it needs the config's model list and credentials. The
operator sees every tenant; ``--tenant`` narrows the view. A conversation is named by its id or by the key
its client sends in ``X-LCM-Conversation-Id``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from proxy.cli.common import at_least_one, operator_setup
from proxy.cli.ledger import ledger_change, ledger_text, show_section
from proxy.config.lcm import LcmSettings
from proxy.config.settings import ProxyConfig
from proxy.engine.admin import AdminViews
from proxy.engine.deletion import Deleted, Deleter
from proxy.engine.engine import ContextEngine
from proxy.engine.errors import EngineError, InvalidArgument, NotFound
from proxy.engine.recall import RecallTools
from proxy.errors import ConfigError, ProxyError
from proxy.store.base import LONG_RANGE
from proxy.store.errors import StoreError
from proxy.store.location import Location
from proxy.store.records import ConversationRecord, SummaryRecord

Confirm = Callable[[str], bool]  # asks the operator a yes/no question (``cli``: a prompt, or --yes)
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def _table(rows: list[list[str]], headers: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    # Client text reaches the operator's terminal: never let it carry escape sequences.
    lines = [CONTROL_CHARACTERS.sub("?", line) for line in lines]
    return "\n".join(line.rstrip() for line in lines)


class Operator:
    """The operator's commands: the admin service (``proxy.engine.admin.AdminViews``) over every tenant,
    formatted for a terminal."""

    def __init__(self, where: Path | Location) -> None:
        self.location = where if isinstance(where, Location) else Location(where)
        self.store, self.files = self.location.stores()
        self.views = self._views(LcmSettings())

    def _views(self, settings: LcmSettings) -> AdminViews:
        return AdminViews(ContextEngine(self.store, self.files, settings), RecallTools(self.store, self.files))

    async def __aenter__(self) -> Operator:
        if not self.location.exists():
            raise NotFound(f"no database at {self.location.describe()} (has the proxy run yet?)")
        await self.store.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.store.close()

    async def find(self, name: str, tenant: str | None) -> str:
        """The id of the conversation ``name`` names: its id, else the client's own key for it."""
        return (await self.views.find(tenant, name)).id

    async def conversations(self, tenant: str | None, limit: int) -> str:
        records = await self.views.records(tenant, limit)
        rows = [
            [c.id, c.tenant, str(c.message_count), str(c.token_count), _when(c.updated_at), c.parent_id or ""]
            for c in records
        ]
        return _table(rows, ["id", "tenant", "messages", "tokens", "last activity", "forked from"])

    async def show(self, conversation_id: str, tenant: str | None) -> str:
        c = await self.store.read.conversation(tenant, conversation_id)
        if c is None:
            raise NotFound(f"no conversation {conversation_id}")
        lines = [
            f"conversation {c.id}",
            f"  tenant:        {c.tenant}",
            f"  key:           {c.external_key or '-'}",
            f"  forked from:   {c.parent_id or '-'}" + (f" at message {c.fork_seq}" if c.parent_id else ""),
            f"  messages:      {c.message_count} ({c.token_count} tokens as forwarded)",
            f"  created:       {_when(c.created_at)}",
            f"  last activity: {_when(c.updated_at)}",
            "",
        ]
        lines.append(f"  context:       {await self._context_line(c)}")
        recorded = await self.store.read.last_sent(c.id)
        if recorded:
            sent = orjson.loads(recorded)
            lines.append(
                f"  last sent:     {len(sent['summaries'])} summaries, raw messages from {sent['first_raw']}"
                + (f"; did not fit: {len(sent['evicted'])} summaries" if sent["evicted"] else "")
                + (f", {sent['dropped']} messages (recalled on demand)" if sent["dropped"] else "")
            )
        dag = await self._dag_lines(c.id)
        if dag:
            lines += ["", "summary DAG (active context, oldest first):", *dag]
        lines += await show_section(self.views, c.id)
        lines.append("")
        rows = []
        for start in range(0, c.message_count, LONG_RANGE):  # a page at a time
            for m in await self.store.search.messages(c.id, start, start + LONG_RANGE):
                flags = ("stub " if m.forward_json else "") + ("file " if m.payload_paths else "")
                preview = " ".join(m.text.split())[:70]
                rows.append([str(m.seq), m.role, str(m.token_count), flags.strip(), preview])
        lines.append(_table(rows, ["seq", "role", "tokens", "stored", "text"]))
        return "\n".join(lines)

    async def _context_line(self, c: ConversationRecord) -> str:
        summaries = await self.store.read.context_summaries(c.id)
        return (
            f"{len(summaries)} summaries covering messages 0-{c.summarized_upto - 1}, then raw messages"
            f" {c.summarized_upto}-{c.message_count - 1}; tool results stubbed before {c.stubbed_upto}"
            if summaries
            else f"raw messages 0-{c.message_count - 1} (nothing compacted)"
        )

    async def _dag_lines(self, conversation_id: str) -> list[str]:
        lines: list[str] = []

        async def walk(summary: SummaryRecord, indent: int) -> None:
            fallback = " fallback" if summary.escalation == 2 else (" aggressive" if summary.escalation == 1 else "")
            lines.append(
                f"{'  ' * indent}- {summary.id} {summary.kind} d{summary.depth} messages {summary.start_seq}-"
                f"{summary.end_seq - 1} {summary.token_count} tokens (from {summary.source_token_count}){fallback}"
                f" {_when(summary.earliest_at)} .. {_when(summary.latest_at)}"
            )
            for child in await self.store.read.child_summaries(summary.id):
                await walk(child, indent + 1)

        for summary in await self.store.read.context_summaries(conversation_id):
            await walk(summary, 1)
        return lines

    async def compact(self, conversation_id: str, tenant: str | None, model: str | None, config: ProxyConfig) -> str:
        """A full sweep now, summarised by ``model``, else lcm_settings.summary_model, else the model the
        conversation last used; its calls fit that model's window, as the server's do (``ModelPolicy``)."""
        from proxy.relay.policy import ModelPolicy, router_of
        from proxy.upstream.client import Upstream

        c = await self.views.find(tenant, conversation_id)
        alias = model or config.lcm_settings.summary_model or c.last_model
        if alias is None:
            raise InvalidArgument("no summary model: pass --model, or set lcm_settings.summary_model", param="model")
        router = router_of(config)
        target = router.resolve(alias)
        upstream = Upstream(config.general_settings)
        summarizer = ModelPolicy(config, router, upstream, upstream).summarizer(target)
        # Waits for a sweep of it in the server (its lease).
        report = await self._views(config.lcm_settings).compact(tenant, c.id, summarizer)
        return (
            f"compacted {c.id} with {alias}: {report['leaf_passes']} leaf and {report['condensed_passes']} condensed"
            f" passes{' (tool results stubbed)' if report['stubbed'] else ''}, {report['fallbacks']} fallback(s),"
            f" context {report['tokens_before']} -> {report['tokens_after']} tokens"
            + (" [summary model refused credentials]" if report["unavailable"] else "")
            + (" [conflict: another process compacted meanwhile]" if report["conflict"] else "")
            + (" [busy: the server kept compacting it; try again]" if report["busy"] else "")
        )

    async def grep(self, pattern: str, conversation_id: str, tenant: str | None, mode: str, limit: int) -> str:
        found = await self.views.grep(tenant, conversation_id, pattern, mode, limit)  # RecallError: exit 1
        return str(found["result"])

    async def describe(self, item_id: str, tenant: str | None, start_line: int | None, end_line: int | None) -> str:
        """Describe a summary, file or message; the scope is the conversation (or tenant) that owns it."""
        return await self.views.describe(tenant, item_id, start_line, end_line)

    async def export(self, conversation_id: str, tenant: str | None) -> list[Any]:
        return await self.views.export(tenant, conversation_id)

    async def delete(self, conversation_id: str, confirm: Confirm, full: bool) -> str:
        c = await self.store.read.conversation(None, conversation_id)
        if c is None:
            raise NotFound(f"no conversation {conversation_id}")
        forks = len(await self.store.read.descendants(c.tenant, c.id))
        kept = f"; {forks} fork(s) keep the prefix they share with it" if forks else ""
        if not confirm(f"Delete conversation {c.id} of tenant {c.tenant} ({c.message_count} messages{kept})?"):
            raise Aborted("aborted: nothing was deleted")
        return _deleted_line(await Deleter(self.store, self.files).delete(None, c.id, via="cli", full=full))

    async def purge(
        self, tenant: str | None, older_than: float | None, dry_run: bool, confirm: Confirm, full: bool
    ) -> str:
        """Every conversation of ``tenant`` (None: all) idle for ``older_than`` seconds (None: any)."""
        before = None if older_than is None else time.time() - older_than
        deleter = Deleter(self.store, self.files)
        found = await deleter.candidates(tenant, before, 10_000_000)
        whose = f"tenant {tenant}" if tenant is not None else "every tenant"
        since = f", idle since before {_when(before)}" if before is not None else ""
        if dry_run or not found:
            rows = [[c.id, c.tenant, str(c.message_count), _when(c.updated_at), c.parent_id or ""] for c in found]
            table = _table(rows, ["id", "tenant", "messages", "last activity", "forked from"]) + "\n" if found else ""
            return f"{table}{'would delete' if dry_run else 'deleted'} {len(found)} conversation(s) of {whose}{since}"
        if not confirm(f"Delete {len(found)} conversation(s) of {whose}{since}?"):
            raise Aborted("aborted: nothing was deleted")
        done = await deleter.purge(tenant, before, via="cli", full=full)
        return "\n".join([*map(_deleted_line, done), f"deleted {len(done)} conversation(s) of {whose}{since}"])


class Aborted(EngineError):
    """The operator answered no."""


def _deleted_line(d: Deleted) -> str:
    kept = f"; its first {d.kept_messages} messages stay for {d.forks} live fork(s)" if d.forks else ""
    return f"deleted {d.id} (tenant {d.tenant}): {d.messages} messages, {d.summaries} summaries, {d.files} files{kept}"


def _write_all(data: bytes) -> None:
    """All of ``data`` to stdout. A pipe whose reader leaves mid-write takes part of it and reports no error
    (the write returns a short count); the next write raises BrokenPipeError, as it should."""
    view = memoryview(data)
    while view:
        view = view[sys.stdout.buffer.write(view) :]


def run_operator(data_dir: Path | Location, command: str, config: ProxyConfig | None = None, **kwargs: Any) -> int:
    """Run one operator command on the database in ``data_dir``; ``config`` is needed by ``compact`` only.
    Every error an operator can fix or should know of is one line on stderr and exit status 1: the engine's
    (an unknown id, a bad pattern, a busy or damaged database), a model name the config does not know
    (``ProxyError``), the config's and the file system's; anything else is a bug and keeps its traceback."""

    async def main() -> int:
        async with Operator(data_dir) as op:
            tenant = kwargs.get("tenant")
            named = kwargs.get("conversation_id")
            conversation = "" if named is None else await op.find(named, tenant)
            if command == "conversations":
                print(await op.conversations(tenant, kwargs.get("limit", 100)))
            elif command == "show":
                print(await op.show(conversation, tenant))
            elif command == "grep":
                print(await op.grep(kwargs["pattern"], conversation, tenant, kwargs["mode"], kwargs["limit"]))
            elif command == "describe":
                print(await op.describe(kwargs["item_id"], tenant, kwargs.get("start_line"), kwargs.get("end_line")))
            elif command == "compact":
                if config is None:
                    raise InvalidArgument("compact calls the summary model: it needs --config", param="config")
                print(await op.compact(conversation, tenant, kwargs.get("model"), config))
            elif command == "ledger":
                print(await ledger_text(op.views, conversation, tenant, kwargs["every"], kwargs["change"]))
            elif command == "export":
                data = await op.export(conversation, tenant)
                _write_all(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
            elif command == "delete":
                print(await op.delete(conversation, kwargs["confirm"], kwargs.get("full", False)))
            elif command == "purge":
                purge = (kwargs.get("older_than"), kwargs.get("dry_run", False), kwargs["confirm"])
                print(await op.purge(tenant, *purge, kwargs.get("full", False)))
            sys.stdout.flush()  # a closed pipe shows here, as BrokenPipeError, for the CLI to handle
        return 0

    try:
        return asyncio.run(main())
    except BrokenPipeError:
        raise  # the reader went away (``| head``): not an error of the database
    except (EngineError, StoreError, ProxyError, ConfigError, OSError) as exc:
        print(f"lcm-proxy: {exc}", file=sys.stderr)
        return 1


__all__ = ["Operator", "Path", "run_operator"]


def cmd_ledger(args: argparse.Namespace) -> int:
    args.change = ledger_change(args)
    return cmd_operator(args)


def cmd_operator(args: argparse.Namespace) -> int:
    setup = operator_setup(args)
    if setup is None:
        return 1
    return run_operator(
        setup[0],
        args.command,
        setup[1],
        tenant=args.tenant,
        limit=getattr(args, "limit", 100) or 100,
        conversation_id=getattr(args, "conversation_id", None),
        model=getattr(args, "model", None),
        pattern=getattr(args, "pattern", None),
        mode=getattr(args, "mode", "regex"),
        item_id=getattr(args, "item_id", None),
        start_line=getattr(args, "start_line", None),
        end_line=getattr(args, "end_line", None),
        confirm=getattr(args, "confirm", None),
        older_than=getattr(args, "older_than", None),
        dry_run=getattr(args, "dry_run", False),
        full=getattr(args, "vacuum_full", False),
        every=getattr(args, "every", False),
        change=getattr(args, "change", None),
    )


def add_reading_commands(sub: Any, add_store: Callable[[argparse.ArgumentParser], None]) -> None:
    """``conversations``, ``show``, ``export``, ``compact``, ``grep`` and ``describe`` on the CLI's
    subcommands; ``add_store`` adds the options that find the store."""
    listing = sub.add_parser("conversations", help="list stored conversations", description="List conversations.")
    add_store(listing)
    listing.add_argument("--tenant", help="only this tenant's conversations")
    listing.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
    listing.add_argument(
        "--limit", type=at_least_one, default=100, help="at most this many, newest first (default: 100)"
    )
    listing.set_defaults(func=cmd_operator)
    for name, text in (
        ("show", "show one conversation: its summary DAG and messages"),
        ("export", "print a conversation's original transcript as JSON (stored files restored)"),
        ("compact", "run a full compaction sweep on a conversation now"),
    ):
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("conversation_id", metavar="ID", help="conversation id (conv_...) or the client's key for it")
        add_store(p)
        p.add_argument("--tenant", help="refuse a conversation of another tenant")
        p.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
        if name == "compact":
            p.add_argument("--model", help="summary model_name (default: summary_model, else the last one used)")
        p.set_defaults(func=cmd_operator)

    grep = sub.add_parser(
        "grep",
        help="search a conversation's messages, summaries and stored files",
        description="Search a conversation (and the conversations it was forked from).",
    )
    grep.add_argument("pattern", help="regular expression (or words with --mode full_text)")
    grep.add_argument(
        "--conversation", dest="conversation_id", required=True, metavar="ID",
        help="conversation id or the client's key for it",
    )  # fmt: skip
    grep.add_argument("--mode", choices=["regex", "full_text"], default="regex")
    grep.add_argument("--limit", type=at_least_one, default=20)
    grep.add_argument("--tenant", help="refuse a conversation of another tenant")
    grep.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
    add_store(grep)
    grep.set_defaults(func=cmd_operator)

    describe = sub.add_parser(
        "describe",
        help="show a summary (lineage, content), a stored file or a message",
        description="Describe a sum_..., file_... or msg_... id.",
    )
    describe.add_argument("item_id", metavar="ID")
    describe.add_argument("--start-line", type=at_least_one, dest="start_line", help="files: first line (from 1)")
    describe.add_argument("--end-line", type=at_least_one, dest="end_line", help="files: last line, inclusive")
    describe.add_argument("--tenant", help="refuse an id of another tenant")
    describe.add_argument("--user", help="an end user within --tenant (as chat requests name one)")
    add_store(describe)
    describe.set_defaults(func=cmd_operator)
