"""Standing instructions: what the user or the instructions set to hold from then on, kept current and shown.

* ``ledger``: the deterministic core (extract, reconcile, select, render), no store and no I/O;
* ``slots``, ``cues``, ``lexicon``, ``topics``: the deterministic reader of one sentence and the test of
  whether a later statement updates an earlier one;
* ``flow``: where the ledger meets the store (at ingest) and the assembled request (``Standing``).
"""

from proxy.engine.standing.flow import MARKER, Said, Standing, record, said

__all__ = ["MARKER", "Said", "Standing", "record", "said"]
