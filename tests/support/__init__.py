"""Helpers the tests share (and ``bench/`` may import; no test module imports another): the proxy in process
or on a socket (``proxies``), the command line in process or spawned (``cli``), fake upstreams, servers in
threads, engines on a scratch store, scripted models and generated transcripts, a throwaway PostgreSQL
cluster. ``tests/conftest.py`` holds only fixtures and hooks."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: config/, README.md, pyproject.toml
