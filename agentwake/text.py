"""Peer strings bounded for logs and stored errors. No dependencies: the error tree uses it.

A server chooses its error messages, ids and names: one can be megabytes long, span lines
or carry terminal escapes. ``peer`` makes any of them safe to put in a log line or a
stored ``last_error``: control characters replaced, at most a bounded number of
characters, the cut said.
"""

from __future__ import annotations

import re
from typing import Final

# A peer's string in a log line or last_error, at most ([limits] max_peer_text_chars overrides).
PEER_TEXT_CHARS: Final = 500
_CONTROL: Final = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def peer(value: object, limit: int = PEER_TEXT_CHARS) -> str:
    """A server-supplied value as one bounded, printable line."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > 4 * limit:  # do not scan megabytes to show a few hundred characters
        text = text[: 4 * limit]
    return clip(_CONTROL.sub("\N{REPLACEMENT CHARACTER}", text), limit)
