"""A store the CLI cannot use (locked by another process, or not a database) is one ``error:`` line
and exit code 1, never a traceback.

The CLI runs as a program (a subprocess), so what it prints is what a person sees. A store
may wait up to its busy timeout (10 s) for a lock; the wrapper shortens that default, so the
locked case never takes long, however the store takes its write lock.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentwake.store import IncomingEvent, Settlement, SubscriptionKey
from agentwake.store.sqlite import SqliteCore

# How long the CLI's store waits for a lock here, in ms.
SHORT_BUSY_TIMEOUT_MS = 200

WRAPPER = f"""
import sys

from agentwake.store.sqlite import SqliteStore

defaults = SqliteStore.open.__func__.__kwdefaults__ or {{}}
if "busy_timeout_ms" in defaults:
    defaults["busy_timeout_ms"] = {SHORT_BUSY_TIMEOUT_MS}
sys.argv = ["agentwake", *sys.argv[1:]]
from agentwake.cli import main

main()
"""


def write_config(folder: Path) -> Path:
    config = folder / "agentwake.toml"
    config.write_text('[store]\npath = "aw.db"\n')
    return config


def held_event_store(folder: Path) -> Path:
    """A store holding one event, T-1, held for approval; its path."""
    path = folder / "aw.db"
    core = SqliteCore.open(path)
    try:
        key = SubscriptionKey("tickets", "demo", "ticket.created", {})
        core.register(key)
        core.ingest(key, [IncomingEvent("T-1", "ticket.created", "2026-01-01T00:00:00Z", {"n": 1})], "1")
        [event] = core.claim(1)
        core.settle([Settlement(event.id, {"action": "approve", "rule": "hold", "why": "a test"}, "held")])
    finally:
        core.close()
    return path


def agentwake(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    wrapper = config.parent / "wrapper.py"
    wrapper.write_text(WRAPPER)
    return subprocess.run(
        [sys.executable, str(wrapper), *args, "-c", str(config)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[Path]:
    """The config of a store another connection holds an exclusive lock on."""
    db = held_event_store(tmp_path)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        yield write_config(tmp_path)
    finally:
        other.execute("ROLLBACK")
        other.close()


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def test_approving_on_a_locked_store_is_one_error_line_and_exit_code_1(locked: Path) -> None:
    done = agentwake(locked, "approve", "T-1")
    assert done.returncode == 1, done.stderr
    line = one_error_line(done.stderr)
    assert "event 'T-1'" in line and "is locked by another process" in line and "try again" in line


def test_the_answer_goes_through_once_the_lock_is_gone(tmp_path: Path) -> None:
    held_event_store(tmp_path)
    done = agentwake(write_config(tmp_path), "approve", "T-1")
    assert done.returncode == 0, done.stderr
    assert "approved T-1" in done.stdout


@pytest.mark.parametrize("command", [["status"], ["inbox"], ["approvals", "--json"], ["approve", "T-1"]])
def test_a_file_that_is_not_a_database_is_one_error_line_and_exit_code_1(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "aw.db").write_bytes(b"not a database, just text\n" * 200)
    done = agentwake(write_config(tmp_path), *command)
    assert done.returncode == 1, done.stderr
    line = one_error_line(done.stderr)
    assert "is not a readable agentwake store" in line
    assert done.stdout == ""


def test_status_on_a_store_with_an_unknown_schema_is_one_error_line(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "aw.db") as db:
        db.execute("CREATE TABLE subscriptions (just_one_column TEXT)")
    done = agentwake(write_config(tmp_path), "status", "--json")
    assert done.returncode == 1, done.stderr
    assert "aw.db" in one_error_line(done.stderr)
    assert done.stdout == ""
