"""Untrusted text going into a prompt: size-capped and fenced with a boundary it cannot forge.

The boundary is random per run, so data written before the run (an event, a
tool result) cannot contain the closing marker. Values are sanitized first
(``agentwake.sanitize``: bounds, invisible characters, secrets); the fence is the
part the system prompt relies on.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from agentwake.sanitize import datamark


def new_boundary() -> str:
    return secrets.token_hex(8)


def cap(text: str, limit: int) -> str:
    """At most ``limit`` characters; says how much was cut."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"{text[:limit]}\n[truncated: {cut} more characters not shown]"


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)


@dataclass(frozen=True, slots=True)
class Fence:
    """One run's fence. ``wrap`` puts a value between markers that carry the boundary."""

    boundary: str = field(default_factory=new_boundary)
    datamark: bool = False

    def wrap(self, value: Any, *, kind: str, limit: int) -> str:
        body = cap(as_text(value), limit)
        if self.datamark:
            body = datamark(body)
        # The boundary is random and the body is written before it exists, so the
        # body cannot close the fence; stripping look-alikes keeps transcripts clear.
        body = body.replace(self.boundary, "[boundary removed]")
        return f'<{kind} boundary="{self.boundary}">\n{body}\n</{kind} boundary="{self.boundary}">'
