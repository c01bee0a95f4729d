"""Reading an upstream's JSON defensively, for the bridges' pure ``*_events`` modules.

A field that is missing or of the wrong type raises the module's ``Unmapped``, naming the field's
path and the type it had, never its value (it may be huge or private).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Self

from agentwake.clock import parse_iso

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"


# ---- the events' payload schemas -------------------------------------------------------


def text_schema(description: str, limit: int, *, nullable: bool = False) -> dict[str, Any]:
    return {
        "type": ["string", "null"] if nullable else "string",
        "maxLength": limit,
        "description": description,
    }


def integer_schema(description: str) -> dict[str, Any]:
    return {"type": "integer", "description": description}


def boolean_schema(description: str) -> dict[str, Any]:
    return {"type": "boolean", "description": description}


def closed_schema(properties: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The schema of an event's ``data``: an object of exactly ``properties``, every one required."""
    return {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


# ---- reading a payload -----------------------------------------------------------------


def json_body(data: bytes | str) -> Any:
    """A request body's JSON; ValueError for anything that is not JSON, nesting too deep included.

    ``json.loads`` raises RecursionError, not ValueError, on a body nested deeper than the
    interpreter's recursion limit: converted here, once, so every ingress answers it 400 (the
    upstream's retry of a 5xx would only bring it again)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


class Unmapped(ValueError):
    """A payload of a type we emit with a missing or ill-typed field; the message names the field."""


def bounded(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, a cut shown by a trailing ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def kind(value: Any) -> str:
    """A JSON value's type as a message names it (never the value: it may be huge or private)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


@dataclass(frozen=True, slots=True)
class Fields:
    """A JSON object of a payload, read field by field; a wrong field raises ``error`` naming its path.

    Each ``*_events`` module subclasses it to raise its own ``Unmapped`` and name its root."""

    error: ClassVar[type[Unmapped]] = Unmapped
    root: ClassVar[str] = "(payload)"

    raw: Mapping[str, Any]
    path: str

    @classmethod
    def of(cls, value: Any, path: str) -> Self:
        if not isinstance(value, Mapping):
            raise cls.error(f"{path or cls.root}: must be an object, not {kind(value)}")
        return cls(value, path)

    def name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _wrong(self, key: str, expected: str) -> Unmapped:
        return self.error(f"{self.name(key)}: must be {expected}, not {kind(self.raw[key])}")

    def get(self, key: str) -> Any:
        if key not in self.raw:
            raise self.error(f"{self.name(key)}: missing")
        return self.raw[key]

    def object(self, key: str) -> Self:
        return self.of(self.get(key), self.name(key))

    def optional_object(self, key: str) -> Self | None:
        value = self.raw.get(key)
        return None if value is None else self.of(value, self.name(key))

    def integer(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(key, "an integer")
        return value

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise self._wrong(key, "a boolean")
        return value

    def text(self, key: str, limit: int) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            raise self._wrong(key, "a string")
        return bounded(value, limit)

    def optional_text(self, key: str, limit: int) -> str | None:
        if self.raw.get(key) is None:
            return None
        return self.text(key, limit)

    def moment(self, key: str) -> datetime:
        value = self.get(key)
        parsed = parse_iso(value) if isinstance(value, str) else None
        if parsed is None:
            raise self._wrong(key, "an ISO 8601 time")
        return parsed.astimezone(UTC)

    def items(self, key: str, limit: int) -> list[tuple[Any, str]]:
        """The first ``limit`` elements of an array (absent or null: none), each with its path."""
        value = self.raw.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, "an array")
        return [(item, f"{self.name(key)}[{index}]") for index, item in enumerate(value[:limit])]

    def objects(self, key: str, limit: int) -> list[Self]:
        """The first ``limit`` elements of an array of objects (absent or null: none)."""
        return [self.of(item, path) for item, path in self.items(key, limit)]
