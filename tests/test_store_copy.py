"""``agentwake store copy --to postgresql://…``: a SQLite store moved into PostgreSQL, whole or not at all.

A SQLite store is filled through ``SqliteStore`` with every kind of row the service writes, copied
by the real CLI (a subprocess), and the PostgreSQL store opened on the target must show, view by
view, what the SQLite one shows; new rows then continue the ids of the copied ones, exactly as they
would have in SQLite. A non-empty target is refused untouched, and a copy that fails midway (a
trigger added here refuses one row) leaves the target empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from _postgres import PASSWORD, PASSWORD_USER, PostgresServer, free_port

from agentwake.clock import iso
from agentwake.store import (
    EventVerdict,
    FlowGate,
    IncomingEvent,
    RejectedEvent,
    RunProgress,
    Settlement,
    Store,
    SubscriptionKey,
    ToolCallRecord,
)
from agentwake.store.copy import SKIPPED_TABLES
from agentwake.store.postgres import PostgresStore
from agentwake.store.sqlite import SqliteStore

START = datetime(2026, 12, 3, 8, 0, 0, tzinfo=UTC)
T0 = "2026-12-03T08:00:00.000Z"
TICKETS = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
ALERTS = SubscriptionKey("alerts", "demo", "alert.fired", {})
HOOKS = SubscriptionKey("hooks", "other", "feed.item", {"feed": "main"})
OLD = SubscriptionKey("old", "other", "feed.item", {"feed": "old"})
URL = "https://agentwake.example/hooks"
SECRETS = ("whsec-first-secret-1", "whsec-rotated-secret-2", "whsec-retired-secret-3")
PASSWORD_ENV = "AGENTWAKE_TEST_PG_PASSWORD"


def at(seconds: float) -> str:
    return iso(START + timedelta(seconds=seconds))


def incoming(event_id: str, key: SubscriptionKey = TICKETS) -> IncomingEvent:
    return IncomingEvent(event_id, key.event, T0, {"id": event_id, "text": 'héllo\n\t"quoted"'})


def call(call_id: str, step: int = 1) -> ToolCallRecord:
    return ToolCallRecord(
        step, call_id, "demo__add_comment", "demo", "add_comment", {"id": 1}, "sent", None, None
    )


async def fill(store: Store) -> None:
    """Every kind of row: subscriptions and cursors, events (a duplicate, a gap, a rejected one),
    webhooks (one rotated, one retired), decisions, approvals, runs with journaled tool calls,
    flow-control marks, and the service's records."""
    for key in (TICKETS, ALERTS):
        await store.register(key)
    await store.ingest(TICKETS, [incoming(f"T-{n}") for n in range(1, 7)], "6")
    # T-6 again (a duplicate), and a truncated batch: a gap between the cursors.
    await store.ingest(TICKETS, [incoming("T-6"), incoming("T-7")], "8", truncated=True, cursor_before="6")
    await store.ingest(
        ALERTS,
        [incoming("A-1", ALERTS), incoming("A-2", ALERTS), incoming("A-3", ALERTS)],
        "a3",
        rejected=[RejectedEvent("A-X", "alert.fired", T0, "over max_event_bytes", '{"big": …')],
    )
    await store.set_state("tickets", status="active", mode="poll")
    await store.record_error("alerts", "the server said no")
    await store.count_stream_error("alerts", "a stream error")
    # Webhooks: one subscribed, then rotated (its old secret kept for a while); one retired.
    await store.prepare_webhook(HOOKS, URL + "/main", SECRETS[0])
    await store.webhook_subscribed(
        "hooks",
        webhook_id="wh-1",
        sent_secret=SECRETS[0],
        refresh_before=at(3600),
        delivery_status={"lastDelivery": "ok"},
        previous_until=at(600),
    )
    await store.request_rotation(["hooks"], lambda: SECRETS[1])
    await store.webhook_subscribed(
        "hooks",
        webhook_id="wh-1",
        sent_secret=SECRETS[1],
        refresh_before=at(7200),
        delivery_status=None,
        previous_until=at(600),
    )
    await store.prepare_webhook(OLD, URL + "/old", SECRETS[2])
    await store.webhook_subscribed(
        "old",
        webhook_id="wh-old",
        sent_secret=SECRETS[2],
        refresh_before=None,
        delivery_status=None,
        previous_until=at(600),
    )
    await store.retire_webhook("old", "removed from the config", unsubscribed=False)

    claimed = {e.event_id: e for e in await store.claim(20, T0, lease_until=at(60))}
    await store.settle(
        [
            Settlement(claimed["T-1"].id, {"action": "ignore", "rule": "noise", "why": "a test"}, "ignored"),
            Settlement(claimed["T-2"].id, {"action": "approve", "rule": "hold", "why": "ask first"}, "held"),
            Settlement(claimed["T-3"].id, {"action": "approve", "rule": "hold", "why": "ask again"}, "held"),
        ]
    )
    await store.answer(claimed["T-2"].id, approve=True, note="fine by me")
    # An agent run with two journaled calls, settled, then completed: its event is done.
    await store.record_decision(claimed["T-4"].id, {"action": "agent", "rule": "triage"})
    run = await store.start_run(
        claimed["T-4"].id,
        kind="agent",
        attempt=claimed["T-4"].attempts,
        model="agentwake/offline",
        decision={"action": "agent", "rule": "triage", "tools": ["demo__add_comment"]},
        system_prompt="sys",
        user_prompt="usr",
    )
    for n, call_id in enumerate(("c1", "c2"), start=1):
        row = await store.journal_tool_call(run, call(call_id, n), f"key-{call_id}")
        await store.settle_tool_call(row, status="ok", result="commented", reply="done", duration_ms=5)
    messages = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Triaged."}]
    progress = RunProgress(messages, 2, 120, 30, 0.0012)
    await store.record_progress(run, progress, [])
    await store.finish_run(
        run, status="completed", reason=None, progress=progress, duration_ms=42, verdict=EventVerdict("done")
    )
    # A failed run: its event failed (so `retry` has one).
    failed = await store.start_run(
        claimed["T-5"].id,
        kind="agent",
        attempt=claimed["T-5"].attempts,
        model="m",
        decision={"action": "agent"},
        system_prompt=None,
        user_prompt=None,
    )
    await store.journal_tool_call(failed, call("c3"), "key-c3")  # sent, outcome unknown
    await store.finish_run(
        failed,
        status="failed",
        reason="the model gave up",
        progress=RunProgress([], 1, 10, 0, None),
        duration_ms=9,
        verdict=EventVerdict("failed", error="the model gave up"),
    )
    # Flow control: a dedup mark, a rate mark and a debounce batch.
    gate = FlowGate(
        now=T0, dedup_key="printer", dedup_since=at(-60), rate_key="k", rate_since=at(-60), rate_max=5
    )
    await store.flow_gate(claimed["A-1"].id, "r", {}, gate)
    await store.flow_gate(claimed["A-2"].id, "r", {}, gate)
    batch = FlowGate(now=T0, batch_key="b", batch_since=at(-30), batch_due=at(30))
    await store.flow_gate(claimed["T-6"].id, "batch", {"action": "agent"}, batch)
    await store.flow_gate(claimed["T-7"].id, "batch", {"action": "agent"}, batch)
    await store.finish([claimed["A-3"].id], "done")
    # Two starts of the service, both stopped (the second after it paused).
    first = await store.service_started(pid=111, host="h1", version="1.0", heartbeat_s=5.0)
    await store.service_heartbeat(first)
    await store.service_stopped(first)
    second = await store.service_started(pid=222, host="h2", version="1.1", heartbeat_s=5.0)
    await store.service_paused("max_runs_per_hour reached")
    await store.service_stopped(second)


async def views(store: Store) -> dict[str, Any]:
    """Every read-only view, with each stored event's detail."""
    found: dict[str, Any] = {
        "subscriptions": await store.subscriptions(),
        "run_counts": await store.run_counts(),
        "inbox": await store.inbox(100),
        "inbox_failed": await store.inbox(100, state="failed"),
        "actions": await store.actions(100),
        "approvals": await store.approvals(),
        "gaps": await store.gaps(),
        "event_ids": await store.event_ids(),
        "state_counts": await store.state_counts(),
        "oldest_pending_at": await store.oldest_pending_at(),
        "services": await store.services(),
        "webhooks": await store.webhooks(),
        "to_unsubscribe": await store.to_unsubscribe(),
        "retired_webhook_ids": await store.retired_webhook_ids(),
        "cursors": [await store.cursor(name) for name in ("tickets", "alerts", "hooks")],
    }
    for event_id in found["event_ids"]:
        for event in await store.find_events(event_id):
            found[f"find {event_id}"] = event
            found[f"detail {event['id']}"] = await store.event_detail(event["id"])
    return found


async def carry_on(store: Store) -> dict[str, Any]:
    """What the service would do next: ingest, claim, run; the ids it gets."""
    result = await store.ingest(TICKETS, [incoming("T-8"), incoming("T-7")], "9")
    claimed = await store.claim(20, at(120), lease_until=at(180))
    new = next(e for e in claimed if e.event_id == "T-8")
    run = await store.start_run(
        new.id,
        kind="agent",
        attempt=new.attempts,
        model="m",
        decision={},
        system_prompt=None,
        user_prompt=None,
    )
    call_row = await store.journal_tool_call(run, call("c9"), "key-c9")
    gap = await store.ingest(ALERTS, [incoming("A-9", ALERTS)], "a9", truncated=True, cursor_before="a3")
    service = await store.service_started(pid=333, host="h3", version="1.2", heartbeat_s=5.0)
    return {
        "ingested": (result.inserted, result.duplicates),
        "claimed": sorted((e.id, e.event_id) for e in claimed),
        "run": run,
        "call": call_row,
        "gap": gap.inserted,
        "gaps": len(await store.gaps()),
        "service": service,
        "retry": await store.retry(
            next(e["id"] for e in await store.find_events("T-5")), resend_unknown=True
        ),
    }


async def make_source(path: Path) -> None:
    store = await SqliteStore.open(path)
    try:
        await fill(store)
    finally:
        await store.close()


async def read_sqlite(path: Path, then: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    store = await SqliteStore.open(path)
    try:
        return await views(store), (await carry_on(store) if then else None)
    finally:
        await store.close()


async def read_postgres(url: str, then: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
    store = await PostgresStore.open(url, create=False)
    try:
        return await views(store), (await carry_on(store) if then else None)
    finally:
        await store.close()


def agentwake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentwake.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def row_counts(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
                " AND table_name <> 'schema_migrations'"
            ).fetchall()
        ]
        counts: dict[str, int] = {}
        for table in tables:
            row = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
            counts[table] = row[0] if row else 0
        return counts


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A filled SQLite store (never changed by the tests: each copies it, or a copy of it)."""
    path = tmp_path_factory.mktemp("copy-source") / "aw.db"
    anyio.run(make_source, path)
    return path


def fresh_copy(source: Path, folder: Path) -> Path:
    """A copy of the source store's files, for a test that goes on writing to it."""
    import shutil
    import sqlite3

    target = folder / "aw.db"
    with sqlite3.connect(source) as conn, sqlite3.connect(target) as copy:
        conn.backup(copy)
    shutil.copymode(source, target)
    return target


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    [line] = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    return line


def test_the_copy_shows_the_same_store_and_goes_on_with_the_same_ids(
    source: Path, postgres_url: str, tmp_path: Path
) -> None:
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(source))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    for secret in SECRETS:
        assert secret not in done.stdout + done.stderr
    # Progress, table by table, on stderr; the summary on stdout.
    assert "events: 11 of 11 rows" in done.stderr
    assert "copied" in done.stdout and "events" in done.stdout

    sqlite_path = fresh_copy(source, tmp_path)
    expected, expected_next = anyio.run(read_sqlite, sqlite_path, True)
    copied, copied_next = anyio.run(read_postgres, postgres_url, True)
    assert copied.keys() == expected.keys()
    for view in expected:
        assert copied[view] == expected[view], view
    assert [w.secret for w in copied["webhooks"]] == [SECRETS[1]]
    assert copied["webhooks"][0].previous_secret == SECRETS[0]
    # New rows continue after the copied ones, with the ids SQLite would have given.
    assert copied_next == expected_next
    assert expected_next is not None and expected_next["ingested"] == (1, 1)


def test_json_prints_rows_per_table_and_nothing_on_stderr_when_quiet(source: Path, postgres_url: str) -> None:
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(source), "--json", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    summary = json.loads(done.stdout)
    assert set(summary) == {"source", "target", "tables", "rows"}
    assert summary["source"] == str(source)
    assert "127.0.0.1" in summary["target"]
    tables = summary["tables"]
    assert tables["events"] == 11 and tables["subscriptions"] == 2 and tables["webhooks"] == 1
    assert tables["webhooks_retired"] == 1 and tables["runs"] == 2 and tables["tool_calls"] == 3
    assert tables["service"] == 2 and tables["flow_marks"] >= 2 and tables["gaps"] == 2
    assert not SKIPPED_TABLES & set(tables)
    assert summary["rows"] == sum(tables.values())
    assert {t: n for t, n in row_counts(postgres_url).items() if n} == {t: n for t, n in tables.items() if n}
    # Foreign keys: each table after those it references.
    order = list(tables)
    assert order.index("events") < order.index("runs") < order.index("tool_calls")


def test_a_target_that_holds_rows_is_refused_and_left_as_it_was(source: Path, postgres_url: str) -> None:
    first = agentwake("store", "copy", "--to", postgres_url, "--from", str(source), "-q")
    assert first.returncode == 0, first.stderr
    before = row_counts(postgres_url)
    again = agentwake("store", "copy", "--to", postgres_url, "--from", str(source), "-q")
    assert again.returncode == 1
    line = one_error_line(again.stderr)
    assert "already holds an agentwake store (11 events" in line and "copy only into an empty one" in line
    assert again.stdout == ""
    assert row_counts(postgres_url) == before


def test_a_failure_midway_leaves_the_target_empty(source: Path, postgres_url: str) -> None:
    async def schema() -> None:
        store = await PostgresStore.open(postgres_url)
        await store.close()

    anyio.run(schema)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        # tool_calls comes late in the copy: events, runs and the rest are written by then.
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN IF NEW.call_id = 'c2' THEN RAISE EXCEPTION 'refused by the test'; END IF;"
            " RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON tool_calls FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(source))
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert "nothing was copied" in line and "refused by the test" in line
    assert "events: 11 of 11 rows" in done.stderr  # it had got that far
    assert set(row_counts(postgres_url).values()) == {0}
    # Once the trigger is gone, the same copy goes through.
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER refuse ON tool_calls")
    assert agentwake("store", "copy", "--to", postgres_url, "--from", str(source), "-q").returncode == 0


def test_the_source_must_have_this_agentwakes_schema(tmp_path: Path, postgres_url: str) -> None:
    import sqlite3

    old = tmp_path / "old.db"
    anyio.run(make_source, old)
    with sqlite3.connect(old) as conn:
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0012_work_queue'")
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(old))
    assert done.returncode == 1
    assert "older schema than this agentwake: migrate it first" in one_error_line(done.stderr)
    missing = agentwake("store", "copy", "--to", postgres_url, "--from", str(tmp_path / "none.db"))
    assert missing.returncode == 1
    assert "no SQLite store at" in one_error_line(missing.stderr)


def test_the_configured_store_is_the_source_and_a_postgresql_one_is_refused(
    source: Path, postgres_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "agentwake.toml"
    config.write_text(f'[store]\npath = "{source}"\n')
    done = agentwake("store", "copy", "--to", postgres_url, "-c", str(config), "--json", "-q")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["source"] == str(source)

    config.write_text(f'[store]\nurl = "{postgres_url}"\n')
    refused = agentwake("store", "copy", "--to", postgres_url, "-c", str(config))
    assert refused.returncode == 2
    assert "already in PostgreSQL" in one_error_line(refused.stderr)


def test_a_password_in_the_url_is_refused_and_never_shown(source: Path) -> None:
    done = agentwake("store", "copy", "--to", "postgresql://aw:hunter2@127.0.0.1:1/aw", "--from", str(source))
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert "must not hold a password" in line and "password_env" in line
    assert "hunter2" not in done.stdout + done.stderr
    wrong = agentwake("store", "copy", "--to", "mysql://aw@127.0.0.1/aw", "--from", str(source))
    assert wrong.returncode == 2
    assert "postgresql://" in one_error_line(wrong.stderr)


def test_the_password_comes_from_the_variable_password_env_names(source: Path, postgres_url: str) -> None:
    unset = agentwake(
        "store", "copy", "--to", postgres_url, "--from", str(source), "--password-env", PASSWORD_ENV
    )
    assert unset.returncode == 2
    assert f"{PASSWORD_ENV} (--password-env) is not set" in one_error_line(unset.stderr)
    # The test server trusts local connections: any password does.
    done = agentwake(
        "store",
        "copy",
        "--to",
        postgres_url,
        "--from",
        str(source),
        "--password-env",
        PASSWORD_ENV,
        "-q",
        env={PASSWORD_ENV: "s3cret-pw"},
    )
    assert done.returncode == 0, done.stderr
    assert "s3cret-pw" not in done.stdout


def test_the_store_group_and_copy_have_help() -> None:
    group = agentwake("store", "--help")
    assert group.returncode == 0
    assert "copy a SQLite store into PostgreSQL" in group.stdout
    command = agentwake("store", "copy", "--help")
    assert command.returncode == 0
    for option in ("--to", "--password-env", "--from", "--config", "--json", "--quiet"):
        assert option in command.stdout
    listed = agentwake("--help")
    assert "store" in listed.stdout


def test_a_sqlite_column_postgresql_lacks_stops_the_copy_before_anything_is_written(
    source: Path, postgres_url: str, tmp_path: Path
) -> None:
    import sqlite3

    changed = fresh_copy(source, tmp_path)
    with sqlite3.connect(changed) as conn:
        conn.execute("ALTER TABLE runs ADD COLUMN mood TEXT")
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(changed))
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert "the PostgreSQL table 'runs' has no column 'mood'" in line
    assert set(row_counts(postgres_url).values()) == {0}


def test_who_owns_a_subscription_is_not_copied(source: Path, postgres_url: str, tmp_path: Path) -> None:
    """Ownership belongs to the running processes: the target starts with none, whatever the source had."""
    import sqlite3

    owned = fresh_copy(source, tmp_path)
    with sqlite3.connect(owned) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS subscription_owners (subscription TEXT PRIMARY KEY, owner TEXT NOT NULL,"
            " fence INTEGER NOT NULL DEFAULT 0, lease_until TEXT, acquired_at TEXT, only_in_sqlite TEXT)"
        )
        conn.execute(
            "INSERT INTO subscription_owners (subscription, owner, fence, lease_until, acquired_at)"
            " VALUES ('tickets', 'pid-1', 1, ?, ?)",
            [at(60), T0],
        )
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(owned), "--json", "-q")
    assert done.returncode == 0, done.stderr
    assert "subscription_owners" not in json.loads(done.stdout)["tables"]
    assert row_counts(postgres_url).get("subscription_owners", 0) == 0


def test_a_wrong_password_or_no_server_is_one_error_line_without_the_password(
    source: Path, postgres_server: PostgresServer, postgres_url: str
) -> None:
    locked = postgres_server.url(PostgresServer.dbname(postgres_url), user=PASSWORD_USER)
    wrong = "Wr0ng-pa55word-plugh"
    done = agentwake(
        "store",
        "copy",
        "--to",
        locked,
        "--from",
        str(source),
        "--password-env",
        PASSWORD_ENV,
        env={PASSWORD_ENV: wrong},
    )
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert "authentication" in line and "failed" in line
    assert wrong not in done.stdout + done.stderr
    nowhere = f"postgresql://agentwake@127.0.0.1:{free_port()}/nowhere"
    done = agentwake("store", "copy", "--to", nowhere, "--from", str(source))
    assert done.returncode == 1
    assert "cannot be reached" in one_error_line(done.stderr)
    # With the right password, the copy goes through.
    done = agentwake(
        "store",
        "copy",
        "--to",
        locked,
        "--from",
        str(source),
        "--password-env",
        PASSWORD_ENV,
        "-q",
        env={PASSWORD_ENV: PASSWORD},
    )
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout + done.stderr


def test_a_service_still_running_on_the_source_is_warned_about(
    source: Path, postgres_url: str, tmp_path: Path
) -> None:
    import socket

    running = fresh_copy(source, tmp_path)

    async def start() -> None:
        store = await SqliteStore.open(running)
        try:
            await store.service_started(
                pid=os.getpid(), host=socket.gethostname(), version="x", heartbeat_s=3600
            )
        finally:
            await store.close()

    anyio.run(start)
    done = agentwake("store", "copy", "--to", postgres_url, "--from", str(running), "-q")
    assert done.returncode == 0, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("warning: the service (pid") and "is running on" in line
