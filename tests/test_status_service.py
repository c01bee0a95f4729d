"""`agentwake status` says whether the service runs: a real `agentwake run` subprocess records itself
in its SQLite store, beats, and marks its clean stop; SIGKILL leaves a record that did not stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from _support import agentwake_run, demo_server_toml
from conftest import REPO
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.cli.tables import describe_service
from agentwake.cli.views import service_state
from agentwake.clock import iso, utc_now
from agentwake.config import parse_config
from agentwake.service import run_service
from agentwake.store import SubscriptionKey
from agentwake.store.sqlite import SqliteCore
from agentwake.store.sqlite.service import SERVICE_ROWS_KEPT
from agentwake.store.sqlite.versions import MIGRATION_NAMES, MIGRATION_SET

pytestmark = pytest.mark.anyio

WAIT_S = 60.0
KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})


def write_config(tmp_path: Path) -> Path:
    path = tmp_path / "agentwake.toml"
    path.write_text(
        f"""
[store]
path = "aw.db"

{demo_server_toml(tmp_path / "demo.db")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
"""
    )
    return path


async def run_status(config: Path, *args: str) -> tuple[int, str, str]:
    """`agentwake status` in its own process, as a person would run it: exit code, stdout, stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = await anyio.run_process(
        [sys.executable, "-m", "agentwake.cli", "status", "-c", str(config), *args],
        cwd=config.parent,
        env=env,
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def status(config: Path, *args: str) -> str:
    code, out, err = await run_status(config, *args)
    assert code == 0, err
    return out


async def status_json(config: Path) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(await status(config, "--json", "--with-service"))
    return shown


async def wait_for_status(
    config: Path, ok: Callable[[dict[str, Any]], bool], limit_s: float = WAIT_S
) -> dict[str, Any]:
    """`status --json --with-service` again until ``ok`` holds for it (no fixed wait: a condition)."""
    shown: dict[str, Any] = {}
    try:
        with anyio.fail_after(limit_s):
            while True:
                code, out, err = await run_status(config, "--json", "--with-service")
                if code != 0:  # the service has not created its store yet
                    assert "no store at" in err, err
                else:
                    shown = json.loads(out)
                    if ok(shown):
                        return shown
                await anyio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(
            f"status never got there; the last one:\n{json.dumps(shown, indent=2)}"
        ) from None


def running_as(pid: int) -> Callable[[dict[str, Any]], bool]:
    def ok(shown: dict[str, Any]) -> bool:
        me = shown["service"]
        rows = shown["subscriptions"]
        return bool(me and me["running"] and me["pid"] == pid and rows and rows[0]["status"] == "active")

    return ok


@pytest.mark.slow
async def test_status_shows_the_running_service_then_its_clean_stop(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    async with agentwake_run(config) as run:
        process = run.process
        shown = await wait_for_status(config, running_as(process.pid))
        me = shown["service"]
        assert (me["state"], me["host"], me["stopped_at"], me["pid_alive"]) == (
            "running",
            socket.gethostname(),
            None,
            True,
        )
        assert me["heartbeat_s"] == 5.0 and me["heartbeat_age_s"] <= 3 * me["heartbeat_s"]
        [row] = shown["subscriptions"]
        assert row["service_running"] is True
        # The plain JSON is still the array of subscriptions, each saying whether the service runs.
        [plain] = json.loads(await status(config, "--json"))
        assert (plain["subscription"], plain["service_running"]) == ("tickets", True)
        text = " ".join((await status(config)).split())
        assert (
            f"service: running (pid {process.pid} on {socket.gethostname()}, since {me['started_at']}" in text
        )
        assert "last heartbeat" in text and "(service stopped)" not in text

        assert await run.stop(signal.SIGTERM, timeout=WAIT_S) == 0

    shown = await status_json(config)
    me = shown["service"]
    assert (me["running"], me["state"], me["pid"]) == (False, "stopped", process.pid)
    assert me["stopped_at"] is not None and me["stopped_at"] >= me["started_at"]
    [row] = shown["subscriptions"]
    assert (row["status"], row["service_running"]) == ("active", False)
    text = " ".join((await status(config)).split())
    assert f"service: not running (stopped at {me['stopped_at']})" in text
    assert "active (service stopped)" in text


@pytest.mark.slow
async def test_a_killed_service_shows_as_not_running_and_not_stopped_cleanly(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    async with agentwake_run(config) as run:
        process = run.process
        await wait_for_status(config, running_as(process.pid))
        # reaped: the pid is gone, not a zombie
        assert await run.stop(signal.SIGKILL, timeout=WAIT_S) == -signal.SIGKILL

    shown = await status_json(config)
    me = shown["service"]
    assert (me["running"], me["state"], me["pid"], me["stopped_at"], me["pid_alive"]) == (
        False,
        "unclean_stop",
        process.pid,
        None,
        False,
    )
    assert shown["subscriptions"][0]["service_running"] is False
    text = " ".join((await status(config)).split())
    assert f"service: not running (pid {process.pid} on {socket.gethostname()} last seen" in text
    assert "it did not stop cleanly)" in text
    assert "(service stopped)" in text


# ---- the service's record in the store, in process --------------------------------------------


async def test_the_service_beats_while_it_runs_and_records_its_stop_when_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agentwake.service.HEARTBEAT_S", 0.05)
    config = parse_config({"store": {"path": str(tmp_path / "aw.db")}}, env={})

    def record() -> dict[str, Any]:
        core = SqliteCore.open(tmp_path / "aw.db", create=False)
        try:
            [newest, *_] = core.services()
            return newest
        finally:
            core.close()

    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: run_service(config, handle_signals=False, task_status=task_status))
        first = record()
        assert (first["pid"], first["stopped_at"], first["heartbeat_s"]) == (os.getpid(), None, 0.05)
        with anyio.fail_after(WAIT_S):
            while record()["heartbeat_at"] == first["started_at"]:  # noqa: ASYNC110 - the store signals nothing
                await anyio.sleep(0.02)
        beat = record()
        assert beat["stopped_at"] is None and service_state([beat])["running"] is True  # type: ignore[index]
        tg.cancel_scope.cancel()
    stopped = record()
    assert stopped["stopped_at"] is not None and stopped["id"] == first["id"]
    assert service_state([stopped]) is not None and service_state([stopped])["state"] == "stopped"  # type: ignore[index]


def record(**fields: Any) -> dict[str, Any]:
    now = utc_now()
    return {
        "id": 1,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "version": "0.1.0",
        "started_at": iso(now - timedelta(minutes=5)),
        "heartbeat_at": iso(now),
        "heartbeat_s": 5.0,
        "stopped_at": None,
        **fields,
    }


def test_a_heartbeat_older_than_three_intervals_is_not_running_even_if_the_pid_lives() -> None:
    now = utc_now()
    fresh = service_state([record(heartbeat_at=iso(now - timedelta(seconds=14)))], now=now)
    assert fresh is not None and fresh["running"] is True
    stale = service_state([record(heartbeat_at=iso(now - timedelta(seconds=16)))], now=now)
    assert stale is not None
    assert (stale["running"], stale["state"], stale["pid_alive"], stale["heartbeat_age_s"]) == (
        False,
        "unclean_stop",
        True,
        16.0,
    )
    line = describe_service(stale)
    assert line.startswith(
        f"service: not running (pid {os.getpid()} on {socket.gethostname()} last seen 16s ago;"
    )
    assert "it did not stop cleanly" in line and "alive but writes no heartbeat" in line


def test_a_service_on_another_host_is_judged_by_its_heartbeat_alone() -> None:
    now = utc_now()
    elsewhere = record(host="elsewhere.example", pid=1)
    assert service_state([elsewhere], now=now, host="here")["running"] is True  # type: ignore[index]
    stale = {**elsewhere, "heartbeat_at": iso(now - timedelta(minutes=3))}
    judged = service_state([stale], now=now, host="here")
    assert judged is not None and (judged["running"], judged["pid_alive"]) == (False, None)
    assert "last seen 3m ago" in describe_service(judged)


def test_the_newest_running_start_wins_over_a_newer_one_that_stopped() -> None:
    # A second `agentwake run` on the same store that failed at start must not hide the first one.
    now = utc_now()
    failed_second = record(id=2, stopped_at=iso(now))
    first = record(id=1)
    shown = service_state([failed_second, first], now=now)
    assert shown is not None and (shown["running"], shown["started_at"]) == (True, first["started_at"])
    assert service_state([failed_second], now=now)["state"] == "stopped"  # type: ignore[index]
    assert service_state([]) is None
    assert describe_service(None) == "service: no record of 'agentwake run' in this store yet"


def test_only_the_newest_starts_are_kept(tmp_path: Path) -> None:
    core = SqliteCore.open(tmp_path / "aw.db")
    try:
        ids = [
            core.service_started(pid=100 + n, host="h", version=None, heartbeat_s=5.0)
            for n in range(SERVICE_ROWS_KEPT + 3)
        ]
        core.service_stopped(ids[-1])
        kept = core.services(limit=100)
        assert [r["id"] for r in kept] == ids[::-1][:SERVICE_ROWS_KEPT]
        assert kept[0]["stopped_at"] is not None and kept[1]["stopped_at"] is None
        # A heartbeat after the stop does not bring the row back to life.
        core.service_heartbeat(ids[-1])
        assert core.services(limit=1)[0]["heartbeat_at"] == kept[0]["heartbeat_at"]
    finally:
        core.close()


def test_migration_0011_adds_the_service_table_to_a_store_of_the_previous_version(tmp_path: Path) -> None:
    path = tmp_path / "aw.db"
    # A store as 0010 left it: the migrations up to it, no service table.
    from sqlite_utils import Database

    from agentwake.store.sqlite.schema import migrations

    migrations.apply(Database(path), stop_before="0011_service")
    old = sqlite3.connect(path)
    try:
        assert not old.execute("SELECT name FROM sqlite_master WHERE name = 'service'").fetchall()
    finally:
        old.close()
    core = SqliteCore.open(path)
    try:
        applied = [
            r[0]
            for r in core.conn.execute(
                "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid", [MIGRATION_SET]
            )
        ]
        # 0011 and every migration after it, applied now, in order.
        pending = list(MIGRATION_NAMES[MIGRATION_NAMES.index("0011_service") :])
        assert applied[-len(pending) :] == pending and set(applied) == set(MIGRATION_NAMES)
        assert core.services() == []
        core.register(KEY)
        service_id = core.service_started(pid=7, host="h", version="x", heartbeat_s=5.0)
        [row] = core.services()
        assert (row["id"], row["pid"], row["host"], row["version"], row["stopped_at"]) == (
            service_id,
            7,
            "h",
            "x",
            None,
        )
        assert row["heartbeat_at"] == row["started_at"]
    finally:
        core.close()


def test_status_of_a_store_no_service_recorded_itself_in(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    core = SqliteCore.open(tmp_path / "aw.db")
    core.register(KEY)
    core.close()
    runner = CliRunner()
    result = runner.invoke(app, ["status", "--json", "--with-service", "-c", str(config)])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["service"] is None and shown["subscriptions"][0]["service_running"] is None
    text = runner.invoke(app, ["status", "-c", str(config)])
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert "service: no record of 'agentwake run' in this store yet" in flat
    assert "(service stopped)" not in flat
