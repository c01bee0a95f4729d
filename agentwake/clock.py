"""Time as agentwake writes and reads it: UTC, ISO 8601 with milliseconds and a trailing ``Z``.

One form everywhere (the store's columns, the wire's timestamps, log lines), so that
stored times compare as text in the order they happened.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """``2026-12-02T16:07:14.123Z``: the form the spec's examples use; a naive time is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_iso() -> str:
    return iso(utc_now())


def parse_iso(value: str) -> datetime | None:
    """An ISO 8601 time (``Z`` or an offset; none means UTC), or None when ``value`` is not one."""
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
