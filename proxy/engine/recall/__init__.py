"""Recall tools the proxy serves to the model: ``lcm_grep``, ``lcm_describe``, ``lcm_expand``,
``lcm_expand_query``. Lossless means the model can get anything back: every summary and stub names ids, and
these tools turn an id back into the material behind it.

``schema`` holds what the model is offered, ``scope`` what one request's conversation may see, ``lookup``
how an id is opened within it, ``grep``, ``describe`` and ``expand`` the tools, and ``tools`` the entry point
that runs one call. The names below are the package's front, for the relay, the doors and the admin service.
"""

from proxy.engine.recall.schema import RECALL_TOOLS
from proxy.engine.recall.tools import RecallTools, clip_to_tokens

__all__ = ["RECALL_TOOLS", "RecallTools", "clip_to_tokens"]
