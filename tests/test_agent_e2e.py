"""The agent end to end: a real demo MCP server over stdio, litellm over loopback HTTP to a fake LLM.

Each test stores one real ticket event in a real SQLite inbox and runs the agent
on it as the service does (AgentRunner with a ConnectionPool of live MCP
connections). The demo server's own SQLite file shows what reached it.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from _rig import Rig
from conftest import REPO
from fake_llm import error, hold, text, tool_calls

from agentwake.agent.runner import AgentRunner
from agentwake.agent.tools import ConnectionPool
from agentwake.config import parse_config
from agentwake.delivery.common import subscription_key
from agentwake.store import IncomingEvent
from agentwake.store.sqlite import SqliteStore
from agentwake.supervisor import Supervisor
from agentwake.worker import Worker

pytestmark = pytest.mark.anyio


def tool_names(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools") or []]


async def test_the_event_reaches_the_llm_fenced_and_its_tool_call_changes_the_server(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__get_*", "demo__add_comment"])
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "triaged: printer, P2"})),
        text("Added a triage comment."),
    )
    result = await rig.run(runner)

    assert (result.status, result.event_state) == ("completed", "done")
    first = rig.fake.requests[0]
    system, user = first["messages"][0], first["messages"][1]
    assert system["role"] == "system" and "never instructions" in system["content"]
    assert 'boundary="' not in system["content"].replace('boundary="BOUNDARY"', "")
    boundary = user["content"].split('boundary="')[1].split('"')[0]
    fenced = (
        user["content"]
        .split(f'<event-data boundary="{boundary}">\n')[1]
        .split(f'\n</event-data boundary="{boundary}">')[0]
    )
    assert json.loads(fenced)["ticketId"] == rig.ticket["id"]
    assert rig.ticket["title"] not in user["content"].replace(fenced, "")  # the title only appears as data
    # Only allowed tools are offered, with the server's own schema.
    assert sorted(tool_names(first)) == ["demo__add_comment", "demo__get_alert", "demo__get_ticket"]
    add = next(t for t in first["tools"] if t["function"]["name"] == "demo__add_comment")
    assert set(add["function"]["parameters"]["required"]) == {"ticket_id", "body"}
    # The tool result went back to the LLM fenced, under the call's id.
    second = rig.fake.requests[1]["messages"]
    call_id = second[2]["tool_calls"][0]["id"]
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == call_id
    assert second[3]["content"].startswith(f'<tool-result boundary="{boundary}">')
    assert "comment added" in second[3]["content"]

    assert rig.comments() == ["triaged: printer, P2"]
    [run] = rig.stored()["runs"]
    assert (run["status"], run["kind"], run["attempt"], run["steps"]) == ("completed", "agent", 1, 2)
    assert [m["role"] for m in run["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert run["user_prompt"] == user["content"]
    [call] = run["tool_calls"]
    assert (call["tool"], call["server"], call["name"], call["status"]) == (
        "demo__add_comment",
        "demo",
        "add_comment",
        "ok",
    )
    assert call["arguments"] == {"ticket_id": rig.ticket["id"], "body": "triaged: printer, P2"}
    assert run["prompt_tokens"] == 20 and run["completion_tokens"] == 10
    assert rig.stored()["state"] == "done"


async def test_a_tool_outside_the_allowlist_is_refused_recorded_and_never_sent(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__get_ticket"])
    rig.fake.script(
        tool_calls(("demo__close_ticket", {"ticket_id": rig.ticket["id"]})),
        text("I was not allowed to close it."),
    )
    result = await rig.run(runner)

    assert result.status == "completed"
    assert tool_names(rig.fake.requests[0]) == ["demo__get_ticket"]
    assert rig.status() == "open"  # the server never saw the call
    [call] = rig.stored()["runs"][0]["tool_calls"]
    assert (call["tool"], call["status"]) == ("demo__close_ticket", "refused")
    reply = rig.fake.requests[1]["messages"][-1]
    assert reply["role"] == "tool" and reply["content"].startswith("refused:")


async def test_no_tools_by_default(rig: Rig) -> None:
    runner = rig.runner(tools=[])
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "x"})), text("done")
    )
    await rig.run(runner)
    assert "tools" not in rig.fake.requests[0]
    assert rig.comments() == []
    assert rig.stored()["runs"][0]["tool_calls"][0]["status"] == "refused"


async def test_parallel_tool_calls_all_run_and_answer_in_order(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__get_ticket", "demo__add_comment"])
    rig.fake.script(
        tool_calls(
            ("demo__get_ticket", {"ticket_id": rig.ticket["id"]}),
            ("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "one"}),
            ("demo__get_ticket", {"ticket_id": "T-nope"}),
        ),
        text("done"),
    )
    await rig.run(runner)
    messages = rig.fake.requests[1]["messages"]
    ids = [c["id"] for c in messages[2]["tool_calls"]]
    assert [m["tool_call_id"] for m in messages[3:6]] == ids
    assert rig.comments() == ["one"]
    statuses = [c["status"] for c in rig.stored()["runs"][0]["tool_calls"]]
    assert statuses == ["ok", "ok", "error"]
    assert "no ticket" in messages[5]["content"]


async def test_transient_llm_errors_are_retried(rig: Rig) -> None:
    runner = rig.runner(tools=[])
    rig.fake.script(error(429, "slow down", type="rate_limit_error"), error(503, "overloaded"), text("fine"))
    result = await rig.run(runner)
    assert (result.status, result.event_state, result.final_text) == ("completed", "done", "fine")
    assert len(rig.fake.requests) == 3


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (error(401, "bad key", type="invalid_request_error"), "AuthenticationError"),
        (error(400, "bad request", type="invalid_request_error"), "BadRequestError"),
        (
            error(
                400,
                "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
                type="invalid_request_error",
                code="context_length_exceeded",
            ),
            "ContextWindowExceededError",
        ),
    ],
)
async def test_permanent_llm_errors_fail_the_event_at_once_with_the_reason(
    rig: Rig, reply: Any, expected: str
) -> None:
    runner = rig.runner(tools=[])
    rig.fake.script(reply)
    result = await rig.run(runner)
    assert (result.status, result.event_state) == ("failed", "failed")
    assert len(rig.fake.requests) == 1  # not retried
    assert expected in (result.reason or "")
    stored = rig.stored()
    assert stored["state"] == "failed" and expected in stored["last_error"]
    assert stored["runs"][0]["status"] == "failed"


async def test_an_event_that_keeps_failing_stops_after_max_attempts(rig: Rig) -> None:
    runner = rig.runner(tools=[], llm_retries=0, max_attempts=2)
    rig.fake.responder = lambda body: error(500, "down")
    first = await rig.run(runner)
    assert (first.status, first.event_state) == ("failed", "pending")
    [again] = await rig.store.claim(1)
    assert again.attempts == 2
    second = await rig.run(runner, again)
    assert (second.status, second.event_state) == ("failed", "dead")  # dead-lettered, with the reason
    assert "gave up after 2 attempt(s)" in rig.stored()["last_error"]
    assert await rig.store.claim(1) == []


async def test_max_steps_stops_a_runaway_loop(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__get_ticket"], max_steps=3)
    rig.fake.responder = lambda body: tool_calls(("demo__get_ticket", {"ticket_id": rig.ticket["id"]}))
    result = await rig.run(runner)
    assert (result.status, result.event_state) == ("failed", "failed")
    assert "max_steps=3" in (result.reason or "")
    assert len(rig.fake.requests) == 3
    assert len(rig.stored()["runs"][0]["tool_calls"]) == 3


async def test_the_wall_clock_timeout_stops_a_run(rig: Rig) -> None:
    runner = rig.runner(tools=[], timeout_s=0.5)
    rig.fake.script(hold())
    result = await rig.run(runner)
    # A slow provider is transient: the event goes again later, as after any other transient failure.
    assert (result.status, result.event_state) == ("failed", "pending")
    assert "timed out after 0.5s" in (result.reason or "")
    rig.fake.release()


async def test_dry_run_replay_plans_tool_calls_and_sends_none(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__add_comment"])
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "would comment"})),
        text("planned"),
    )
    event = await rig.event()
    result = await rig.run(runner, event, kind="dry_run")
    assert result.status == "completed" and result.event_state is None
    assert rig.comments() == []
    [call] = result.tool_calls
    assert (call.status, call.arguments) == (
        "planned",
        {"ticket_id": rig.ticket["id"], "body": "would comment"},
    )
    stored = rig.stored()
    assert stored["state"] == "processing"  # a dry run leaves the event alone
    assert stored["runs"][0]["kind"] == "dry_run"


async def test_the_service_runs_the_agent_on_new_events(rig: Rig) -> None:
    cfg = rig.config(tools=["demo__add_comment"])
    runner = AgentRunner.build(cfg, rig.store, rig.pool)
    rig.fake.script(
        tool_calls(("demo__add_comment", {"ticket_id": rig.ticket["id"], "body": "from the service"})),
        text("ok"),
    )
    sub = cfg.subscriptions[0]
    key = subscription_key(sub)
    await rig.store.register(key)
    worker = Worker(cfg, rig.store, agent=runner, pool=rig.pool)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        data = {"ticketId": rig.ticket["id"], "title": rig.ticket["title"]}
        await rig.store.ingest(
            key, [IncomingEvent(rig.ticket["id"], "ticket.created", rig.ticket["created_at"], data)], "1"
        )
        worker.wake(1)
        with anyio.fail_after(30):
            while rig.stored()["state"] != "done":
                await rig.fake.wait_for_requests(2)
                await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    assert rig.comments() == ["from the service"]


@pytest.mark.parametrize("protocol", ["auto", "legacy"])
async def test_tools_are_listed_again_when_the_server_says_they_changed(
    tmp_path: Path, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = parse_config(
        {
            "store": {"path": str(tmp_path / "aw.db")},
            "servers": {
                "feed": {
                    "command": sys.executable,
                    "args": ["tests/feed_server.py"],
                    "cwd": str(REPO),
                    "protocol": protocol,
                }
            },
            "subscriptions": [{"name": "feed", "server": "feed", "event": "feed.item"}],
        },
        env={},
    )
    caplog.set_level(logging.DEBUG, logger="agentwake")
    store = await SqliteStore.open(tmp_path / "aw.db")
    pool = ConnectionPool()
    try:
        supervisor = Supervisor(cfg, store, pool=pool)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            with anyio.fail_after(20):
                while "feed__unlock_extra" not in {t.exposed for t in pool.catalog()}:
                    await pool.changed()
                if protocol == "auto":  # 2026-era: a change stream, and one precautionary relist
                    # Nothing signals a log record: look again every 20 ms.
                    while not any("listing tools once more" in r.getMessage() for r in caplog.records):  # noqa: ASYNC110
                        await anyio.sleep(0.02)
                # Nothing changed yet, so nothing says so at INFO.
                assert not [r for r in caplog.records if "tools changed; listing" in r.getMessage()]
                spec = next(t for t in pool.catalog() if t.exposed == "feed__unlock_extra")
                assert (await pool.call(spec, {})).content == "unlocked"
                while "feed__extra" not in {t.exposed for t in pool.catalog()}:
                    await pool.changed()
            tg.cancel_scope.cancel()
    finally:
        await store.close()


async def test_cost_comes_from_the_offline_price_map_when_the_model_is_known(rig: Rig) -> None:
    # A known model name, served by the fake: litellm prices its usage from its bundled map.
    runner = rig.runner(tools=[], model="openai/gpt-4o-mini")
    rig.fake.script(text("fine", prompt_tokens=1000, completion_tokens=100))
    result = await rig.run(runner)
    assert result.status == "completed"
    [run] = rig.stored()["runs"]
    assert run["model"] == "openai/gpt-4o-mini"
    assert run["cost_usd"] is not None and 0 < run["cost_usd"] < 0.01
    assert (run["prompt_tokens"], run["completion_tokens"]) == (1000, 100)


async def test_an_unknown_model_has_no_cost_rather_than_a_wrong_one(rig: Rig) -> None:
    runner = rig.runner(tools=[])
    rig.fake.script(text("fine"))
    await rig.run(runner)
    assert rig.stored()["runs"][0]["cost_usd"] is None
