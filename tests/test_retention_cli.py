"""``agentwake store prune`` and the store's size in ``status``, as real ``agentwake`` processes on a
real SQLite store; ``[store.retention]``'s errors; and the service's pruner at work.

Rows are aged by writing old times into them (the CLI prunes by the clock).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from agentwake.config import StoreConfig, parse_config
from agentwake.errors import ConfigError
from agentwake.store import IncomingEvent, SubscriptionKey
from agentwake.store.retention import keep_pruned
from agentwake.store.sqlite import SqliteStore

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})
OLD = "2020-01-01T00:00:00.000Z"
DEADLINE_S = 60.0


def agentwake(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentwake.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


def make_store(path: Path, done: int, pending: int = 1) -> None:
    """``done`` events done long ago and ``pending`` new ones."""

    async def fill() -> None:
        store = await SqliteStore.open(path)
        try:
            await store.register(KEY)
            events = [
                IncomingEvent(f"E-{i}", KEY.event, OLD, {"n": i, "pad": "x" * 500})
                for i in range(done + pending)
            ]
            await store.ingest(KEY, events, "c1")
        finally:
            await store.close()

    anyio.run(fill)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE events SET state = 'done', state_changed_at = ?, received_at = ? WHERE id <= ?",
            [OLD, OLD, done],
        )


def write_config(tmp_path: Path, retention: str = "") -> Path:
    config = tmp_path / "agentwake.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "aw.db"}"\n{retention}')
    return config


def dump(path: Path) -> list[str]:
    """Everything the store holds, as SQL (the file's bytes may change on a mere open: a checkpoint)."""
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


def event_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def test_a_dry_run_says_what_would_go_and_changes_nothing_then_prune_deletes_it(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    make_store(path, done=1200)
    config = write_config(tmp_path, "[store.retention]\nbatch_rows = 100\nbatch_pause_s = 0\n")
    before = dump(path)

    dry = agentwake("store", "prune", "-c", str(config), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    document = json.loads(dry.stdout)
    assert document["dry_run"] is True
    assert document["deleted"]["events"] == 1200
    assert document["dedup_keys_kept"] == 1200
    assert event_count(path) == 1201
    assert dump(path) == before

    text = agentwake("store", "prune", "-c", str(config), "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "would delete" in text.stdout and "1200" in text.stdout

    done = agentwake("store", "prune", "-c", str(config), "--json", "-q")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["dry_run"], result["deleted"]["events"], result["batches"] >= 12) == (False, 1200, True)
    assert event_count(path) == 1  # the pending one
    assert result["store"]["oldest_event_at"] is not None
    assert result["store"]["auto_vacuum"] == "incremental"
    assert done.stderr == ""


def test_vacuum_compacts_an_older_store_and_switches_it_to_incremental(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    with sqlite3.connect(path) as conn:  # an older store: created before auto-vacuum was set
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE early (x)")
    make_store(path, done=2000)
    config = write_config(tmp_path)
    refused = agentwake("store", "prune", "-c", str(config), "--dry-run", "--vacuum")
    assert refused.returncode == 2 and "--dry-run" in refused.stderr
    done = agentwake("store", "prune", "-c", str(config), "--vacuum", "--json", "-q")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["deleted"]["events"] == 2000
    assert result["vacuumed_bytes"] > 0
    assert result["store"]["auto_vacuum"] == "incremental"


def test_prune_has_help_on_every_option() -> None:
    shown = agentwake("store", "prune", "--help")
    assert shown.returncode == 0
    for option in ("--dry-run", "--vacuum", "--json", "--quiet", "--config"):
        assert option in shown.stdout


def test_status_shows_the_store_size_and_its_oldest_event_and_keeps_the_array_form(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    make_store(path, done=3)
    config = write_config(tmp_path)
    plain = agentwake("status", "-c", str(config), "--json")
    assert plain.returncode == 0, plain.stderr
    assert isinstance(json.loads(plain.stdout), list)
    full = agentwake("status", "-c", str(config), "--json", "--with-service")
    assert full.returncode == 0, full.stderr
    store = json.loads(full.stdout)["store"]
    assert store["size_bytes"] >= path.stat().st_size > 0
    assert store["oldest_event_at"] == OLD
    text = agentwake("status", "-c", str(config))
    assert text.returncode == 0, text.stderr
    assert f"oldest event received {OLD}" in text.stdout


@pytest.mark.parametrize(
    ("retention", "expected"),
    [
        ({"done_days": 0}, "store.retention.done_days: Input should be greater than 0"),
        ({"don_days": 3}, "unknown key 'don_days' in [store.retention]"),
        ({"batch_rows": 0}, "store.retention.batch_rows"),
        ({"prune_interval_s": 0.5}, "store.retention.prune_interval_s"),
    ],
)
def test_a_bad_retention_is_a_clear_error_naming_the_key(retention: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"store": {"retention": retention}})
    assert expected in str(raised.value)


def test_retention_is_on_by_default() -> None:
    retention = StoreConfig().retention
    assert retention.enabled
    assert (retention.done_days, retention.failed_days, retention.runs_days) == (30, 90, 90)


@pytest.mark.anyio
async def test_the_service_pruner_prunes_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    await anyio.to_thread.run_sync(lambda: make_store(path, done=50))
    config = StoreConfig(path=path, retention={"prune_interval_s": 1, "batch_pause_s": 0})
    store = await SqliteStore.open(path)
    try:
        with anyio.fail_after(DEADLINE_S):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: keep_pruned(config, store, first_pass_s=0))
                # The pruner signals nothing: its rows are the condition.
                while await anyio.to_thread.run_sync(lambda: event_count(path)) > 1:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
    finally:
        await store.close()
    assert event_count(path) == 1
