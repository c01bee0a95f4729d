"""Say what is happening: one INFO line when an agent run starts and one when it ends (with the model's
summary, one clipped line), warnings that name the event, and the summary in `actions` and `show`.

The agent runs against the fake LLM (tests/fake_llm.py) and a real demo server, in process with
caplog, and once as a real `agentwake run` whose stderr is read.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import pytest
from _rig import Rig
from _support import agentwake_run, demo_server_toml, fake_agent_toml, start_from_cursor
from fake_llm import FakeLLM, error, text, tool_calls
from rich.console import Console
from typer.testing import CliRunner

from agentwake import cli
from agentwake.cli import app
from agentwake.store import final_answer, summary_line
from agentwake.store.records import SUMMARY_CHARS

pytestmark = pytest.mark.anyio

# A final answer on several lines, with a bidi override, a zero-width space and a control character,
# longer than the summary: the log line, `actions` and `show` get its first SUMMARY_CHARS on one line.
ANSWER = (
    "Closed nothing:\nthe ticket is a\tduplicate of T-000007.\u202e \u200bI added\x07 no comment.\n\n"
    + "More detail follows. " * 20
)
SUMMARY = summary_line(ANSWER)


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_a_summary_is_one_clipped_printable_line() -> None:
    assert SUMMARY is not None and len(SUMMARY) == SUMMARY_CHARS and SUMMARY.endswith("…")
    assert SUMMARY.startswith(
        "Closed nothing: the ticket is a duplicate of T-000007. I added no comment. More"
    )
    assert all(ch.isprintable() for ch in SUMMARY)
    assert summary_line("  short\n answer ") == "short answer"
    assert summary_line(None) is None
    assert final_answer([{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]) is None
    assert final_answer([{"role": "tool", "content": "x"}]) is None
    assert final_answer([{"role": "assistant", "content": "done"}]) == "done"


async def test_a_run_logs_its_start_and_its_end_and_its_warnings_name_the_event(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    runner = rig.runner(tools=["demo__get_ticket"])
    rig.fake.script(
        tool_calls(("demo__close_ticket", {"ticket_id": rig.ticket["id"]})),
        error(429, "slow down", type="rate_limit_error"),
        text(ANSWER),
    )
    result = await rig.run(runner)
    assert result.status == "completed"
    event_id, run_id = rig.ticket["id"], result.run_id

    info = [m for m in messages(caplog, logging.INFO) if m.startswith(f"agent: event {event_id} ")]
    assert len(info) == 2, info
    start, end = info
    assert start == (
        f"agent: event {event_id} (tickets) run {run_id} started:"
        " rule default, model openai/fake, attempt 1, 1 tool(s) allowed"
    )
    prefix = f"agent: event {event_id} (tickets) run {run_id} completed in "
    assert end.startswith(prefix)
    duration, rest = end.removeprefix(prefix).split(" ms, ", 1)
    assert int(duration) >= 0
    assert rest == f"2 step(s), 1 tool call(s): demo__close_ticket refused; summary: {SUMMARY}"
    assert "\n" not in end

    warnings = messages(caplog, logging.WARNING)
    assert (
        f"event {event_id}: agent asked for tool demo__close_ticket, which is not allowed for this event: refused"
        in warnings
    )
    [retry] = [r for r in caplog.records if r.name == "agentwake.agent.llm" and r.levelno == logging.WARNING]
    assert retry.getMessage().startswith(f"event {event_id}: LLM openai/fake: ")
    assert "retrying in" in retry.getMessage()
    assert getattr(retry, "event_id", None) == event_id

    # Outside a run the LLM stage's lines are left as they are.
    caplog.clear()
    logging.getLogger("agentwake.agent.llm").warning("not during a run")
    assert messages(caplog, logging.WARNING) == ["not during a run"]

    # The action log has the summary; `show` has it and the whole answer in the transcript.
    [action] = rig.store.core.actions(5)  # type: ignore[attr-defined]
    assert action["summary"] == SUMMARY
    [run] = rig.stored()["runs"]
    assert run["summary"] == SUMMARY and run["messages"][-1]["content"] == ANSWER


async def test_a_failed_run_logs_its_end_with_the_reason_and_no_summary(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    runner = rig.runner(tools=[])
    rig.fake.script(error(400, "bad request", type="invalid_request_error"))
    result = await rig.run(runner)
    assert result.status == "failed"
    event_id = rig.ticket["id"]
    [start] = [m for m in messages(caplog, logging.INFO) if f"agent: event {event_id} " in m]
    assert f"run {result.run_id} started: rule default, model openai/fake" in start
    [end] = [m for m in messages(caplog, logging.ERROR) if m.startswith(f"agent: event {event_id} ")]
    assert f"run {result.run_id} failed after " in end
    assert "0 step(s): LLM call failed: BadRequestError" in end and "event failed" in end
    assert "summary" not in end
    [action] = rig.store.core.actions(5)  # type: ignore[attr-defined]
    assert action["summary"] is None


async def test_actions_and_show_print_the_summary(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runner = rig.runner(tools=[])
    rig.fake.script(text(ANSWER))
    await rig.run(runner)
    config = rig.tmp / "agentwake.toml"
    config.write_text('[store]\npath = "aw.db"\n')
    monkeypatch.setattr(cli, "out", Console(width=400, markup=False))  # no folded cells
    invoke = CliRunner().invoke
    actions = invoke(app, ["actions", "-c", str(config)])
    assert actions.exit_code == 0, actions.output
    [header] = [line for line in actions.output.splitlines() if "subscription" in line]
    assert "summary" in header
    assert SUMMARY is not None and SUMMARY in actions.output
    show = invoke(app, ["show", rig.ticket["id"], "-c", str(config)])
    assert show.exit_code == 0, show.output
    assert f"summary: {SUMMARY}" in show.output
    assert "duplicate of T-000007." in show.output.split(f"summary: {SUMMARY}")[0]  # the transcript too


# ---- the same lines from a real `agentwake run` --------------------------------------------------


@pytest.mark.slow
async def test_the_service_logs_each_run_on_its_stderr(tmp_path: Path) -> None:
    async with FakeLLM() as fake:
        config = tmp_path / "agentwake.toml"
        config.write_text(
            f"""
[store]
path = "aw.db"

{fake_agent_toml(fake.url, llm_retries=2, retry_initial_s=0.01, retry_max_s=0.05)}
{demo_server_toml(tmp_path / "demo.db", DEMO_BACKLOG="1")}
[[subscriptions]]
name = "tickets"
server = "demo"
event = "ticket.created"
delivery = "poll"
poll_floor_ms = 100
tools = ["demo__get_ticket"]
"""
        )
        start_from_cursor(config)

        fake.script(
            tool_calls(("demo__close_ticket", {"ticket_id": "T-000001"})),
            error(503, "overloaded"),
            text(ANSWER),
        )
        async with agentwake_run(config, FAKE_LLM_KEY="sk-test") as run:
            end_at = await run.wait_for("agent: event T-000001 (tickets) run", "completed in")
            start_at = await run.wait_for("agent: event T-000001 (tickets) run", "started:")
            refused_at = await run.wait_for("event T-000001: agent asked for tool demo__close_ticket")
            retry_at = await run.wait_for("event T-000001: LLM openai/fake:", "retrying in")
            await run.stop(signal.SIGTERM)
    assert start_at < refused_at < retry_at < end_at
    start, refused, retry, end = (run.lines[at] for at in (start_at, refused_at, retry_at, end_at))
    assert " INFO " in start and "rule default, model openai/fake, attempt 1" in start
    assert " WARNING " in refused and " WARNING " in retry
    assert (
        " INFO " in end
        and f"2 step(s), 1 tool call(s): demo__close_ticket refused; summary: {SUMMARY}" in end
    )
