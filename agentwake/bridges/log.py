"""A bridge's durable, bounded event log: what its ingress accepted, read back by cursor.

Both ingress paths (the upstream's webhooks and polling its API) append here, and
``events/poll``, ``events/stream`` and webhook delivery all read from here, so a cursor
is a position in this log (its ``seq``) and replays exactly. An append is committed
before it returns: a webhook is answered 2xx only once its event is on disk.

Dedup is twofold. An event id is unique in the log, so the same upstream occurrence
arriving by webhook and by polling (or twice by either) is kept once. Where the upstream gives
a change no id that both ingress paths see, its id holds a time, and the two paths' clocks may
disagree (PagerDuty stamps a log entry in seconds and the webhook in milliseconds): such an
event names the id prefix of its change (``same_prefix``) and a tolerance (``same_within``),
and is not stored when the log holds an event of that prefix within the tolerance of it. A webhook's
delivery id is remembered apart, so a replayed delivery is recognised even after its
event aged out of the log (or when it produced no event at all).

The log is bounded by count and by age. What is pruned is remembered as a high-water
mark (``pruned_through``), so a reader whose cursor points before it learns that events
were skipped (``truncated``), rather than silently missing them.

An ingress that knows it missed upstream changes (a poller whose feed did not reach back
to the last item it saw) records a gap with the events it did get: the log position
before them, per event type. A reader of that type whose read crosses the position is
told ``truncated`` once, as for a pruned event.

The raw upstream payload is kept beside each event for debugging (``agentwake bridge``'s
``--keep-raw``), never served.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol

from agentwake.clock import iso, parse_iso

DEFAULT_MAX_EVENTS: Final = 50_000
DEFAULT_RETENTION: Final = timedelta(days=7)
# How many log rows one read looks at before it hands back a cursor with hasMore: a
# filter that matches few events must not make one poll scan the whole log.
SCAN_LIMIT: Final = 2_000

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    occurred_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    source TEXT NOT NULL,
    data TEXT NOT NULL,
    raw TEXT
);
CREATE INDEX IF NOT EXISTS events_type_seq ON events(type, seq);
CREATE INDEX IF NOT EXISTS events_received ON events(received_at);
CREATE TABLE IF NOT EXISTS deliveries (
    delivery_id TEXT PRIMARY KEY,
    received_at TEXT NOT NULL,
    event_id TEXT
);
CREATE INDEX IF NOT EXISTS deliveries_received ON deliveries(received_at);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gaps (
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    PRIMARY KEY (type, seq)
);
"""


@dataclass(frozen=True)
class NewEvent:
    """One event for the log, as an ingress path produced it."""

    type: str
    event_id: str
    occurred_at: datetime
    data: dict[str, Any]
    raw: Any = None
    # The same upstream change, seen by another ingress with another clock: an event whose id starts
    # with same_prefix and whose occurred_at is at most same_within away. None: the id alone says.
    same_prefix: str | None = None
    same_within: timedelta = timedelta(0)

    @classmethod
    def of(cls, mapped: Mapped, raw: Any) -> NewEvent:
        """The event a bridge's mapper made of an upstream payload, with that payload."""
        return cls(
            mapped.type,
            mapped.event_id,
            mapped.occurred_at,
            mapped.data,
            raw,
            same_prefix=mapped.same_prefix,
            same_within=mapped.same_within,
        )


class Mapped(Protocol):
    """What each bridge's pure ``*_events`` module maps an upstream payload to."""

    @property
    def type(self) -> str: ...
    @property
    def event_id(self) -> str: ...
    @property
    def occurred_at(self) -> datetime: ...
    @property
    def data(self) -> dict[str, Any]: ...
    @property
    def same_prefix(self) -> str | None: ...
    @property
    def same_within(self) -> timedelta: ...


@dataclass(frozen=True)
class LoggedEvent:
    seq: int
    type: str
    event_id: str
    occurred_at: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Read:
    """A read after a cursor: the events, the position read up to, and what the reader should know."""

    events: list[LoggedEvent]
    position: int
    has_more: bool
    truncated: bool


class EventLog:
    """The SQLite log. Thread-safe; its methods block, so async callers use ``anyio.to_thread``."""

    def __init__(
        self,
        path: Path,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        retention: timedelta = DEFAULT_RETENTION,
        delivery_memory: timedelta = timedelta(days=2),
        keep_raw: bool = True,
    ) -> None:
        if max_events < 1:
            raise ValueError("the event log must keep at least 1 event")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Owner-only before SQLite opens it: raw payloads may hold a private repository's text.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        os.chmod(path, 0o600)
        self.path = path
        self.max_events = max_events
        self.retention = retention
        self.delivery_memory = delivery_memory
        self.keep_raw = keep_raw
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a 2xx to the upstream promises the event survives
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def head(self) -> int:
        """The newest position (0 for an empty log that never held anything)."""
        with self._lock:
            row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        return int(row[0]) if row else 0

    def pruned_through(self) -> int:
        with self._lock:
            return self._pruned_through()

    def _pruned_through(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'pruned_through'").fetchone()
        return int(row[0]) if row else 0

    def seen_delivery(self, delivery_id: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM deliveries WHERE delivery_id = ?", (delivery_id,)
            ).fetchone()
        return row is not None

    def append(
        self,
        events: Iterable[NewEvent],
        *,
        source: str,
        delivery_id: str | None = None,
        gap_types: Iterable[str] = (),
    ) -> list[str]:
        """Store events in one transaction and return the types that got a new event.

        An event whose id is already logged is skipped. With ``delivery_id`` the delivery
        is remembered in the same transaction; a delivery already remembered stores nothing
        (the caller checks ``seen_delivery`` first to say so; this keeps a race safe).
        ``gap_types`` records, in the same transaction, that events of those types were lost
        upstream before these ones: at the position the log had before them.
        """
        now = datetime.now(UTC)
        added: list[str] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if delivery_id is not None:
                    cursor = self._db.execute(
                        "INSERT OR IGNORE INTO deliveries (delivery_id, received_at) VALUES (?, ?)",
                        (delivery_id, iso(now)),
                    )
                    if cursor.rowcount == 0:
                        self._db.execute("COMMIT")
                        return []
                for kind in dict.fromkeys(gap_types):
                    self._db.execute(
                        "INSERT OR IGNORE INTO gaps (seq, type)"
                        " SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0), ?",
                        (kind,),
                    )
                for event in events:
                    if self._seen_nearby(event):
                        continue
                    # Not a bare INSERT OR IGNORE: an ignored insert still uses up a seq, so the
                    # count bound (head - max_events) would prune events it should keep.
                    cursor = self._db.execute(
                        "INSERT OR IGNORE INTO events"
                        " (event_id, type, occurred_at, received_at, source, data, raw)"
                        " SELECT ?, ?, ?, ?, ?, ?, ?"
                        " WHERE NOT EXISTS (SELECT 1 FROM events WHERE event_id = ?)",
                        (
                            event.event_id,
                            event.type,
                            iso(event.occurred_at),
                            iso(now),
                            source,
                            json.dumps(event.data, ensure_ascii=False, separators=(",", ":")),
                            json.dumps(event.raw, ensure_ascii=False) if self.keep_raw else None,
                            event.event_id,
                        ),
                    )
                    if cursor.rowcount:
                        added.append(event.type)
                        if delivery_id is not None:
                            self._db.execute(
                                "UPDATE deliveries SET event_id = ? WHERE delivery_id = ?",
                                (event.event_id, delivery_id),
                            )
                self._prune(now)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return added

    def _seen_nearby(self, event: NewEvent) -> bool:
        """Whether the log holds the same change under another id (see ``NewEvent.same_prefix``)."""
        if event.same_prefix is None:
            return False
        rows = self._db.execute(
            # A range on the unique index: every id that starts with the prefix.
            "SELECT occurred_at FROM events WHERE event_id >= ? AND event_id < ? AND event_id != ?",
            (event.same_prefix, event.same_prefix + "\U0010ffff", event.event_id),
        ).fetchall()
        for (occurred_at,) in rows:
            moment = parse_iso(occurred_at)
            if moment is not None and abs(moment - event.occurred_at) <= event.same_within:
                return True
        return False

    def _prune(self, now: datetime) -> None:
        head_row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
        head = int(head_row[0]) if head_row else 0
        oldest_kept = iso(now - self.retention)
        pruned = self._db.execute(
            "SELECT max(seq) FROM events WHERE seq <= ? OR received_at < ?",
            (head - self.max_events, oldest_kept),
        ).fetchone()[0]
        if pruned is not None:
            self._db.execute("DELETE FROM events WHERE seq <= ?", (pruned,))
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('pruned_through', ?)"
                " ON CONFLICT(key) DO UPDATE SET value = max(CAST(value AS INTEGER), excluded.value)",
                (str(pruned),),
            )
            # A reader before the pruned mark is told truncated anyway.
            self._db.execute("DELETE FROM gaps WHERE seq < ?", (pruned,))
        self._db.execute("DELETE FROM deliveries WHERE received_at < ?", (iso(now - self.delivery_memory),))

    def read(self, event_type: str, after: int, limit: int, *, scan_limit: int = SCAN_LIMIT) -> Read:
        """Events of one type after position ``after``, oldest first.

        At most ``limit`` events and ``scan_limit`` positions are looked at; ``has_more``
        says the read stopped early. ``truncated`` says events after ``after`` were pruned
        before this reader got them, or that a gap of this type lies in what it read past.
        """
        with self._lock:
            head_row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
            head = int(head_row[0]) if head_row else 0
            truncated = after < self._pruned_through()
            rows = self._db.execute(
                "SELECT seq, type, event_id, occurred_at, data FROM events"
                " WHERE type = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                (event_type, after, min(head, after + scan_limit), limit + 1),
            ).fetchall()
            events = [LoggedEvent(seq, kind, eid, at, json.loads(data)) for seq, kind, eid, at, data in rows]
            if len(events) > limit:
                events = events[:limit]
                position, has_more = events[-1].seq, True
            else:
                position = min(head, after + scan_limit)
                has_more = position < head
            # A gap at seq G lies between G and G + 1: crossed by a read from at most G to past it.
            gap = self._db.execute(
                "SELECT 1 FROM gaps WHERE type = ? AND seq >= ? AND seq < ? LIMIT 1",
                (event_type, after, position),
            ).fetchone()
        return Read(events, position, has_more=has_more, truncated=truncated or gap is not None)

    def raw(self, event_id: str) -> Any:
        """The upstream payload an event came from (debugging), or None."""
        with self._lock:
            row = self._db.execute("SELECT raw FROM events WHERE event_id = ?", (event_id,)).fetchone()
        return json.loads(row[0]) if row and row[0] is not None else None

    # Small key-value state for the pollers (ETags, the last item seen per feed).
    def get_state(self, key: str) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (f"state:{key}",)).fetchone()
        return json.loads(row[0]) if row else None

    def set_state(self, key: str, value: Any) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (f"state:{key}", json.dumps(value)),
            )
