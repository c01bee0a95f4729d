"""The PostgreSQL schema, as named migrations applied in order, at most once, when a store opens.

The same tables and columns as the SQLite schema (``agentwake/store/sqlite/schema.py``) at its
latest migration, so every view returns the same values: times are the same ISO-8601 text
(``agentwake.clock.iso``, compared as text like SQLite does), and JSON is stored as the same text
(jsonb would reorder keys and refuses some escapes SQLite keeps). Row ids are identity columns.

Several processes may open one database at once: every pending migration runs in ONE transaction
that first takes an advisory lock, so one process applies them and the others find them applied.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from agentwake.clock import now_iso
from agentwake.errors import StoreError
from agentwake.store.pauses import PAUSES_TABLE
from agentwake.store.retention_schema import RETENTION_INDEXES, SEEN_INDEX, SEEN_TABLE
from agentwake.store.sessions import SESSIONS_INDEX, SESSIONS_TABLE

# pg_advisory_xact_lock key held while migrating (any fixed 64-bit number; "agentwk1" in ASCII).
MIGRATION_LOCK: Final = 0x6167656E74776B31

_INITIAL: Final = (
    """
    CREATE TABLE subscriptions (
        name text PRIMARY KEY,
        server text NOT NULL,
        event text NOT NULL,
        arguments text NOT NULL,
        mode text,
        cursor text,
        cursor_updated_at text,
        last_poll_at text,
        events_received bigint NOT NULL DEFAULT 0,
        duplicates bigint NOT NULL DEFAULT 0,
        gaps bigint NOT NULL DEFAULT 0,
        status text NOT NULL DEFAULT 'new',
        last_error text,
        created_at text NOT NULL,
        updated_at text NOT NULL,
        stream_errors bigint NOT NULL DEFAULT 0,
        rejected bigint NOT NULL DEFAULT 0,
        claimed_seq bigint NOT NULL DEFAULT 0,
        recent_errors text
    )
    """,
    """
    CREATE TABLE events (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        server text NOT NULL,
        subscription text NOT NULL,
        name text NOT NULL,
        event_id text NOT NULL,
        timestamp text NOT NULL,
        data text NOT NULL,
        meta text,
        received_at text NOT NULL,
        state text NOT NULL DEFAULT 'pending',
        attempts integer NOT NULL DEFAULT 0,
        priority integer NOT NULL DEFAULT 0,
        state_changed_at text NOT NULL,
        last_error text,
        available_at text,
        injection_score double precision,
        sanitize_report text,
        decision text,
        approved_at text,
        approval_note text,
        batch_leader bigint,
        lease_until text,
        CONSTRAINT events_dedup UNIQUE (server, name, event_id)
    )
    """,
    "CREATE INDEX events_pending ON events (state, priority, id)",
    "CREATE INDEX events_claim ON events (subscription, state, priority DESC, id)",
    "CREATE INDEX events_batch ON events (batch_leader) WHERE batch_leader IS NOT NULL",
    "CREATE INDEX events_event_id ON events (event_id)",
    """
    CREATE TABLE gaps (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        subscription text NOT NULL,
        server text NOT NULL,
        event text NOT NULL,
        detected_at text NOT NULL,
        cursor_before text,
        cursor_after text,
        delivery_id text
    )
    """,
    "CREATE UNIQUE INDEX gaps_delivery ON gaps (subscription, delivery_id) WHERE delivery_id IS NOT NULL",
    """
    CREATE TABLE runs (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_row bigint NOT NULL REFERENCES events(id),
        kind text NOT NULL,
        attempt integer NOT NULL,
        model text NOT NULL,
        status text NOT NULL,
        reason text,
        decision text NOT NULL,
        system_prompt text,
        user_prompt text,
        messages text NOT NULL DEFAULT '[]',
        steps integer NOT NULL DEFAULT 0,
        prompt_tokens bigint NOT NULL DEFAULT 0,
        completion_tokens bigint NOT NULL DEFAULT 0,
        cost_usd double precision,
        started_at text NOT NULL,
        finished_at text,
        duration_ms bigint
    )
    """,
    "CREATE INDEX runs_event ON runs (event_row, id)",
    "CREATE INDEX runs_status ON runs (status)",
    "CREATE INDEX runs_started ON runs (started_at)",
    """
    CREATE TABLE tool_calls (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id bigint NOT NULL REFERENCES runs(id),
        step integer NOT NULL,
        call_id text NOT NULL,
        tool text NOT NULL,
        server text,
        name text,
        arguments text,
        status text NOT NULL,
        result text,
        duration_ms bigint,
        at text NOT NULL,
        idempotency_key text,
        reply text
    )
    """,
    "CREATE INDEX tool_calls_run ON tool_calls (run_id, id)",
    """
    CREATE TABLE flow_marks (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        rule text NOT NULL,
        kind text NOT NULL,
        key text NOT NULL,
        event_row bigint NOT NULL REFERENCES events(id),
        at text NOT NULL
    )
    """,
    "CREATE INDEX flow_marks_lookup ON flow_marks (rule, kind, key, at)",
    """
    CREATE TABLE webhooks (
        subscription text PRIMARY KEY,
        server text NOT NULL,
        event text NOT NULL,
        arguments text NOT NULL,
        url text NOT NULL,
        secret text NOT NULL,
        pending_secret text,
        previous_secret text,
        previous_until text,
        webhook_id text,
        refresh_before text,
        no_expiry boolean NOT NULL DEFAULT false,
        delivery_status text,
        refreshes bigint NOT NULL DEFAULT 0,
        last_refresh_at text,
        created_at text NOT NULL
    )
    """,
    """
    CREATE TABLE webhooks_retired (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        subscription text NOT NULL,
        server text NOT NULL,
        event text NOT NULL,
        arguments text NOT NULL,
        url text NOT NULL,
        webhook_id text,
        reason text NOT NULL,
        retired_at text NOT NULL,
        unsubscribed_at text
    )
    """,
    "CREATE INDEX webhooks_retired_id ON webhooks_retired (webhook_id)",
    """
    CREATE TABLE service (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        pid bigint NOT NULL,
        host text NOT NULL,
        version text,
        started_at text NOT NULL,
        heartbeat_at text NOT NULL,
        heartbeat_s double precision NOT NULL,
        stopped_at text,
        paused text
    )
    """,
)

# Which process drives each subscription's delivery loop: a lease until lease_until, and a fence raised
# at every change of owner that each cursor write of the loop must still carry (agentwake.ownership).
_SUBSCRIPTION_OWNERS: Final = (
    """
    CREATE TABLE subscription_owners (
        subscription text PRIMARY KEY,
        owner text NOT NULL,
        fence bigint NOT NULL,
        lease_until text NOT NULL,
        acquired_at text NOT NULL
    )
    """,
)

# The rule whose max_concurrent slot an event's run holds, while the event is being handled.
_RULE_SLOTS: Final = ("ALTER TABLE events ADD COLUMN slot_rule text",)

# The approvals' audit trail (the SQLite store's 0015_approval_answers).
_APPROVAL_ANSWERS: Final = (
    """
    CREATE TABLE answers (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_row bigint NOT NULL REFERENCES events(id),
        answer text NOT NULL,
        who text NOT NULL,
        via text NOT NULL,
        address text,
        at text NOT NULL,
        rule text,
        tools text NOT NULL,
        authority text,
        note text
    )
    """,
    "CREATE INDEX answers_event ON answers (event_row, id)",
)

# The kill switch (the SQLite store's 0016_pauses).
_PAUSES: Final = (PAUSES_TABLE,)

# Operator sessions of the service endpoint (the SQLite store's 0018_operator_sessions).
_OPERATOR_SESSIONS: Final = (SESSIONS_TABLE, SESSIONS_INDEX)

# The keys of pruned events, for dedup after pruning (the SQLite store's 0017_retention): a row
# inserted into events whose key is in seen is skipped (the trigger returns NULL), so every insert
# path (ON CONFLICT DO NOTHING ... RETURNING) counts it as the duplicate it is.
_RETENTION: Final = (
    SEEN_TABLE,
    SEEN_INDEX,
    """
    CREATE FUNCTION agentwake_events_seen() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM seen s WHERE s.server = NEW.server AND s.name = NEW.name
                   AND s.event_id = NEW.event_id) THEN
            RETURN NULL;
        END IF;
        RETURN NEW;
    END
    $$
    """,
    "CREATE TRIGGER events_seen BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION agentwake_events_seen()",
    "ALTER TABLE runs ADD COLUMN cleared_at text",
    *RETENTION_INDEXES,
)

# Of a run's prompt tokens, those the provider read from its prompt cache (SQLite's 0019_cached_tokens).
_CACHED_TOKENS: Final = ("ALTER TABLE runs ADD COLUMN cached_tokens bigint NOT NULL DEFAULT 0",)

# In order; a new one is appended (never edited once released): its name is recorded when applied.
MIGRATIONS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("0001_initial", _INITIAL),
    ("0002_subscription_owners", _SUBSCRIPTION_OWNERS),
    ("0003_rule_slots", _RULE_SLOTS),
    ("0004_approval_answers", _APPROVAL_ANSWERS),
    ("0005_pauses", _PAUSES),
    ("0006_retention", _RETENTION),
    ("0007_operator_sessions", _OPERATOR_SESSIONS),
    ("0008_cached_tokens", _CACHED_TOKENS),
)
MIGRATION_NAMES: Final = tuple(name for name, _ in MIGRATIONS)

_APPLIED_SQL: Final = "SELECT name FROM schema_migrations"
_HAS_SCHEMA_SQL: Final = "SELECT to_regclass('schema_migrations') IS NOT NULL"


def missing_schema(target: str) -> StoreError:
    return StoreError(f"no agentwake store in {target} yet: run 'agentwake run' first, which creates it")


def outdated_schema(target: str) -> StoreError:
    return StoreError(
        f"the store in {target} has an older schema than this agentwake: run 'agentwake run' once to migrate it"
    )


async def migrate(conn: psycopg.AsyncConnection[Any], target: str, *, create: bool) -> list[str]:
    """Apply every pending migration on ``conn`` (in autocommit mode); the names applied here.

    ``create=False`` refuses a database without the schema (it still migrates an older one, as
    the SQLite store does). An up-to-date schema is found without taking the lock.
    """
    has_schema = (await (await conn.execute(_HAS_SCHEMA_SQL)).fetchone() or [False])[0]
    if not has_schema and not create:
        raise missing_schema(target)
    if has_schema:
        applied = {row[0] for row in await (await conn.execute(_APPLIED_SQL)).fetchall()}
        if applied >= set(MIGRATION_NAMES):
            return []
    done: list[str] = []
    async with conn.transaction():
        # Taken first: a process that waited here sees the migrations the holder committed.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", [MIGRATION_LOCK])
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (name text PRIMARY KEY, applied_at text NOT NULL)"
        )
        applied = {row[0] for row in await (await conn.execute(_APPLIED_SQL)).fetchall()}
        for name, statements in MIGRATIONS:
            if name in applied:
                continue
            for statement in statements:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO schema_migrations (name, applied_at) VALUES (%s, %s)", [name, now_iso()]
            )
            done.append(name)
    return done


def check_schema(conn: psycopg.Connection[Any], target: str) -> None:
    """For a read-only reader: the schema must be there and up to date (a reader never migrates)."""
    row = conn.execute(_HAS_SCHEMA_SQL).fetchone()
    if not (row and row[0]):
        raise missing_schema(target)
    applied = {r[0] for r in conn.execute(_APPLIED_SQL).fetchall()}
    if not applied >= set(MIGRATION_NAMES):
        raise outdated_schema(target)
