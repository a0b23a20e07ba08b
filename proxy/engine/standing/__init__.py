"""Standing instructions: what the user or the instructions set to hold from then on, kept current and shown.

* ``ledger``: the deterministic core (extract, reconcile, select, render), no store and no I/O;
* ``slots``, ``cues``, ``lexicon``, ``topics``: the deterministic reader of one sentence and the test of
  whether a later statement updates an earlier one;
* ``index``: the items a statement may replace, looked up by topic instead of compared one by one;
* ``flow``: where the ledger meets the store (at ingest: read, planned and written within caps) and the
  assembled request (``Standing``); ``intake``: one request's statements on their way to the store.
"""

from proxy.engine.standing.flow import Said, Standing, said
from proxy.engine.standing.masking import MARKER

__all__ = ["MARKER", "Said", "Standing", "said"]
