"""The read-only views' SQL and row shapes that both backends share, so `status` prints the same dicts
whichever store it reads (the SQL here is plain enough for SQLite and PostgreSQL alike)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

SUBSCRIPTIONS_SQL: Final = (
    "SELECT s.name, s.server, s.event, s.arguments, s.mode, s.cursor, s.last_poll_at, s.events_received,"
    " s.duplicates, s.gaps, s.status, s.last_error, s.cursor_updated_at, s.stream_errors,"
    " w.webhook_id, w.url, w.refresh_before, w.no_expiry, w.delivery_status, w.refreshes,"
    " w.last_refresh_at, w.pending_secret IS NOT NULL, w.previous_until, s.rejected, s.recent_errors"
    " FROM subscriptions s LEFT JOIN webhooks w ON w.subscription = s.name ORDER BY s.name"
)


def subscription_view(r: Sequence[Any]) -> dict[str, Any]:
    """One row of SUBSCRIPTIONS_SQL as `status --json` prints it."""
    return {
        "subscription": r[0],
        "server": r[1],
        "event": r[2],
        "arguments": json.loads(r[3]),
        "mode": r[4],
        "cursor": r[5],
        # The last poll, stream frame or webhook delivery that stored something.
        "last_activity_at": r[6],
        "last_poll_at": r[6],
        "events_received": r[7],
        "duplicates": r[8],
        "gaps": r[9],
        "status": r[10],
        "last_error": r[11],
        "cursor_updated_at": r[12],
        "stream_errors": r[13],
        "rejected": r[23],
        "recent_errors": json.loads(r[24]) if r[24] else [],
        # No secret here: this is what `status --json` prints.
        "webhook": None
        if r[15] is None
        else {
            "id": r[14],
            "url": r[15],
            "refresh_before": r[16],
            "no_expiry": bool(r[17]),
            "delivery_status": json.loads(r[18]) if r[18] else None,
            "refreshes": r[19],
            "last_refresh_at": r[20],
            "rotation_pending": bool(r[21]),
            "previous_secret_until": r[22],
        },
    }
