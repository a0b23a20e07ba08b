"""Exploration summaries: the few hundred tokens that stand in for a stored huge payload.

A stubbed file is only useful if the model can decide from the stub whether to drill down, so the summary
describes *shape*: keys and array lengths for JSON/YAML, columns and row count for CSV, tags for XML
(``structured``), imports and signatures for code (``code``). Those are extracted deterministically (cheap,
reproducible, no upstream call); only free text goes to an LLM (``summary``), with an excerpt-based fallback
(``excerpts``) whenever the LLM fails or babbles. ``kinds`` picks the explorer.

Summaries are shown to a model and stored, so every one goes through ``redact_secrets`` (``output``) before it
is returned, and no explorer may raise or run unbounded on hostile input (binary junk, entity bombs, deeply
nested or self-referencing documents, multi-megabyte pastes).

The names below are the package's front: what ingest, the engine and rendering use.
"""

from proxy.engine.explore.summary import ExplorationBudget, TextSummarizer, exploration_summary
from proxy.redaction import redact_secrets

__all__ = ["ExplorationBudget", "TextSummarizer", "exploration_summary", "redact_secrets"]
