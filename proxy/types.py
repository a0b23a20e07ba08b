"""Type aliases shared across layers, defined once.

Messages and request bodies stay plain JSON dicts end to end: the proxy must forward every field a client
sends, including ones no schema here knows about, so we never round-trip them through model classes.
"""

from typing import Any

JSONObject = dict[str, Any]
Message = dict[str, Any]
Messages = list[Message]
ChatBody = dict[str, Any]
Chunk = dict[str, Any]
