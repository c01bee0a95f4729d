"""Every CLI command that reads or answers the store works on a PostgreSQL store (``[store] url``), and
prints what it prints on SQLite for the same content.

The same events are written into a SQLite store and a PostgreSQL one through their async stores;
the CLI runs as a program (a subprocess, as in tests/test_cli_store_errors.py) on a config for each,
and the outputs must be the same. A store the CLI cannot reach (a wrong password, no server, an
unset password variable) is one ``error:`` line and exit code 1, the password never shown.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from _postgres import PASSWORD, PASSWORD_USER, PostgresServer, free_port

from agentwake.config import load_config
from agentwake.store import (
    EventVerdict,
    IncomingEvent,
    RunProgress,
    Settlement,
    Store,
    SubscriptionKey,
    ToolCallRecord,
)
from agentwake.store.postgres import PostgresStore
from agentwake.store.sqlite import SqliteStore

T0 = "2026-12-03T08:00:00.000Z"
LEASE = "2026-12-03T08:01:00.000Z"
TICKETS = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
PASSWORD_ENV = "AGENTWAKE_TEST_STORE_PASSWORD"
WIDE = {"COLUMNS": "200"}
ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


async def fill(store: Store) -> None:
    """T-1 and T-2 held for approval, T-3 failed (a run that gave up), T-4 done by a run with a tool call."""
    await store.register(TICKETS)
    events = [
        IncomingEvent(f"T-{n}", "ticket.created", T0, {"ticketId": f"T-{n}", "n": n}) for n in range(1, 5)
    ]
    await store.ingest(TICKETS, events, "4")
    claimed = {e.event_id: e for e in await store.claim(10, T0, lease_until=LEASE)}
    hold = {"action": "approve", "rule": "hold", "why": "a person decides"}
    await store.settle([Settlement(claimed[e].id, hold, "held") for e in ("T-1", "T-2")])
    for event_id, verdict in (
        ("T-3", EventVerdict("failed", error="gave up")),
        ("T-4", EventVerdict("done")),
    ):
        event = claimed[event_id]
        run = await store.start_run(
            event.id,
            kind="agent",
            attempt=event.attempts,
            model="agentwake/offline",
            decision={"action": "agent", "rule": "triage", "tools": ["demo__add_comment"]},
            system_prompt="system",
            user_prompt="user",
        )
        record = ToolCallRecord(
            1, "c1", "demo__add_comment", "demo", "add_comment", {"id": 1}, "sent", None, None
        )
        row = await store.journal_tool_call(run, record, f"key-{event_id}")
        await store.settle_tool_call(row, status="ok", result="commented", reply="done", duration_ms=3)
        progress = RunProgress([{"role": "assistant", "content": f"Handled {event_id}."}], 1, 10, 5, None)
        await store.finish_run(
            run,
            status="completed" if verdict.state == "done" else "failed",
            reason=verdict.error,
            progress=progress,
            duration_ms=12,
            verdict=verdict,
        )


async def fill_sqlite(path: Path) -> None:
    store = await SqliteStore.open(path)
    try:
        await fill(store)
    finally:
        await store.close()


async def fill_postgres(url: str) -> None:
    store = await PostgresStore.open(url)
    try:
        await fill(store)
    finally:
        await store.close()


def agentwake(
    config: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentwake.cli", *args, "-c", str(config)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, **WIDE, **(env or {})},
    )


def postgres_config(folder: Path, url: str, password_env: str | None = PASSWORD_ENV) -> Path:
    folder.mkdir(exist_ok=True)
    config = folder / "agentwake.toml"
    line = f'password_env = "{password_env}"\n' if password_env else ""
    config.write_text(f'[store]\nurl = "{url}"\n{line}')
    return config


# What only the backend decides: the store's size line, and its "store" object in JSON.
STORE_SIZE = re.compile(r"store: [^\n]*?, oldest")
STORE_JSON = re.compile(r'\n  "store": \{.*?\n  \}', re.S)


def timeless(text: str) -> str:
    """Output with the times the stores took from the clock (when each was filled) blanked, and the
    store's size (a SQLite file and a PostgreSQL database differ in it) left out."""
    return STORE_JSON.sub("", STORE_SIZE.sub("store: <size>, oldest", ISO.sub("<time>", text)))


class Both:
    """A config on a SQLite store and one on a PostgreSQL store, holding the same events."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        sqlite_folder = tmp_path / "sqlite"
        sqlite_folder.mkdir()
        anyio.run(fill_sqlite, sqlite_folder / "aw.db")
        self.sqlite = sqlite_folder / "agentwake.toml"
        self.sqlite.write_text('[store]\npath = "aw.db"\n')
        anyio.run(fill_postgres, url)
        # The test server trusts this user: any password does, and one is passed all the same.
        self.postgres = postgres_config(tmp_path / "postgres", url)
        self.env = {PASSWORD_ENV: "not-needed-here"}

    def run(self, *args: str) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        return agentwake(self.sqlite, *args), agentwake(self.postgres, *args, env=self.env)

    def same(self, *args: str) -> str:
        """Run the command on both stores: the same exit code 0 and the same output; that output."""
        on_sqlite, on_postgres = self.run(*args)
        assert on_sqlite.returncode == 0, on_sqlite.stderr
        assert on_postgres.returncode == 0, on_postgres.stderr
        assert timeless(on_postgres.stdout) == timeless(on_sqlite.stdout)
        assert timeless(on_postgres.stderr) == timeless(on_sqlite.stderr)
        return on_postgres.stdout


@pytest.fixture
def both(tmp_path: Path, postgres_url: str) -> Both:
    return Both(tmp_path, postgres_url)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, postgres_server: PostgresServer) -> Iterator[Both]:
    """Both stores, for the tests that only read them."""
    url = postgres_server.create_database()
    try:
        yield Both(tmp_path_factory.mktemp("cli-postgres"), url)
    finally:
        if postgres_server.running():
            postgres_server.drop_database(url)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


# ---- the same output on both backends -------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["status", "--json", "--with-service"],
        ["inbox"],
        ["inbox", "--json"],
        ["inbox", "--state", "held"],
        ["actions"],
        ["actions", "--json"],
        ["show", "T-4"],
        ["show", "T-3", "--json"],
        ["approvals"],
        ["approvals", "--json"],
    ],
    ids=" ".join,
)
def test_the_read_only_commands_print_the_same_on_postgresql(shared: Both, command: list[str]) -> None:
    shown = shared.same(*command)
    assert shown.strip()


def test_the_views_show_the_stored_events(shared: Both) -> None:
    both = shared
    [row] = json.loads(both.same("status", "--json"))
    assert (row["subscription"], row["events_failed"], row["events_done"]) == ("tickets", 1, 1)
    assert [h["event_id"] for h in json.loads(both.same("approvals", "--json"))] == ["T-1", "T-2"]
    event = json.loads(both.same("show", "T-4", "--json"))
    assert event["state"] == "done" and [c["call_id"] for c in event["runs"][0]["tool_calls"]] == ["c1"]


def test_approve_deny_and_retry_answer_a_postgresql_store_as_they_answer_sqlite(both: Both) -> None:
    assert "approved T-1" in both.same("approve", "T-1", "--note", "looks fine")
    assert "denied T-2" in both.same("deny", "T-2", "--reason", "not ours")
    assert "requeued T-3" in both.same("retry", "T-3")
    states = {e["event_id"]: e["state"] for e in json.loads(both.same("inbox", "--json"))}
    assert states == {"T-1": "pending", "T-2": "denied", "T-3": "pending", "T-4": "done"}
    assert json.loads(both.same("approvals", "--json")) == []
    # Refusals are the same too: an answered event is not held any more.
    on_sqlite, on_postgres = both.run("approve", "T-2")
    assert on_sqlite.returncode == on_postgres.returncode == 1
    assert one_error_line(on_postgres) == one_error_line(on_sqlite)
    on_sqlite, on_postgres = both.run("show", "T-9")
    assert on_sqlite.returncode == on_postgres.returncode == 1
    assert one_error_line(on_postgres) == one_error_line(on_sqlite)


def test_rotate_secret_names_the_postgresql_database_without_a_password(
    both: Both, postgres_url: str
) -> None:
    done = agentwake(both.postgres, "rotate-secret", env=both.env)
    assert done.returncode == 2
    line = one_error_line(done)
    dbname = PostgresServer.dbname(postgres_url)
    assert f'no webhook subscription in PostgreSQL database "{dbname}" on 127.0.0.1:' in line


# ---- a store the CLI cannot use ------------------------------------------------------------------------


def locked_url(server: PostgresServer, url: str) -> str:
    """``url`` as the user that must give its password."""
    return server.url(PostgresServer.dbname(url), user=PASSWORD_USER)


@pytest.mark.parametrize("command", [["status"], ["inbox"], ["approvals", "--json"], ["approve", "T-1"]])
def test_a_wrong_password_is_one_error_line_without_the_password(
    tmp_path: Path, postgres_server: PostgresServer, postgres_url: str, command: list[str]
) -> None:
    anyio.run(fill_postgres, postgres_url)
    config = postgres_config(tmp_path / "pg", locked_url(postgres_server, postgres_url))
    wrong = "Wr0ng-pa55word-plugh"
    done = agentwake(config, *command, env={PASSWORD_ENV: wrong})
    assert done.returncode == 1, done.stderr
    line = one_error_line(done)
    assert "authentication" in line and "failed" in line
    assert wrong not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr
    assert done.stdout == ""
    right = agentwake(config, *command, env={PASSWORD_ENV: PASSWORD})
    assert right.returncode == 0, right.stderr
    assert PASSWORD not in right.stdout + right.stderr


@pytest.mark.parametrize("command", [["status"], ["actions", "--json"], ["retry", "T-3"]])
def test_an_unreachable_server_is_one_error_line(tmp_path: Path, command: list[str]) -> None:
    config = postgres_config(tmp_path, f"postgresql://agentwake@127.0.0.1:{free_port()}/nowhere")
    secret = "An0ther-pa55word"
    done = agentwake(config, *command, env={PASSWORD_ENV: secret})
    assert done.returncode == 1, done.stderr
    line = one_error_line(done)
    assert "cannot be reached" in line and '"nowhere"' in line
    assert secret not in done.stderr


@pytest.mark.parametrize("command", [["status"], ["show", "T-1"], ["deny", "T-1"]])
def test_an_unset_password_variable_is_a_clear_error(
    tmp_path: Path, postgres_url: str, command: list[str]
) -> None:
    config = postgres_config(tmp_path, postgres_url)
    env = {k: v for k, v in os.environ.items() if k != PASSWORD_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", *command, "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**env, **WIDE},
    )
    assert done.returncode == 1, done.stderr
    line = one_error_line(done)
    assert f"{PASSWORD_ENV} ([store] password_env) is not set" in line


def test_a_password_in_the_url_is_a_config_error_that_does_not_show_it(tmp_path: Path) -> None:
    config = postgres_config(tmp_path, "postgresql://aw:hunter2@127.0.0.1:5432/aw", password_env=None)
    for command in (["status"], ["approve", "T-1"]):
        done = agentwake(config, *command)
        assert done.returncode == 2
        assert "must not hold a password" in done.stderr
        assert "hunter2" not in done.stdout + done.stderr


def test_an_empty_database_is_no_store_yet(tmp_path: Path, postgres_url: str) -> None:
    done = agentwake(postgres_config(tmp_path, postgres_url), "status", env={PASSWORD_ENV: "x"})
    assert done.returncode == 1
    assert "no agentwake store in" in one_error_line(done)


# ---- what status loads, and check ----------------------------------------------------------------------

PROBE = """
import sys
sys.argv = ["agentwake", *sys.argv[1:]]
import agentwake.cli
try:
    agentwake.cli.main()
except SystemExit as exc:
    code = exc.code
print("\\nPROBE", code, "psycopg" in sys.modules, "pydantic" in sys.modules)
"""


def probe(config: Path, env: dict[str, str] | None = None) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "status", "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    return done.stdout.strip().splitlines()[-1].split()


def test_status_on_sqlite_loads_no_psycopg_and_on_postgresql_it_does(shared: Both) -> None:
    assert probe(shared.sqlite) == ["PROBE", "0", "False", "False"]
    assert probe(shared.postgres, shared.env) == ["PROBE", "0", "True", "True"]


def test_check_opens_a_postgresql_store_and_reports_what_stops_it(
    tmp_path: Path, postgres_server: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentwake.cli.checking import CheckReport, check_store

    def findings(url: str, password: str | None) -> list[dict[str, Any]]:
        if password is None:
            monkeypatch.delenv(PASSWORD_ENV, raising=False)
        else:
            monkeypatch.setenv(PASSWORD_ENV, password)
        report = CheckReport()
        check_store(load_config(postgres_config(tmp_path, url)), report)
        return [f.to_json() for f in report.findings]

    assert findings(postgres_url, "any") == []  # no schema yet: `run` creates it
    anyio.run(fill_postgres, postgres_url)
    assert findings(postgres_url, "any") == []
    locked = locked_url(postgres_server, postgres_url)
    assert findings(locked, PASSWORD) == []
    [wrong] = findings(locked, "Wr0ng-pa55word-plugh")
    assert wrong["kind"] == "store" and "authentication" in wrong["message"]
    assert "Wr0ng" not in json.dumps(wrong)
    [unset] = findings(postgres_url, None)
    assert "is not set" in unset["message"]


# ---- finding the store without validating the rest -------------------------------------------------


def test_locate_store_finds_a_postgresql_store_and_names_it_without_user_or_password(tmp_path: Path) -> None:
    from agentwake.configfile import locate_store

    config = tmp_path / "agentwake.toml"
    config.write_text(
        '[store]\nurl = "postgresql://aw@${DB_HOST}:5433/agentwake"\npassword_env = "AW_PW"\n'
        "[agent]\nnot_a_key = 1\n"  # the rest is not validated here
    )
    location = locate_store(config, env={"DB_HOST": "db.example"})
    assert (location.url, location.password_env) == ("postgresql://aw@db.example:5433/agentwake", "AW_PW")
    assert location.name == 'PostgreSQL database "agentwake" on db.example:5433'
    sqlite = tmp_path / "sqlite.toml"
    sqlite.write_text('[store]\npath = "aw.db"\n')
    assert locate_store(sqlite).url is None and locate_store(sqlite).name == str(tmp_path / "aw.db")


@pytest.mark.parametrize(
    "store",
    [
        'url = "postgresql://aw:hunter2@db.example/aw"',
        'url = "mysql://aw@db.example/aw"',
        'url = "postgresql://aw@db.example/aw"\npath = "aw.db"',
        'password_env = "AW_PW"',
        'url = "postgresql://aw@db.example/aw"\npassword_env = " "',
        "url = 5",
    ],
)
def test_locate_store_refuses_what_load_config_refuses_with_the_same_words(
    tmp_path: Path, store: str
) -> None:
    from agentwake.configfile import locate_store
    from agentwake.errors import ConfigError

    config = tmp_path / "agentwake.toml"
    config.write_text(f"[store]\n{store}\n")
    with pytest.raises(ConfigError) as located:
        locate_store(config)
    with pytest.raises(ConfigError) as loaded:
        load_config(config)
    assert str(located.value) == str(loaded.value)
    assert "hunter2" not in str(located.value)


def test_status_shows_which_process_drives_each_subscription(tmp_path: Path, postgres_url: str) -> None:
    async def hold() -> None:
        store = await PostgresStore.open(postgres_url)
        try:
            await store.register(TICKETS)
            lapsed = SubscriptionKey("alerts", "demo", "alert.fired", {})
            await store.register(lapsed)
            await store.hold_subscriptions("host-a:41:c0ffee", ["tickets"], "2999-01-01T00:00:00.000Z", T0)
            await store.hold_subscriptions("host-b:42:beef00", ["alerts"], "2000-01-01T00:00:00.000Z", T0)
        finally:
            await store.close()

    anyio.run(hold)
    config = postgres_config(tmp_path / "postgres", postgres_url)
    env = {PASSWORD_ENV: "not-needed-here"}
    shown = agentwake(config, "status", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "host-a:41:c0ffee drives 1 subscription(s): tickets" in shown.stdout
    assert "host-b" not in shown.stdout  # its lease lapsed: nobody drives alerts now
    rows = {r["subscription"]: r for r in json.loads(agentwake(config, "status", "--json", env=env).stdout)}
    assert (rows["tickets"]["driven_by"], rows["tickets"]["lease_until"]) == (
        "host-a:41:c0ffee",
        "2999-01-01T00:00:00.000Z",
    )
    assert rows["alerts"]["driven_by"] is None
