"""The kill switch: `agentwake pause` and `resume` for everything, a server, a subscription or a rule.

What is paused starts no agent run, across restarts and for every process on the store; its events
keep arriving and wait in 'pending'. `--now` cuts short the runs under way. The store's claims are
tested on both backends; the service end to end as a real `agentwake run` against the demo server
over stdio and the fake LLM on loopback, with the commands run as a user would, beside it.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from _stores import Backend, backend_fixture, store_fixture  # noqa: F401 - the fixtures backend, store
from _support import agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from fake_llm import FakeLLM, hold, text
from typer.testing import CliRunner

from agentwake.cli import app
from agentwake.demo.store import TicketStore
from agentwake.store import IncomingEvent, Store, SubscriptionKey

pytestmark = pytest.mark.anyio

TIMESTAMP = "2026-12-01T00:00:00Z"
WAIT_S = 90  # a hang guard on a busy machine, not a speed measure


async def stored(store: Store, subscription: str, server: str, *ids: str) -> None:
    key = SubscriptionKey(subscription, server, "ticket.created", {})
    await store.register(key)
    await store.ingest(key, [IncomingEvent(i, "ticket.created", TIMESTAMP, {"n": i}) for i in ids], "1")


async def claimed_ids(store: Store) -> set[str]:
    return {event.event_id for event in await store.claim(100)}


async def test_a_paused_server_subscription_or_everything_is_left_out_of_claims(store: Store) -> None:
    await stored(store, "tickets", "demo", "T-1")
    await stored(store, "alerts", "pager", "A-1")
    await stored(store, "other", "demo", "O-1")

    paused = await store.pause("server", "pager", reason="noisy", by="cli:amy", cut_short=False)
    assert (paused.scope, paused.name, paused.reason, paused.by, paused.cut_short) == (
        "server",
        "pager",
        "noisy",
        "cli:amy",
        False,
    )
    await store.pause("subscription", "other", reason=None, by="cli:amy", cut_short=True)
    # A rule is known only once an event is decided: it does not keep events out of a claim.
    await store.pause("rule", "triage", reason=None, by="cli:amy", cut_short=False)
    assert await claimed_ids(store) == {"T-1"}

    assert {(p.scope, p.name) for p in await store.pauses()} == {
        ("server", "pager"),
        ("subscription", "other"),
        ("rule", "triage"),
    }
    # Pausing again replaces the reason; the pause keeps its time.
    again = await store.pause("server", "pager", reason="still noisy", by="cli:bob", cut_short=False)
    assert (again.reason, again.by, again.at) == ("still noisy", "cli:bob", paused.at)

    lifted = await store.resume("server", "pager")
    assert lifted is not None and lifted.reason == "still noisy"
    assert await store.resume("server", "pager") is None
    assert await claimed_ids(store) == {"A-1"}

    await store.pause("all", "", reason="incident", by="cli:amy", cut_short=False)
    await store.resume("subscription", "other")
    assert await claimed_ids(store) == set()
    await store.resume("all", "")
    assert await claimed_ids(store) == {"O-1"}


async def test_pauses_are_shared_by_every_process_on_the_store(backend: Backend) -> None:
    first, second = await backend.open(), await backend.open()
    try:
        await stored(first, "tickets", "demo", "T-1")
        await first.pause("subscription", "tickets", reason=None, by="cli:amy", cut_short=False)
        assert await claimed_ids(second) == set()
        assert [p.name for p in await second.pauses()] == ["tickets"]
        await second.resume("subscription", "tickets")
        assert await claimed_ids(first) == {"T-1"}
    finally:
        await first.close()
        await second.close()


# ---- the commands --------------------------------------------------------------------------------


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def flat(text_: str) -> str:
    return " ".join(text_.split())


def project(tmp_path: Path, llm_url: str, *, policy: str | None = None) -> Path:
    config = tmp_path / "agentwake.toml"
    policies = ""
    if policy is not None:
        (tmp_path / "policies").mkdir()
        (tmp_path / "policies" / "rules.toml").write_text(policy)
        policies = '[policy]\ndir = "policies"\n\n'
    config.write_text(
        '[store]\npath = "aw.db"\n\n[service]\nlisten = "127.0.0.1:0"\n\n'
        + policies
        + fake_agent_toml(llm_url, llm_retries=0, concurrency=2)
        + "\n"
        + demo_server_toml(tmp_path / "demo.db")
        + '\n[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\n'
        'delivery = "poll"\npoll_floor_ms = 100\n'
    )
    return config


def new_tickets(tmp_path: Path, count: int, label: str) -> None:
    tickets = TicketStore(tmp_path / "demo.db")
    tickets.create([("support", "P2", f"{label} {n}", "body", "amy@example.com") for n in range(count)])
    tickets.close()


def states(tmp_path: Path) -> dict[str, int]:
    with sqlite3.connect(tmp_path / "aw.db") as db:
        return dict(db.execute("SELECT state, count(*) FROM events GROUP BY state").fetchall())


def runs(tmp_path: Path) -> list[tuple[str, str, str | None]]:
    with sqlite3.connect(tmp_path / "aw.db") as db:
        rows = db.execute(
            "SELECT e.event_id, r.status, r.reason FROM runs r JOIN events e ON e.id = r.event_row ORDER BY r.id"
        ).fetchall()
    return [(str(a), str(b), c) for a, b, c in rows]


async def until(check: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(WAIT_S):
        while not check():  # noqa: ASYNC110 - another process writes the store: nothing signals
            await anyio.sleep(0.05)


def endpoint(lines: list[str], index: int) -> str:
    found = re.search(r"listening on (http://\S+)", lines[index])
    assert found is not None
    return found.group(1)


def test_the_commands_say_what_is_wrong_with_their_flags(tmp_path: Path) -> None:
    config = project(tmp_path, "http://127.0.0.1:9/v1")
    missing = cli("pause", "-c", str(config))
    assert missing.exit_code == 1 and "run 'agentwake run' first" in flat(missing.output)
    start_from_cursor(config)  # the store exists now

    both = cli("pause", "--server", "demo", "--rule", "x", "-c", str(config))
    assert both.exit_code == 2 and "at most one of --server, --subscription and --rule" in flat(both.output)
    unknown = cli("pause", "--server", "nope", "-c", str(config))
    assert unknown.exit_code == 2
    assert "no server named 'nope' in the configuration (known: demo)" in flat(unknown.output)
    no_rule = cli("resume", "--rule", "nope", "-c", str(config))
    assert no_rule.exit_code == 2 and "no rule named 'nope'" in flat(no_rule.output)
    too_long = cli("pause", "--reason", "x" * 501, "-c", str(config))
    assert too_long.exit_code == 2 and "at most 500 characters" in flat(too_long.output)

    done = cli("pause", "--server", "demo", "--reason", "maintenance", "--json", "-c", str(config))
    assert done.exit_code == 0, done.output
    shown = json.loads(done.output)
    assert (shown["scope"], shown["name"], shown["reason"]) == ("server", "demo", "maintenance")
    assert shown["by"].startswith("cli:") and shown["cut_short"] is False
    assert "was not paused" in cli("resume", "-c", str(config)).output
    resumed = cli("resume", "--server", "demo", "-c", str(config))
    assert resumed.exit_code == 0 and "resumed server demo" in resumed.output
    for command in ("pause", "resume"):
        assert cli(command, "--help").exit_code == 0


async def test_a_paused_subscription_runs_nothing_until_resumed_across_a_restart(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        fake.responder = lambda body: text("looked at it")
        config = project(tmp_path, fake.url)
        new_tickets(tmp_path, 2, "before")
        start_from_cursor(config)
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            url = endpoint(service.lines, await service.wait_for("service endpoint listening on"))
            await until(lambda: states(tmp_path).get("done") == 2, "the first two events run")

            paused = cli("pause", "--subscription", "tickets", "--reason", "too noisy", "-c", str(config))
            assert paused.exit_code == 0, paused.output
            assert "paused subscription tickets" in flat(paused.output)
            await service.wait_for("paused: subscription tickets", "too noisy")
            asked = len(fake.requests)
            new_tickets(tmp_path, 3, "while paused")
            await until(lambda: states(tmp_path).get("pending") == 3, "three events wait")
            assert len(fake.requests) == asked

            async with httpx.AsyncClient() as http:
                ready = await http.get(f"{url}/readyz")
                assert ready.status_code == 200, ready.text
                assert {"scope": "subscription", "name": "tickets"}.items() <= ready.json()["paused"][
                    0
                ].items()
                scraped = (await http.get(f"{url}/metrics")).text
                assert 'agentwake_paused{name="tickets",scope="subscription"} 1.0' in scraped or (
                    'agentwake_paused{scope="subscription",name="tickets"} 1.0' in scraped
                )
            status = cli("status", "--json", "-c", str(config))
            [row] = json.loads(status.output)
            assert row["pause"]["reason"] == "too noisy" and row["events_pending"] == 3
            assert "paused: subscription tickets" in flat(cli("status", "-c", str(config)).output)

            # Paused across a restart: the pause lives in the store.
            assert await service.stop() == 0
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await service.wait_for("paused: subscription tickets")
            assert states(tmp_path).get("pending") == 3 and len(fake.requests) == asked
            resumed = cli("resume", "--subscription", "tickets", "-c", str(config))
            assert resumed.exit_code == 0 and "resumed subscription tickets" in resumed.output
            await service.wait_for("resumed: subscription tickets")
            await until(lambda: states(tmp_path).get("done") == 5, "the waiting events run")
            assert await service.stop() == 0
        assert len(fake.requests) == asked + 3


async def test_pause_now_cuts_short_a_run_under_way_and_its_event_waits(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        fake.script(hold())
        config = project(tmp_path, fake.url)
        new_tickets(tmp_path, 1, "slow")
        start_from_cursor(config)
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await fake.wait_for_requests(1, timeout=WAIT_S)
            paused = cli("pause", "--now", "--reason", "stop it", "-c", str(config))
            assert paused.exit_code == 0 and "cut short" in paused.output
            await service.wait_for("its run is cut short", "everything")
            await until(lambda: states(tmp_path) == {"pending": 1}, "the event waits")
            [(_, status, reason)] = runs(tmp_path)
            assert status == "interrupted" and reason is not None
            assert reason.startswith("paused: everything (paused by cli:") and "stop it" in reason
            fake.responder = lambda body: text("done now")
            fake.release()
            assert cli("resume", "-c", str(config)).exit_code == 0
            await until(lambda: states(tmp_path) == {"done": 1}, "the event runs once resumed")
            assert [status for _, status, _ in runs(tmp_path)] == ["interrupted", "completed"]
            assert await service.stop() == 0


RULES = """
[[rules]]
name = "triage"
action = "agent"
match.event = "ticket.created"
"""


def given_back(tmp_path: Path) -> list[int]:
    """The attempts of the events waiting in pending until a set time: decided, and given back."""
    with sqlite3.connect(tmp_path / "aw.db") as db:
        rows = db.execute(
            "SELECT attempts FROM events WHERE state = 'pending' AND available_at IS NOT NULL"
        ).fetchall()
    return [int(row[0]) for row in rows]


async def test_a_paused_rule_gives_its_events_back_until_resumed(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        fake.responder = lambda body: text("triaged")
        config = project(tmp_path, fake.url, policy=RULES)
        start_from_cursor(config)
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as service:
            await service.wait_for("service endpoint listening on")
            assert cli("pause", "--rule", "triage", "-c", str(config)).exit_code == 0
            await service.wait_for("paused: rule triage")
            new_tickets(tmp_path, 2, "for triage")
            await until(lambda: len(given_back(tmp_path)) == 2, "decided and given back")
            assert all(attempts == 0 for attempts in given_back(tmp_path))
            assert fake.requests == []
            assert cli("resume", "--rule", "triage", "-c", str(config)).exit_code == 0
            await until(lambda: states(tmp_path).get("done") == 2, "they run once the rule is resumed")
            assert await service.stop() == 0
