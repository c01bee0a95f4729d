"""JSON text as agentwake stores and measures it: compact, by pydantic-core, never failing on odd input."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# The ASCII encoder is the fallback for text pydantic-core's faster one refuses (lone surrogates).
_encode_json_ascii = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def encode_json(value: Any) -> str:
    """Compact JSON text, by pydantic-core (about five times json.dumps on event payloads).

    A lone UTF-16 surrogate (a valid JSON escape, but not Unicode, which SQLite cannot
    store as text) is kept as its escape instead, so one odd payload never fails a batch.
    """
    try:
        return _to_json(value).decode("utf-8")
    except _SerializationError:
        return _encode_json_ascii(value)


def _load_to_json(value: Any) -> bytes:
    """pydantic-core's encoder, imported on the first call (the CLI's readers never encode: about
    15 ms of start-up they need not pay), then called directly."""
    global _to_json, _SerializationError
    from pydantic_core import PydanticSerializationError, to_json

    _to_json, _SerializationError = to_json, PydanticSerializationError
    return to_json(value)


_to_json: Callable[[Any], bytes] = _load_to_json
_SerializationError: type[Exception] = Exception  # replaced before anything could raise it
