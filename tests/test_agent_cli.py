"""The agent's command line: actions, show, replay, and status with run counts, on a store with real runs.

The store is built by running the real agent once: the demo server over stdio, AgentRunner with a
ConnectionPool holding a live ServerConnection, and litellm talking HTTP to the fake LLM on loopback.

Where the fake LLM runs: ``agentwake replay`` calls ``anyio.run`` itself, so it has to be invoked
from a plain (sync) test, and the fake LLM must be served by an event loop that keeps running while
the CLI blocks the test's thread. So FakeLLM lives in a blocking portal: anyio's event loop in a
background thread, entered with ``portal.wrap_async_context_manager``; the test talks to it with
``portal.call``. The one-off agent run that builds the store uses ``anyio.run`` in the test's thread,
against that same background fake. ``test_the_agent_run_*`` instead runs in an anyio test with the fake
in its own loop, the way the service would.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from conftest import REPO, demo_stdio
from fake_llm import FakeLLM, Reply, error, text, tool_calls
from rich.console import Console
from typer.testing import CliRunner

from agentwake import cli
from agentwake.agent.runner import AgentRunner, RunResult
from agentwake.agent.tools import ConnectionPool
from agentwake.cli import app
from agentwake.clock import utc_now
from agentwake.config import AgentwakeConfig, load_config
from agentwake.decide import decide
from agentwake.delivery.poll import subscription_key
from agentwake.mcp import ServerConnection
from agentwake.service import load_service_policy
from agentwake.store import (
    EventVerdict,
    IncomingEvent,
    RunProgress,
    Settlement,
    SubscriptionKey,
    ToolCallRecord,
    open_store,
)
from agentwake.store.sqlite import SqliteCore
from agentwake.worker import Worker

runner = CliRunner()
KEY_ENV = "AGENTWAKE_TEST_LLM_KEY"
COMMENT = "Category: hardware. Urgency: high."
FINAL = "Ticket triaged: hardware, high urgency; comment added."
TIMESTAMP = "2026-01-02T03:04:05Z"
# See test_agent_units.py: pydantic warns once about a litellm model it builds lazily.
LITELLM_MODELS = pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def write_config(
    folder: Path, api_base: str, *, agent: bool = True, prompts: Path = REPO / "prompts"
) -> Path:
    demo = demo_stdio(folder / "demo.db", DEMO_BACKLOG="1")
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in demo.env.items())
    agent_section = f"""
[agent]
model = "openai/fake"
api_base = {json.dumps(api_base)}
api_key_env = "{KEY_ENV}"
prompts = {json.dumps(str(prompts))}
llm_retries = 0
max_steps = 4
timeout_s = 60
"""
    tools = 'tools = ["demo__add_comment"]' if agent else ""
    text_ = f"""
[store]
path = "aw.db"
{agent_section if agent else ""}
[servers.demo]
command = {json.dumps(demo.command)}
args = {json.dumps(demo.args)}
cwd = {json.dumps(str(demo.cwd))}
env = {{ {env} }}

[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
arguments = {{ queue = "support" }}
{tools}
"""
    path = folder / "agentwake.toml"
    path.write_text(text_)
    return path


def demo_db(cfg: AgentwakeConfig) -> Path:
    return Path(cfg.servers["demo"].env["DEMO_DB"])


def first_ticket(db: Path) -> tuple[str, str]:
    with sqlite3.connect(db) as conn:
        ticket_id, title = conn.execute("SELECT id, title FROM tickets ORDER BY seq LIMIT 1").fetchone()
    return str(ticket_id), str(title)


def comments(db: Path, ticket_id: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT body FROM comments WHERE ticket_id = ? ORDER BY id", [ticket_id]
        ).fetchall()
    return [r[0] for r in rows]


def ticket_status(db: Path, ticket_id: str) -> str:
    with sqlite3.connect(db) as conn:
        return str(conn.execute("SELECT status FROM tickets WHERE id = ?", [ticket_id]).fetchone()[0])


@dataclass(frozen=True)
class AgentRun:
    config: Path
    demo_db: Path
    ticket_id: str
    title: str
    result: RunResult


async def run_agent_once(config: Path, script: Callable[..., None]) -> AgentRun:
    """Ingest the demo's first ticket as an event and run the real agent on it once (kind 'agent').

    ``script`` queues the fake LLM's replies; it is called once the ticket id is known.
    """
    cfg = load_config(config)
    sub = cfg.subscription("tickets")
    key: SubscriptionKey = subscription_key(sub)
    store = await open_store(cfg.store)
    try:
        await store.register(key)
        pool = ConnectionPool(call_timeout_s=30)
        async with ServerConnection("demo", cfg.servers["demo"]) as conn:
            await pool.attach(conn)
            # DEMO_BACKLOG=1: the server created one ticket before it answered the handshake.
            ticket_id, title = first_ticket(demo_db(cfg))
            data = {"ticketId": ticket_id, "queue": "support", "priority": "P2", "title": title}
            await store.ingest(key, [IncomingEvent(ticket_id, "ticket.created", TIMESTAMP, data)], "1")
            [event] = await store.claim(1)
            script(tool_calls(("demo__add_comment", {"ticket_id": ticket_id, "body": COMMENT})), text(FINAL))
            # As the service's worker does: decide, then run what was decided.
            outcome = await decide(
                event, config=cfg, policy=load_service_policy(cfg), now=utc_now(), flow=store
            )
            result = await AgentRunner.build(cfg, store, pool).run(outcome)
    finally:
        await store.close()
    return AgentRun(config, demo_db(cfg), ticket_id, title, result)


@dataclass
class BackgroundLLM:
    """A FakeLLM served from a background thread's event loop."""

    portal: BlockingPortal
    fake: FakeLLM

    def script(self, *replies: Reply) -> None:
        self.portal.call(self.fake.script, *replies)

    def requests(self) -> list[dict[str, Any]]:
        return self.portal.call(lambda: list(self.fake.requests))


@pytest.fixture
def llm() -> Iterator[BackgroundLLM]:
    with start_blocking_portal("asyncio") as portal, portal.wrap_async_context_manager(FakeLLM()) as fake:
        yield BackgroundLLM(portal, fake)


def ran_once(folder: Path, llm: BackgroundLLM) -> AgentRun:
    config = write_config(folder, llm.fake.url)
    run = anyio.run(run_agent_once, config, llm.script)
    assert run.result.status == "completed", run.result.reason
    return run


@pytest.fixture
def agent_run(tmp_path: Path, llm: BackgroundLLM, monkeypatch: pytest.MonkeyPatch) -> AgentRun:
    """A fresh store with one completed agent run; the fake LLM is still up for replays."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    return ran_once(tmp_path, llm)


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentRun]:
    """One agent run for the read-only commands, which cannot change it."""
    with (
        pytest.MonkeyPatch.context() as monkeypatch,
        start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(FakeLLM()) as fake,
    ):
        monkeypatch.setenv(KEY_ENV, "sk-test")
        yield ran_once(tmp_path_factory.mktemp("shared"), BackgroundLLM(portal, fake))


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


def as_json(*args: str) -> Any:
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


# ---- help, and what the CLI imports -----------------------------------------------------------


def test_the_module_runs_as_a_program_and_lists_the_agent_commands() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "agentwake.cli", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for command in ("run", "check", "status", "inbox", "actions", "show", "replay"):
        assert command in result.stdout


IMPORT_PROBE = """
import json, sys
import agentwake.cli
from typer.testing import CliRunner
codes = [CliRunner().invoke(agentwake.cli.app, args).exit_code for args in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "litellm": "litellm" in sys.modules}))
"""


def probe(*invocations: list[str]) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, json.dumps(list(invocations))],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    probed: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return probed


def test_help_does_not_import_litellm() -> None:
    probed = probe(["--help"], ["actions", "--help"], ["show", "--help"], ["replay", "--help"])
    assert probed == {"codes": [0, 0, 0, 0], "litellm": False}


def test_the_read_only_commands_do_not_import_litellm(shared_run: AgentRun) -> None:
    config = str(shared_run.config)
    probed = probe(
        ["status", "-c", config],
        ["status", "--json", "-c", config],
        ["inbox", "-c", config],
        ["actions", "-c", config],
        ["actions", "--json", "-c", config],
        ["show", shared_run.ticket_id, "-c", config],
    )
    assert probed == {"codes": [0] * 6, "litellm": False}


@pytest.mark.parametrize(
    ("command", "mentions"),
    [
        ("actions", ["--limit", "-n", "--json", "--config", "newest first"]),
        ("show", ["event_id", "The eventId", "--server", "--json", "--config", "transcript"]),
        ("replay", ["event_id", "stored event", "--dry-run", "--force", "--server", "--config", "planned"]),
    ],
)
def test_the_agent_commands_have_help_text(command: str, mentions: list[str]) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    for mention in mentions:
        assert mention in result.output, mention
    registered = {c.name or c.callback.__name__: c for c in app.registered_commands if c.callback}
    doc = (registered[command].callback.__doc__ or "").strip()
    assert doc and flat(doc.split("\n")[0])[:40] in flat(result.output)


# ---- the agent run itself ----------------------------------------------------------------------


@LITELLM_MODELS
@pytest.mark.anyio
async def test_the_agent_run_comments_on_the_ticket_and_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    async with FakeLLM() as fake:
        run = await run_agent_once(write_config(tmp_path, fake.url), fake.script)
    result = run.result
    assert (result.status, result.event_state, result.steps, result.final_text) == (
        "completed",
        "done",
        2,
        FINAL,
    )
    [call] = result.tool_calls
    assert (call.tool, call.server, call.name, call.status) == (
        "demo__add_comment",
        "demo",
        "add_comment",
        "ok",
    )
    assert comments(run.demo_db, run.ticket_id) == [COMMENT]
    # The LLM saw only the allowed tool, the event data inside the fence, and the tool result.
    first, second = fake.requests
    assert first["model"] == "fake"
    assert [t["function"]["name"] for t in first["tools"]] == ["demo__add_comment"]
    assert run.title in first["messages"][1]["content"] and "boundary=" in first["messages"][1]["content"]
    tool_reply = second["messages"][-1]
    assert tool_reply["role"] == "tool" and f"comment added to {run.ticket_id}" in tool_reply["content"]


# ---- actions, show, status ------------------------------------------------------------------------


def test_actions_json_summarises_each_run(shared_run: AgentRun) -> None:
    [row] = as_json("actions", "-c", str(shared_run.config))
    assert row["run_id"] == shared_run.result.run_id
    expected = {
        "event_id": shared_run.ticket_id,
        "server": "demo",
        "subscription": "tickets",
        "event": "ticket.created",
        "kind": "agent",
        "attempt": 1,
        "model": "openai/fake",
        "status": "completed",
        "reason": None,
        "steps": 2,
        "prompt_tokens": 20,  # the fake's 10 per call
        "completion_tokens": 10,
        "tool_calls": 1,
        "refused": 0,
        "tools": ["demo__add_comment"],
    }
    assert {k: row[k] for k in expected} == expected
    assert row["started_at"].endswith("Z") and isinstance(row["duration_ms"], int)


def test_actions_limit(shared_run: AgentRun) -> None:
    assert len(as_json("actions", "-n", "1", "-c", str(shared_run.config))) == 1
    result = invoke("actions", "--limit", "0", "-c", str(shared_run.config))
    assert result.exit_code == 2


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A console wide enough that rich does not fold the table's cells (it is 80 columns off a terminal)."""
    monkeypatch.setattr(cli, "out", Console(width=250, markup=False))  # as the CLI builds it


@pytest.mark.usefixtures("wide")
def test_actions_table(shared_run: AgentRun) -> None:
    result = invoke("actions", "-c", str(shared_run.config))
    assert result.exit_code == 0, result.output
    text_ = flat(result.output)
    assert "Agent runs (newest 20)" in text_
    for cell in ("tickets", shared_run.ticket_id, "agent", "completed", "demo__add_comment", "30"):
        assert cell in text_, cell


def test_show_prints_the_data_the_decision_and_the_transcript(shared_run: AgentRun) -> None:
    result = invoke("show", shared_run.ticket_id, "-c", str(shared_run.config))
    assert result.exit_code == 0, result.output
    text_ = flat(result.output)
    assert f"event {shared_run.ticket_id}" in text_
    assert "ticket.created from demo (subscription tickets)" in text_
    assert "state: done, attempts: 1" in text_
    assert flat(json.dumps(shared_run.title)) in text_  # the event data
    assert "decision: agent: rule 'default': no policy rules" in text_
    assert "model: openai/fake; allowed tools: demo__add_comment" in text_
    assert "steps: 2, tokens: 20 in / 10 out" in text_
    # The transcript: the tool call the model asked for, the result, the final answer.
    assert f'-> demo__add_comment({{"ticket_id": "{shared_run.ticket_id}", "body": "{COMMENT}"}})' in text_
    assert f"comment added to {shared_run.ticket_id}" in text_
    assert flat(FINAL) in text_
    assert (
        text_.index("system") < text_.index("user") < text_.index("-> demo__add_comment") < text_.index(FINAL)
    )


def test_show_json_has_the_event_and_every_run(shared_run: AgentRun) -> None:
    event = as_json("show", shared_run.ticket_id, "-c", str(shared_run.config))
    assert (event["event_id"], event["server"], event["subscription"], event["state"]) == (
        shared_run.ticket_id,
        "demo",
        "tickets",
        "done",
    )
    assert event["data"]["ticketId"] == shared_run.ticket_id and event["data"]["title"] == shared_run.title
    assert (
        isinstance(event["decision"], dict) and event["decision"]["action"] == "agent"
    )  # an object, as each run's
    [run] = event["runs"]
    assert run["decision"]["tools"] == ["demo__add_comment"]
    assert run["decision"]["allowlist"] == ["demo__add_comment"]
    assert [m["role"] for m in run["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert run["messages"][-1]["content"] == FINAL
    assert shared_run.title in run["user_prompt"] and run["system_prompt"]
    [call] = run["tool_calls"]
    assert call["arguments"] == {"ticket_id": shared_run.ticket_id, "body": COMMENT}
    assert call["status"] == "ok" and f"comment added to {shared_run.ticket_id}" in call["result"]


def test_show_of_an_unknown_event_says_so(shared_run: AgentRun) -> None:
    result = invoke("show", "T-999999", "-c", str(shared_run.config))
    assert result.exit_code == 1
    assert "no event with id 'T-999999' in the inbox" in flat(result.output)
    result = invoke("show", shared_run.ticket_id, "--server", "elsewhere", "-c", str(shared_run.config))
    assert result.exit_code == 1
    assert f"no event with id '{shared_run.ticket_id}' in the inbox from 'elsewhere'" in flat(result.output)


def test_show_asks_for_the_server_when_an_id_is_on_several(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", agent=False)
    store = SqliteCore.open(tmp_path / "aw.db")
    for server in ("demo", "mirror"):
        key = SubscriptionKey(f"tickets-{server}", server, "ticket.created", {})
        store.register(key)
        store.ingest(key, [IncomingEvent("T-1", "ticket.created", TIMESTAMP, {"from": server})], "1")
    store.close()
    result = invoke("show", "T-1", "-c", str(config))
    assert result.exit_code == 2
    assert "event id 'T-1' is on several servers (demo, mirror); pass --server" in flat(result.output)
    event = as_json("show", "T-1", "--server", "mirror", "-c", str(config))
    assert event["data"] == {"from": "mirror"} and event["runs"] == []
    assert "no agent run yet" in invoke("show", "T-1", "-s", "demo", "-c", str(config)).output


BRACKETED = "unexpected token [/INST] near [bold]"


def store_with_bracketed_text(folder: Path) -> Path:
    """An event whose data, and a failed run whose reason, hold text that looks like rich markup."""
    config = write_config(folder, "http://127.0.0.1:9/v1")
    store = SqliteCore.open(folder / "aw.db")
    key = SubscriptionKey("tickets", "demo", "ticket.created", {"queue": "support"})
    store.register(key)
    store.ingest(key, [IncomingEvent("T-1", "ticket.created", TIMESTAMP, {"title": BRACKETED})], "1")
    [event] = store.claim(1)
    run_id = store.start_run(
        event.id,
        kind="agent",
        attempt=1,
        model="openai/fake",
        decision={"action": "agent", "why": "test", "tools": []},
        system_prompt=None,
        user_prompt=None,
    )
    reason = f"LLM call failed: BadRequestError: {BRACKETED}"
    store.finish_run(
        run_id,
        status="failed",
        reason=reason,
        progress=RunProgress([], 1, 0, 0, None),
        duration_ms=5,
        verdict=EventVerdict("failed", reason),
    )
    store.close()
    return config


@pytest.mark.usefixtures("wide")
@pytest.mark.parametrize("command", [["inbox"], ["actions"], ["status"], ["show", "T-1"]])
def test_text_that_looks_like_markup_is_printed_as_it_is(tmp_path: Path, command: list[str]) -> None:
    config = store_with_bracketed_text(tmp_path)
    result = invoke(*command, "-c", str(config))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0
    assert BRACKETED in flat(result.output)


def test_the_json_output_keeps_text_that_looks_like_markup(tmp_path: Path) -> None:
    config = str(store_with_bracketed_text(tmp_path))
    assert as_json("inbox", "-c", config)[0]["data"] == {"title": BRACKETED}
    [action] = as_json("actions", "-c", config)
    assert action["status"] == "failed" and BRACKETED in action["reason"]
    assert BRACKETED in as_json("status", "-c", config)[0]["last_failure"]
    assert BRACKETED in as_json("show", "T-1", "-c", config)["runs"][0]["reason"]


def test_actions_lists_a_refused_tool_name_as_the_model_gave_it(tmp_path: Path) -> None:
    config = store_with_bracketed_text(tmp_path)
    store = SqliteCore.open(tmp_path / "aw.db")
    call = ToolCallRecord(1, "call_1", "close every ticket", None, None, {}, "refused", "refused", 0)
    store.record_progress(1, RunProgress([], 1, 0, 0, None), [call])
    store.close()
    [action] = as_json("actions", "-c", str(config))
    assert (action["tool_calls"], action["refused"]) == (1, 1)
    assert action["tools"] == ["close every ticket"]


def test_status_json_counts_events_and_runs(shared_run: AgentRun) -> None:
    [row] = as_json("status", "-c", str(shared_run.config))
    counts = {k: v for k, v in row.items() if k.startswith(("events_", "runs_"))}
    assert counts == {
        "events_received": 1,
        "events_pending": 0,
        "events_processing": 0,
        "events_done": 1,
        "events_failed": 0,
        "events_dead": 0,
        "events_ignored": 0,
        "events_held": 0,
        "events_denied": 0,
        "events_batched": 0,
        "events_rejected": 0,
        "runs_completed": 1,
        "runs_failed": 0,
        "runs_interrupted": 0,
        "runs_running": 0,
    }
    assert row["last_failure"] is None and row["configured"] is True


# ---- replay ------------------------------------------------------------------------------------


@LITELLM_MODELS
def test_replay_dry_run_plans_the_call_and_sends_nothing(agent_run: AgentRun, llm: BackgroundLLM) -> None:
    config, ticket_id = str(agent_run.config), agent_run.ticket_id
    before = comments(agent_run.demo_db, ticket_id)
    assert before == [COMMENT]
    llm.script(
        tool_calls(("demo__add_comment", {"ticket_id": ticket_id, "body": "second thoughts"})),
        text("I would add a comment."),
    )
    result = invoke("replay", ticket_id, "--dry-run", "-c", config)
    assert result.exit_code == 0, result.output
    text_ = flat(result.output)
    assert "(dry_run, attempt 1): completed" in text_
    # The decision and the plan come first, then the transcript.
    for line in (
        "verdict: run",
        "rule: default",
        "why: no policy rules",
        "model: openai/fake",
        "allowed tools: demo__add_comment",
        "prompts: system system.md.j2, user ticket.created.md.j2",
    ):
        assert line in text_, line
    assert text_.index("verdict: run") < text_.index("prompts: system") < text_.index("(dry_run, attempt 1)")
    assert "dry run: 1 planned tool call(s), none sent:" in text_
    assert f'demo__add_comment({{"ticket_id": "{ticket_id}", "body": "second thoughts"}})' in text_
    assert "I would add a comment." in text_
    # Nothing reached the server; the model was told the call was not sent.
    assert comments(agent_run.demo_db, ticket_id) == before
    tool_reply = llm.requests()[-1]["messages"][-1]
    assert tool_reply["role"] == "tool" and "planned, not sent" in tool_reply["content"]
    # The action log has the dry run, with its planned call, and the event is left as it was.
    newest, first = as_json("actions", "-c", config)
    assert first["run_id"] == agent_run.result.run_id
    assert (newest["kind"], newest["status"], newest["tools"], newest["event_id"]) == (
        "dry_run",
        "completed",
        ["demo__add_comment"],
        ticket_id,
    )
    event = as_json("show", ticket_id, "-c", config)
    assert event["state"] == "done" and event["attempts"] == 1
    assert [r["kind"] for r in event["runs"]] == ["agent", "dry_run"]
    [planned] = event["runs"][1]["tool_calls"]
    assert planned["status"] == "planned"
    assert planned["arguments"] == {"ticket_id": ticket_id, "body": "second thoughts"}
    # Replays are not the event's runs: status still counts one completed run.
    [row] = as_json("status", "-c", config)
    assert (row["runs_completed"], row["events_done"]) == (1, 1)


@LITELLM_MODELS
def test_replay_refuses_a_tool_outside_the_allowlist(agent_run: AgentRun, llm: BackgroundLLM) -> None:
    config, ticket_id = str(agent_run.config), agent_run.ticket_id
    llm.script(tool_calls(("demo__close_ticket", {"ticket_id": ticket_id})), text("I could not close it."))
    result = invoke("replay", ticket_id, "-c", config)
    assert result.exit_code == 0, result.output
    assert "refused: the tool 'demo__close_ticket' is not allowed for this event" in flat(result.output)
    assert ticket_status(agent_run.demo_db, ticket_id) == "open"
    request = llm.requests()[-2]
    assert [t["function"]["name"] for t in request["tools"]] == ["demo__add_comment"]
    newest = as_json("actions", "-n", "1", "-c", config)[0]
    assert (newest["kind"], newest["status"], newest["refused"], newest["tools"]) == (
        "replay",
        "completed",
        1,
        ["demo__close_ticket"],
    )
    assert as_json("show", ticket_id, "-c", config)["state"] == "done"


@LITELLM_MODELS
def test_replay_that_fails_exits_non_zero_with_the_reason(agent_run: AgentRun, llm: BackgroundLLM) -> None:
    llm.script(error(401, "Incorrect API key provided", type="invalid_request_error"))
    result = invoke("replay", agent_run.ticket_id, "-c", str(agent_run.config))
    assert result.exit_code == 1
    text_ = flat(result.output)
    assert "(replay, attempt 1): failed" in text_
    assert "reason: LLM call failed: AuthenticationError" in text_
    newest = as_json("actions", "-n", "1", "-c", str(agent_run.config))[0]
    assert (newest["kind"], newest["status"]) == ("replay", "failed")
    assert "AuthenticationError" in newest["reason"]
    [row] = as_json("status", "-c", str(agent_run.config))
    assert (row["runs_failed"], row["events_done"], row["last_failure"]) == (0, 1, None)


HOLD_TICKETS = """
[[rules]]
name = "hold-tickets"
action = "approve"
tools = ["demo__get_ticket"]
prompt = "held.md.j2"
model = "openai/held-model"
match.event = "ticket.created"
"""
SKIP_TICKETS = """
[[rules]]
name = "skip-tickets"
action = "ignore"
match.event = "ticket.created"
"""
HELD_TEMPLATE = "Held ticket {{ event.id }}, approved by a person.\n\n{{ event.data_block }}\n"


async def decide_one_ticket(config: Path) -> None:
    """Store ticket T-1 and let the service's worker decide it (no agent: it is held or ignored here)."""
    cfg = load_config(config)
    store = await open_store(cfg.store)
    try:
        key = subscription_key(cfg.subscription("tickets"))
        await store.register(key)
        data = {"ticketId": "T-1", "queue": "support", "title": "Printer on fire"}
        await store.ingest(key, [IncomingEvent("T-1", "ticket.created", TIMESTAMP, data)], "1")
        [event] = await store.claim(1)
        await Worker(cfg, store, policy=load_service_policy(cfg)).handle(event)
    finally:
        await store.close()


def decided_by(folder: Path, llm: BackgroundLLM, policy: str) -> Path:
    """A config with this policy file (and a held.md.j2 prompt), whose store holds T-1 as the policy decided it."""
    prompts = folder / "prompts"
    shutil.copytree(REPO / "prompts", prompts)
    (prompts / "held.md.j2").write_text(HELD_TEMPLATE)
    (folder / "policies").mkdir()
    (folder / "policies" / "10-test.toml").write_text(policy)
    config = write_config(folder, llm.fake.url, prompts=prompts)
    anyio.run(decide_one_ticket, config)
    return config


def offered_tools(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


@pytest.fixture
def held(tmp_path: Path, llm: BackgroundLLM, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The config of a store where an approve rule holds T-1."""
    monkeypatch.setenv(KEY_ENV, "sk-test")
    config = decided_by(tmp_path, llm, HOLD_TICKETS)
    assert as_json("show", "T-1", "-c", str(config))["state"] == "held"
    return config


def test_replay_of_an_event_held_for_approval_is_refused_naming_the_rule(
    held: Path, llm: BackgroundLLM
) -> None:
    result = invoke("replay", "T-1", "-c", str(held))
    assert result.exit_code == 1
    text_ = flat(result.output)
    assert "error: event 'T-1' is held for approval by rule 'hold-tickets'" in text_
    assert "agentwake approve T-1" in text_ and "pass --force" in text_
    assert llm.requests() == []  # refused before any LLM call
    assert as_json("actions", "-c", str(held)) == []


@LITELLM_MODELS
def test_replay_with_force_runs_a_held_event_with_its_rules_tools(held: Path, llm: BackgroundLLM) -> None:
    llm.script(text("I only looked."))
    result = invoke("replay", "T-1", "--force", "-c", str(held))
    assert result.exit_code == 0, result.output
    text_ = flat(result.output)
    assert "verdict: run (forced past the policy with --force)" in text_
    assert "rule: hold-tickets (10-test.toml:2)" in text_ and "forced past hold" in text_
    [request] = llm.requests()
    assert offered_tools(request) == ["demo__get_ticket"]  # the rule's, not the subscription's
    event = as_json("show", "T-1", "-c", str(held))
    assert event["state"] == "held"  # a replay leaves the event as it was
    assert [(r["kind"], r["status"]) for r in event["runs"]] == [("replay", "completed")]


@LITELLM_MODELS
def test_an_approved_event_replays_with_its_rules_tools_prompt_and_model(
    held: Path, llm: BackgroundLLM
) -> None:
    assert invoke("approve", "T-1", "-c", str(held)).exit_code == 0
    llm.script(text("Looked at it."))
    result = invoke("replay", "T-1", "-c", str(held))
    assert result.exit_code == 0, result.output
    text_ = flat(result.output)
    assert "verdict: run" in text_ and "forced" not in text_
    assert "rule: hold-tickets" in text_ and "approved by a person" in text_
    assert "model: openai/held-model" in text_
    assert "prompts: system system.md.j2, user held.md.j2" in text_
    [request] = llm.requests()
    assert request["model"] == "held-model"
    assert offered_tools(request) == ["demo__get_ticket"]
    assert "Held ticket T-1, approved by a person." in request["messages"][1]["content"]


def test_replay_of_an_ignored_event_is_refused(
    tmp_path: Path, llm: BackgroundLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-test")
    config = decided_by(tmp_path, llm, SKIP_TICKETS)
    assert as_json("show", "T-1", "-c", str(config))["state"] == "ignored"
    result = invoke("replay", "T-1", "-c", str(config))
    assert result.exit_code == 1
    text_ = flat(result.output)
    assert "is not run by the policy: ignore by rule 'skip-tickets'" in text_ and "pass --force" in text_
    assert llm.requests() == []


def test_replay_of_an_unknown_event_says_so(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1")
    SqliteCore.open(tmp_path / "aw.db").close()
    result = invoke("replay", "T-404", "-c", str(config))
    assert result.exit_code == 1
    assert "no event with id 'T-404' in the inbox" in flat(result.output)


def test_replay_needs_an_agent_section(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", agent=False)
    result = invoke("replay", "T-1", "-c", str(config))
    assert result.exit_code == 2
    assert "section; add one with at least 'model'" in flat(result.output)


def test_error_messages_keep_their_square_brackets(tmp_path: Path) -> None:
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", agent=False)
    result = invoke("replay", "T-1", "-c", str(config))
    assert "has no [agent] section" in flat(result.output)


def test_the_agent_commands_need_a_store(tmp_path: Path) -> None:
    config = str(write_config(tmp_path, "http://127.0.0.1:9/v1"))
    for args in (["actions"], ["show", "T-1"], ["replay", "T-1"]):
        result = invoke(*args, "-c", config)
        assert result.exit_code == 1, args
        assert "run 'agentwake run' first" in flat(result.output)
    assert not os.path.exists(tmp_path / "aw.db")


def test_show_prints_the_decision_the_denial_and_the_approval_note_of_events_without_a_run(
    tmp_path: Path,
) -> None:
    """The text view says what `--json` says for events no run has touched: the rule and why, a
    person's denial with its note, and an approval's note; not just "no agent run yet"."""
    config = write_config(tmp_path, "http://127.0.0.1:9/v1", agent=False)
    store = SqliteCore.open(tmp_path / "aw.db")
    key = SubscriptionKey("tickets", "demo", "ticket.created", {})
    store.register(key)
    ids = ("T-1", "T-2", "T-3", "T-4")
    store.ingest(key, [IncomingEvent(i, "ticket.created", TIMESTAMP, {"n": i}) for i in ids], "1")
    rows = {event.event_id: event.id for event in store.claim(4)}
    hold = {"action": "approve", "rule": "hold-suspicious", "why": "injection score 0.9"}
    store.settle(
        [
            Settlement(rows["T-1"], {"action": "ignore", "rule": "ignore-bots", "why": "a bot"}, "ignored"),
            Settlement(rows["T-2"], {"action": "log", "rule": "log-noise", "why": "noise"}, "done"),
            Settlement(rows["T-3"], hold, "held"),
            Settlement(rows["T-4"], hold, "held"),
        ]
    )
    store.answer(rows["T-3"], approve=False, note="spam, not a customer")
    store.answer(rows["T-4"], approve=True, note="only add a comment")
    store.close()

    def shown(event_id: str) -> str:
        result = invoke("show", event_id, "-c", str(config))
        assert result.exit_code == 0, result.output
        return flat(result.output)

    ignored = shown("T-1")
    assert "decision: ignore by rule ignore-bots: a bot" in ignored
    assert "no agent run: the rule ignores the event" in ignored
    assert "decision: log by rule log-noise: noise" in shown("T-2")
    denied = shown("T-3")
    assert "decision: hold for approval by rule hold-suspicious: injection score 0.9" in denied
    assert "denied by " in denied and "note: spam, not a customer" in denied
    assert "no agent run: a person denied it" in denied
    approved = shown("T-4")
    assert "note: only add a comment" in approved and "approved at " in approved
    assert "no agent run yet" in approved
