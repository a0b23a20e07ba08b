"""The load run of bench/load.py at a bounded size, and a client hang-up that load surfaced.

64 concurrent clients over 20 shared conversations (each client on its own branch of a shared opening,
with retries, regenerates, edits, double submits, tool calls and pasted files, half of it streamed) send
about 1,800 requests through a real proxy process, with a window small enough that compaction runs all the
time. Afterwards: no error, no message lost or duplicated against the clients' own records, the forks the
clients' actions imply and no others, every forwarded request within the window with its tool calls
paired, doctor and the store's integrity checks (``PRAGMA integrity_check`` on SQLite) clean, all read
through the operator API. The same run on several PostgreSQL replicas is in tests/store/test_replicas.py.
Throughput is printed by ``python -m bench load``, never asserted here.
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench.load import run_load
from tests.support.fakes import wait_for
from tests.support.proxies import RunningProxy


def test_load_run_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    result = run_load(clients=64, conversations=20, requests=1800, workers=2, workdir=tmp_path)
    # No error answer, and no ERROR (or "database is locked", or a replaced worker) in the proxy's log: both
    # at once, since the log tells why clients saw errors.
    assert (result.log_errors, result.errors) == ([], [])
    assert result.requests >= 1800
    assert (result.lost, result.duplicated, result.mismatched) == (0, 0, [])
    assert result.roots == 20  # the racing first requests of each opening created one conversation
    assert result.forks == result.forks_expected > 40
    assert result.doctor == [] and result.integrity == "ok"
    assert result.upstream.get("over_window", 0) == 0
    assert result.upstream.get("unpaired_tool_calls", 0) == 0
    # The run exercised what it claims to: compaction, summaries and every client behaviour.
    assert result.compaction_headers["scheduled"] > 0
    assert result.summaries["leaf"] > 0 and result.summaries["condensed"] > 0
    assert result.upstream["summary"] > 0 and result.upstream["explore"] > 0 and result.upstream["tool_calls"] > 0
    assert all(result.actions[a] > 0 for a in ("continue", "retry", "regenerate", "edit", "double", "tools"))
    assert result.ok


def test_client_hanging_up_mid_body_is_not_a_proxy_error(proxy: RunningProxy, caplog: pytest.LogCaptureFixture) -> None:
    """A client that gives up while its body is still being read (its own timeout, under load) used to be an
    "unhandled error" 500 with a traceback in the log; nobody is there to read the answer."""
    caplog.set_level(logging.WARNING)
    address = urlsplit(proxy.url)
    body = b'{"model": "test-model", "messages": [{"role": "user", "content": "' + b"x" * 50_000 + b'"}]}'
    with socket.create_connection((address.hostname, address.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:1000])
        )
    assert not wait_for(lambda: any(r.levelno >= logging.ERROR for r in caplog.records), timeout=1.0)
