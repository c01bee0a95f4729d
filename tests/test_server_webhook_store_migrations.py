"""``SqliteWebhookStore`` migrates its file with sqlite-utils ``Migrations`` under its own set name,
and opens a file written before it did (the hand-rolled runner's ``PRAGMA user_version``) with its
rows intact."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from agentwake.server import SqliteWebhookStore, StoredWebhook

SET_NAME = "agentwake-server-webhooks"

# The schema and the bookkeeping the store wrote before it used Migrations, frozen here as it was.
LEGACY_SCHEMA = """
    CREATE TABLE webhook_subscriptions (
        id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        url TEXT NOT NULL,
        name TEXT NOT NULL,
        arguments TEXT NOT NULL,
        secret TEXT NOT NULL,
        previous_secret TEXT,
        previous_until TEXT,
        expires_at TEXT,
        verified_at TEXT,
        cursor TEXT
    )
"""
LEGACY_SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="
LEGACY_ROW = (
    "sub_0123456789abcdef",
    "alice",
    "https://hooks.test/a",
    "incident.created",
    '{"severity":"P1"}',
    LEGACY_SECRET,
    None,
    None,
    None,
    "2026-02-19T15:30:00.000Z",
    "abc-7",
)


def write_legacy_file(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute(LEGACY_SCHEMA)
        db.execute("PRAGMA user_version = 1")
        db.execute("COMMIT")
        db.execute(
            "INSERT OR REPLACE INTO webhook_subscriptions (id, principal, url, name, arguments, secret,"
            " previous_secret, previous_until, expires_at, verified_at, cursor)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            LEGACY_ROW,
        )
    finally:
        db.close()


def applied(path: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT migration_set, name FROM _sqlite_migrations ORDER BY id").fetchall()
    finally:
        db.close()


def test_a_file_written_before_migrations_opens_with_its_rows_and_is_adopted(tmp_path: Path) -> None:
    path = tmp_path / "hooks.db"
    write_legacy_file(path)

    store = SqliteWebhookStore(path)
    try:
        assert store.load() == [
            StoredWebhook(
                id="sub_0123456789abcdef",
                principal="alice",
                url="https://hooks.test/a",
                name="incident.created",
                arguments={"severity": "P1"},
                secret=LEGACY_SECRET,
                verified_at=datetime(2026, 2, 19, 15, 30, tzinfo=UTC),
                cursor="abc-7",
            )
        ]
    finally:
        store.close()
    assert applied(path) == [(SET_NAME, "0001_initial")]

    reopened = SqliteWebhookStore(path)
    try:
        assert [record.id for record in reopened.load()] == ["sub_0123456789abcdef"]
    finally:
        reopened.close()
    assert applied(path) == [(SET_NAME, "0001_initial")]  # not applied a second time


def test_a_new_file_records_its_migration_under_the_server_set_only_once(tmp_path: Path) -> None:
    path = tmp_path / "hooks.db"
    SqliteWebhookStore(path).close()
    SqliteWebhookStore(path).close()
    assert applied(path) == [(SET_NAME, "0001_initial")]


def test_a_file_shared_with_another_migration_set_of_the_same_names_still_gets_the_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "shared.db"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE _sqlite_migrations (id INTEGER PRIMARY KEY, migration_set TEXT, name TEXT,"
        " applied_at TEXT)"
    )
    db.execute("CREATE UNIQUE INDEX idx_migrations ON _sqlite_migrations (migration_set, name)")
    db.execute(
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES (?, ?, ?)",
        ("agentwake", "0001_initial", "2026-01-01 00:00:00+00:00"),
    )
    db.commit()
    db.close()

    store = SqliteWebhookStore(path)
    try:
        assert store.load() == []
    finally:
        store.close()
    assert applied(path) == [("agentwake", "0001_initial"), (SET_NAME, "0001_initial")]
