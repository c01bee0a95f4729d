"""JSON text as agentwake stores and measures it: compact, by pydantic-core, never failing on odd input."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

# The ASCII encoder is the fallback for text pydantic-core's faster one refuses (lone surrogates).
_encode_json_ascii = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def encode_json(value: Any) -> str:
    """Compact JSON text, by pydantic-core (about five times json.dumps on event payloads).

    A lone UTF-16 surrogate (a valid JSON escape, but not Unicode, which SQLite cannot
    store as text) is kept as its escape instead, so one odd payload never fails a batch.
    """
    try:
        return to_json(value).decode("utf-8")
    except PydanticSerializationError:
        return _encode_json_ascii(value)
