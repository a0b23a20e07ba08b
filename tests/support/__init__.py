"""Helpers the tests share (and ``bench/`` may import): fake upstreams, servers in threads, engines on a
scratch store, the scripted model of the simulations, a throwaway PostgreSQL cluster."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout: config/, README.md, pyproject.toml
