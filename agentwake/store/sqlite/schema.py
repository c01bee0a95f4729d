"""The SQLite schema, as named sqlite-utils migrations applied in order when a store opens."""

from __future__ import annotations

import sqlite_utils
from sqlite_utils.migrations import Migrations

from agentwake.store.pauses import PAUSES_TABLE
from agentwake.store.retention_schema import RETENTION_INDEXES, SEEN_INDEX, SEEN_TABLE
from agentwake.store.sessions import SESSIONS_INDEX, SESSIONS_TABLE
from agentwake.store.sqlite.versions import MIGRATION_SET

# Each migration's name is also in versions.MIGRATION_NAMES (tests/test_store.py checks they agree).
migrations = Migrations(MIGRATION_SET)


@migrations(name="0001_initial")
def _initial(db: sqlite_utils.Database) -> None:
    db.execute(
        """
        CREATE TABLE subscriptions (
            name TEXT PRIMARY KEY,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            arguments TEXT NOT NULL,
            mode TEXT,
            cursor TEXT,
            cursor_updated_at TEXT,
            last_poll_at TEXT,
            events_received INTEGER NOT NULL DEFAULT 0,
            duplicates INTEGER NOT NULL DEFAULT 0,
            gaps INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL DEFAULT 'new',
            last_error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """
    )
    db.execute(
        """
        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            server TEXT NOT NULL,
            subscription TEXT NOT NULL,
            name TEXT NOT NULL,
            event_id TEXT NOT NULL,
            timestamp TEXT NOT NULL,
            data TEXT NOT NULL,
            meta TEXT,
            received_at TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'pending',
            attempts INTEGER NOT NULL DEFAULT 0,
            priority INTEGER NOT NULL DEFAULT 0,
            state_changed_at TEXT NOT NULL,
            last_error TEXT
        )
        """
    )
    db.execute("CREATE UNIQUE INDEX events_dedup ON events (server, name, event_id)")
    db.execute("CREATE INDEX events_pending ON events (state, priority, id)")
    db.execute(
        """
        CREATE TABLE gaps (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            subscription TEXT NOT NULL,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            detected_at TEXT NOT NULL,
            cursor_before TEXT,
            cursor_after TEXT
        )
        """
    )


@migrations(name="0002_agent_runs")
def _agent_runs(db: sqlite_utils.Database) -> None:
    # A pending event is not claimed again before available_at (backoff between attempts).
    db.execute("ALTER TABLE events ADD COLUMN available_at TEXT")
    db.execute(
        """
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            event_row INTEGER NOT NULL REFERENCES events(id),
            kind TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            model TEXT NOT NULL,
            status TEXT NOT NULL,
            reason TEXT,
            decision TEXT NOT NULL,
            system_prompt TEXT,
            user_prompt TEXT,
            messages TEXT NOT NULL DEFAULT '[]',
            steps INTEGER NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cost_usd REAL,
            started_at TEXT NOT NULL,
            finished_at TEXT,
            duration_ms INTEGER
        )
        """
    )
    db.execute("CREATE INDEX runs_event ON runs (event_row, id)")
    db.execute("CREATE INDEX runs_status ON runs (status)")
    db.execute(
        """
        CREATE TABLE tool_calls (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id INTEGER NOT NULL REFERENCES runs(id),
            step INTEGER NOT NULL,
            call_id TEXT NOT NULL,
            tool TEXT NOT NULL,
            server TEXT,
            name TEXT,
            arguments TEXT,
            status TEXT NOT NULL,
            result TEXT,
            duration_ms INTEGER,
            at TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX tool_calls_run ON tool_calls (run_id, id)")


@migrations(name="0003_sanitize_and_policy")
def _sanitize_and_policy(db: sqlite_utils.Database) -> None:
    # What sanitizing the payload found (cuts, redactions, injection signals); the score is a policy input.
    db.execute("ALTER TABLE events ADD COLUMN injection_score REAL")
    db.execute("ALTER TABLE events ADD COLUMN sanitize_report TEXT")
    # The policy decision (rule, why) and, for held events, the person's answer.
    db.execute("ALTER TABLE events ADD COLUMN decision TEXT")
    db.execute("ALTER TABLE events ADD COLUMN approved_at TEXT")
    db.execute("ALTER TABLE events ADD COLUMN approval_note TEXT")


@migrations(name="0004_flow_control")
def _flow_control(db: sqlite_utils.Database) -> None:
    # Marks of policy flow control (dedup, rate, batch) per rule and key, with the time they were made:
    # the windows survive restarts because they are rows, not memory.
    db.execute(
        """
        CREATE TABLE flow_marks (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            rule TEXT NOT NULL,
            kind TEXT NOT NULL,
            key TEXT NOT NULL,
            event_row INTEGER NOT NULL REFERENCES events(id),
            at TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE INDEX flow_marks_lookup ON flow_marks (rule, kind, key, at)")
    # A debounced event waits in state 'batched' for its leader's run, which sees them all.
    db.execute("ALTER TABLE events ADD COLUMN batch_leader INTEGER")
    db.execute("CREATE INDEX events_batch ON events (batch_leader) WHERE batch_leader IS NOT NULL")


@migrations(name="0005_stream_errors")
def _stream_errors(db: sqlite_utils.Database) -> None:
    # notifications/events/error on a push stream: counted, the stream goes on.
    db.execute("ALTER TABLE subscriptions ADD COLUMN stream_errors INTEGER NOT NULL DEFAULT 0")


@migrations(name="0006_webhooks")
def _webhooks(db: sqlite_utils.Database) -> None:
    # One row per webhook subscription: the key it was subscribed under (server, event, arguments, url),
    # its secrets (the receiver must hold them in clear to verify HMACs; the file is 0600), the
    # server-derived id the receiver routes by, and what the last refresh said.
    db.execute(
        """
        CREATE TABLE webhooks (
            subscription TEXT PRIMARY KEY,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            arguments TEXT NOT NULL,
            url TEXT NOT NULL,
            secret TEXT NOT NULL,
            pending_secret TEXT,
            previous_secret TEXT,
            previous_until TEXT,
            webhook_id TEXT,
            refresh_before TEXT,
            no_expiry INTEGER NOT NULL DEFAULT 0,
            delivery_status TEXT,
            refreshes INTEGER NOT NULL DEFAULT 0,
            last_refresh_at TEXT,
            created_at TEXT NOT NULL
        )
        """
    )
    # Server-side subscriptions we gave up (removed from the config, key changed, ended): the receiver
    # answers 410 to their ids, and those not yet unsubscribed are, at the next connect to their server.
    db.execute(
        """
        CREATE TABLE webhooks_retired (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            subscription TEXT NOT NULL,
            server TEXT NOT NULL,
            event TEXT NOT NULL,
            arguments TEXT NOT NULL,
            url TEXT NOT NULL,
            webhook_id TEXT,
            reason TEXT NOT NULL,
            retired_at TEXT NOT NULL,
            unsubscribed_at TEXT
        )
        """
    )
    db.execute("CREATE INDEX webhooks_retired_id ON webhooks_retired (webhook_id)")


@migrations(name="0007_gap_deliveries")
def _gap_deliveries(db: sqlite_utils.Database) -> None:
    # A webhook gap envelope's webhook-id: its retry, before or after a restart, is recorded once.
    db.execute("ALTER TABLE gaps ADD COLUMN delivery_id TEXT")
    db.execute(
        "CREATE UNIQUE INDEX gaps_delivery ON gaps (subscription, delivery_id) WHERE delivery_id IS NOT NULL"
    )


@migrations(name="0008_rejected_events")
def _rejected_events(db: sqlite_utils.Database) -> None:
    # Events refused at ingest (over a bound, malformed, another type's name), counted per subscription.
    db.execute("ALTER TABLE subscriptions ADD COLUMN rejected INTEGER NOT NULL DEFAULT 0")


@migrations(name="0009_fair_claims")
def _fair_claims(db: sqlite_utils.Database) -> None:
    # Claims take each subscription's next due event in turn, the one served longest ago first:
    # one index walk per subscription (the index's order is the claim order within one).
    db.execute("CREATE INDEX events_claim ON events (subscription, state, priority DESC, id)")
    db.execute("ALTER TABLE subscriptions ADD COLUMN claimed_seq INTEGER NOT NULL DEFAULT 0")


@migrations(name="0010_recent_errors")
def _recent_errors(db: sqlite_utils.Database) -> None:
    # The last few errors of a subscription with their times (JSON), kept after a success clears last_error.
    db.execute("ALTER TABLE subscriptions ADD COLUMN recent_errors TEXT")


@migrations(name="0011_service")
def _service(db: sqlite_utils.Database) -> None:
    # One row per start of `agentwake run` on this store: who it is (pid, host, version), when it
    # started, its last heartbeat (refreshed every heartbeat_s) and, after a clean stop, when it
    # stopped. `status` tells a running service from a stopped or vanished one with it.
    db.execute(
        """
        CREATE TABLE service (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            pid INTEGER NOT NULL,
            host TEXT NOT NULL,
            version TEXT,
            started_at TEXT NOT NULL,
            heartbeat_at TEXT NOT NULL,
            heartbeat_s REAL NOT NULL,
            stopped_at TEXT
        )
        """
    )


@migrations(name="0012_work_queue")
def _work_queue(db: sqlite_utils.Database) -> None:
    # A claim is a lease: an event 'processing' past lease_until was abandoned and may be claimed again.
    db.execute("ALTER TABLE events ADD COLUMN lease_until TEXT")
    # The tool-call journal: a call is written ('sent', with its idempotency key) before it goes out
    # and settled with its result and the reply the model got; a rerun reuses settled replies.
    db.execute("ALTER TABLE tool_calls ADD COLUMN idempotency_key TEXT")
    db.execute("ALTER TABLE tool_calls ADD COLUMN reply TEXT")
    # Runs in the last hour and spend in the last day bound the agent ([agent] max_runs_per_hour, ...).
    db.execute("CREATE INDEX runs_started ON runs (started_at)")
    # Why the running service's agent waits (a cost or rate limit), for `status`; NULL when it does not.
    db.execute("ALTER TABLE service ADD COLUMN paused TEXT")


@migrations(name="0013_subscription_owners")
def _subscription_owners(db: sqlite_utils.Database) -> None:
    # Which process drives each subscription's delivery loop: a lease until lease_until, and a fence
    # raised at every change of owner that each cursor write of the loop must still carry.
    db.execute(
        """
        CREATE TABLE subscription_owners (
            subscription TEXT PRIMARY KEY,
            owner TEXT NOT NULL,
            fence INTEGER NOT NULL,
            lease_until TEXT NOT NULL,
            acquired_at TEXT NOT NULL
        )
        """
    )


@migrations(name="0014_rule_slots")
def _rule_slots(db: sqlite_utils.Database) -> None:
    # The rule whose max_concurrent slot an event's run holds, while the event is being handled.
    db.execute("ALTER TABLE events ADD COLUMN slot_rule TEXT")


@migrations(name="0015_approval_answers")
def _approval_answers(db: sqlite_utils.Database) -> None:
    # The approvals' audit trail: each answer to a held event with who gave it (as authenticated,
    # never as the request said), from where, when, under which rule, and what it granted.
    db.execute(
        """
        CREATE TABLE answers (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            event_row INTEGER NOT NULL REFERENCES events(id),
            answer TEXT NOT NULL,
            who TEXT NOT NULL,
            via TEXT NOT NULL,
            address TEXT,
            at TEXT NOT NULL,
            rule TEXT,
            tools TEXT NOT NULL,
            authority TEXT,
            note TEXT
        )
        """
    )
    db.execute("CREATE INDEX answers_event ON answers (event_row, id)")


@migrations(name="0016_pauses")
def _pauses(db: sqlite_utils.Database) -> None:
    # The kill switch: what is paused, by whom, why, since when (agentwake.store.pauses).
    db.execute(PAUSES_TABLE)


@migrations(name="0017_retention")
def _retention(db: sqlite_utils.Database) -> None:
    # The keys of pruned events, so a re-delivery of one is still a duplicate: a row inserted into
    # events whose key is here is skipped, as the unique index skips one whose row is still there.
    db.execute(SEEN_TABLE)
    db.execute(SEEN_INDEX)
    db.execute(
        "CREATE TRIGGER events_seen BEFORE INSERT ON events WHEN EXISTS (SELECT 1 FROM seen s"
        " WHERE s.server = NEW.server AND s.name = NEW.name AND s.event_id = NEW.event_id)"
        " BEGIN SELECT RAISE(IGNORE); END"
    )
    # When a run's transcript was cleared (agentwake.store.retention); the uncleared ones are indexed.
    db.execute("ALTER TABLE runs ADD COLUMN cleared_at TEXT")
    for statement in RETENTION_INDEXES:
        db.execute(statement)


@migrations(name="0018_operator_sessions")
def _operator_sessions(db: sqlite_utils.Database) -> None:
    # Operator sessions of the service endpoint, so a restart logs nobody out (agentwake.store.sessions).
    db.execute(SESSIONS_TABLE)
    db.execute(SESSIONS_INDEX)


@migrations(name="0019_cached_tokens")
def _cached_tokens(db: sqlite_utils.Database) -> None:
    # Of a run's prompt tokens, those the provider read from its prompt cache.
    db.execute("ALTER TABLE runs ADD COLUMN cached_tokens INTEGER NOT NULL DEFAULT 0")
