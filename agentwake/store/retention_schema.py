"""The tables and indexes retention adds, the same text in both backends (plain types only).

``seen`` holds the (server, event name, eventId) key of each pruned event, with when it was
pruned: both schemas skip an insert into ``events`` whose key is there (a trigger), so dedup
holds after the event's row is gone, for ``[store.retention] dedup_days``.
"""

from __future__ import annotations

from typing import Final

SEEN_TABLE: Final = """
    CREATE TABLE seen (
        server text NOT NULL,
        name text NOT NULL,
        event_id text NOT NULL,
        at text NOT NULL,
        PRIMARY KEY (server, name, event_id)
    )
"""
SEEN_INDEX: Final = "CREATE INDEX seen_at ON seen (at)"

RETENTION_INDEXES: Final = (
    # The runs whose transcript is still there, in id order: the pruner walks only those.
    "CREATE INDEX runs_uncleared ON runs (id) WHERE cleared_at IS NULL",
    # Deleting an event checks its flow marks (a foreign key) and deletes them: by event, not a scan.
    "CREATE INDEX flow_marks_event ON flow_marks (event_row)",
)
