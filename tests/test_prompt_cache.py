"""Prompt caching: every request of a rule starts with the same bytes (system prompt, then the tools
sorted by name) and only the user message, which holds the event, differs from run to run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _rig import Rig
from _support import demo_server_toml
from fake_anthropic import FakeAnthropic
from fake_llm import text, tool_calls
from rich.console import Console
from typer.testing import CliRunner

from agentwake import cli, metrics
from agentwake.agent.fence import Fence
from agentwake.agent.llm import cache_points
from agentwake.agent.prompts import PromptError, PromptRenderer
from agentwake.clock import utc_now
from agentwake.config import parse_config
from agentwake.decide import decide
from agentwake.delivery.common import subscription_key
from agentwake.errors import ConfigError
from agentwake.policy import Policy, load_file
from agentwake.store import IncomingEvent
from agentwake.web.pages import run_shown
from agentwake.web.templates import TEMPLATES

pytestmark = pytest.mark.anyio


def prefix(request: dict[str, Any]) -> str:
    """What every run of one rule must send alike: the system message and the tools, as bytes."""
    return json.dumps([request["messages"][0], request.get("tools")], ensure_ascii=False)


async def run_two_events(rig: Rig, policy: Policy | None = None, **agent: Any) -> list[dict[str, Any]]:
    runner = rig.runner(tools=["demo__get_*", "demo__add_comment", "demo__close_ticket"], **agent)
    sub = runner.config.subscriptions[0]
    key = subscription_key(sub)
    await rig.store.register(key)
    events = [
        IncomingEvent(
            f"T-90000{n}",
            "ticket.created",
            f"2026-01-0{n}T10:0{n}:00Z",
            {"ticketId": f"T-90000{n}", "title": f"printer {n} on fire", "priority": f"P{n}"},
        )
        for n in (1, 2)
    ]
    await rig.store.ingest(key, events, "1")
    claimed = await rig.store.claim(2)
    assert len(claimed) == 2
    if "model" not in agent:
        rig.fake.script(text("Nothing to do."), text("Nothing to do."))
    for event in claimed:
        outcome = await decide(
            event, config=runner.config, policy=policy or Policy(), now=utc_now(), flow=None
        )
        result = await runner.run(outcome)
        assert result.status == "completed", result.reason
    return rig.fake.requests


async def test_two_runs_of_a_rule_share_their_prefix_and_differ_only_in_the_user_message(rig: Rig) -> None:
    first, second = await run_two_events(rig)
    assert prefix(first) == prefix(second)
    system = first["messages"][0]["content"]
    for variable in ("T-900001", "2026-01-01", "printer 1"):
        assert variable not in system
    # The tools come sorted by name, whatever order the server lists them in.
    names = [tool["function"]["name"] for tool in first["tools"]]
    assert names == sorted(names) and "demo__add_comment" in names
    # Only the last part, the user message with the event, differs.
    assert len(first["messages"]) == len(second["messages"]) == 2
    one, two = first["messages"][1]["content"], second["messages"][1]["content"]
    assert one != two
    assert "T-900001" in one and "T-900002" in two
    # The run's boundary is named in the user message only, before any data.
    boundary = one.split('boundary="')[1].split('"')[0]
    assert boundary not in system
    assert one.index(boundary) < one.index("printer 1")


PINNED_RULE = """
[[rules]]
name = "comment-on-its-ticket"
action = "agent"
tools = ["demo__get_ticket", "demo__add_comment", "demo__close_ticket"]
args."demo__add_comment" = { ticket_id = "{{ data.ticketId }}", body = { max_length = 40 } }
args."demo__close_ticket" = { ticket_id = { in = ["T-none"] } }
"""


async def test_arguments_bound_to_the_event_are_in_the_user_message_not_in_the_tools(
    rig: Rig, tmp_path: Path
) -> None:
    (tmp_path / "rules.toml").write_text(PINNED_RULE)
    first, second = await run_two_events(rig, Policy(rules=load_file(tmp_path / "rules.toml")))
    # The rule's tools are the same for both events: its static bounds are in them, the event's are not.
    assert prefix(first) == prefix(second)
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in first["tools"]}
    assert tools["demo__close_ticket"]["properties"]["ticket_id"]["enum"] == ["T-none"]
    assert tools["demo__add_comment"]["properties"]["body"]["maxLength"] == 40
    # Pinned to the event: out of the schema, filled in by the runtime (issue 28's second form).
    assert "ticket_id" not in tools["demo__add_comment"]["properties"]
    assert "ticket_id" not in tools["demo__add_comment"].get("required", [])
    for request, ticket in ((first, "T-900001"), (second, "T-900002")):
        user = request["messages"][1]["content"]
        boundary = user.split('boundary="')[1].split('"')[0]
        bound = user.split(f'<bound-arguments boundary="{boundary}">\n')[1].split("\n</bound-arguments")[0]
        assert bound == f'- demo__add_comment: ticket_id = "{ticket}" (from {{{{ data.ticketId }}}})'
        assert user.index("printer") < user.index("<bound-arguments")  # after the event


# ---- cache markers ------------------------------------------------------------------------------

ANTHROPIC_MODEL = "anthropic/claude-sonnet-4-5"


async def run_on_anthropic(rig: Rig, fake: FakeAnthropic, **agent: Any) -> None:
    runner = rig.runner(
        tools=["demo__get_*", "demo__add_comment"], model=ANTHROPIC_MODEL, api_base=fake.url, **agent
    )
    result = await rig.run(runner)
    assert result.status == "completed", result.reason


def marked(body: Any) -> bool:
    return "cache_control" in json.dumps(body)


EPHEMERAL = {"type": "ephemeral"}


async def test_auto_marks_the_system_prompt_the_rules_instructions_and_the_last_message_for_anthropic(
    rig: Rig,
) -> None:
    async with FakeAnthropic(min_cacheable=64) as fake:
        fake.script(text("Nothing to do."))
        await run_on_anthropic(rig, fake)
        [request] = fake.requests
    # The end of the system prompt: it caches the tools and the system prompt before it.
    *_, last = request["system"]
    assert last["cache_control"] == EPHEMERAL
    assert not marked(request["tools"]) and not marked(request["system"][:-1])
    # The end of the rule's instructions (the template's text before {{ cache_point }}): the same
    # for every run of the rule, before the boundary and the event.
    [user] = request["messages"]
    shared, event = user["content"]
    assert shared["cache_control"] == EPHEMERAL
    assert shared["text"].startswith("A new ticket was opened.") and "boundary" not in shared["text"]
    assert event["text"].startswith("This run's boundary is") and "<event-data" in event["text"]
    # Tools are offered, so the model may call one: the end of the request is marked too, for the
    # run's next call to read.
    assert event["cache_control"] == EPHEMERAL
    [usage] = fake.usages
    assert usage["cache_creation_input_tokens"] > 0 and usage["cache_read_input_tokens"] == 0


async def test_the_calls_after_a_tool_call_read_the_whole_request_before_them_from_the_cache(
    rig: Rig,
) -> None:
    async with FakeAnthropic(min_cacheable=64) as fake:
        fake.script(
            tool_calls(("demo__get_ticket", json.dumps({"ticket_id": rig.ticket["id"]}))), text("Read it.")
        )
        await run_on_anthropic(rig, fake)
        _, second = fake.requests
        first_usage, second_usage = fake.usages
    # The tool's answer, the last message of the second call, carries the mark.
    assert second["messages"][-1]["content"][-1]["cache_control"] == EPHEMERAL
    assert marked(second["messages"][0])  # the rule's instructions stay marked
    whole_first = sum(v for k, v in first_usage.items() if k != "output_tokens")
    assert first_usage["cache_creation_input_tokens"] == whole_first
    assert second_usage["cache_read_input_tokens"] == whole_first


async def test_without_tools_only_the_shared_prefix_is_marked(rig: Rig) -> None:
    async with FakeAnthropic(min_cacheable=64) as fake:
        fake.script(text("Nothing to do."))
        runner = rig.runner(tools=[], model=ANTHROPIC_MODEL, api_base=fake.url)
        result = await rig.run(runner)
        assert result.status == "completed", result.reason
        [request] = fake.requests
    shared, event = request["messages"][0]["content"]
    assert shared["cache_control"] == EPHEMERAL and "cache_control" not in event


async def test_a_template_without_a_cache_point_is_one_user_message_after_the_boundary(
    rig: Rig, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "ticket.created.md.j2").write_text("A ticket.\n\n{{ event.data_block }}\n\nLabel it.\n")
    async with FakeAnthropic(min_cacheable=64) as fake:
        fake.script(text("Nothing to do."))
        runner = rig.runner(tools=[], model=ANTHROPIC_MODEL, api_base=fake.url, prompts=str(prompts))
        result = await rig.run(runner)
        assert result.status == "completed", result.reason
        [request] = fake.requests
    assert request["system"][-1]["cache_control"] == EPHEMERAL
    [user] = request["messages"]
    assert not marked(user)
    [block] = user["content"] if isinstance(user["content"], list) else [{"text": user["content"]}]
    assert block["text"].startswith("This run's boundary is")


def test_a_cache_point_with_event_data_before_it_or_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "before.md.j2").write_text("{{ event.data_block }}\n{{ cache_point }}\nLabel it.\n")
    (tmp_path / "twice.md.j2").write_text(
        "Label it.\n{{ cache_point }}\n{{ event.data_block }}\n{{ cache_point }}\n"
    )
    config = parse_config({"agent": {"model": "openai/x", "prompts": str(tmp_path)}}, env={})
    assert config.agent is not None
    renderer = PromptRenderer(config.agent)
    event = {"event_id": "T-1", "name": "ticket.created", "timestamp": "2026-01-01T00:00:00Z", "data": {}}
    event["subscription"] = "tickets"
    for template, reason in (("before", "puts event data before"), ("twice", "more than one")):
        with pytest.raises(PromptError, match=reason):
            renderer.render(
                fence=Fence(),
                event=event,
                subscription=None,
                server="demo",
                tools=[],
                template=f"{template}.md.j2",
            )


async def test_off_sends_no_cache_markers_to_anthropic(rig: Rig) -> None:
    async with FakeAnthropic(min_cacheable=64) as fake:
        fake.script(text("Nothing to do."))
        await run_on_anthropic(rig, fake, prompt_cache="off")
        [request] = fake.requests
    assert not marked(request)
    assert fake.usages[0]["cache_creation_input_tokens"] == 0


async def test_openai_gets_no_markers_it_caches_the_prefix_itself(rig: Rig) -> None:
    runner = rig.runner(tools=["demo__get_*", "demo__add_comment"], prompt_cache="auto")
    rig.fake.script(text("Nothing to do."))
    result = await rig.run(runner)
    assert result.status == "completed", result.reason
    [request] = rig.fake.requests
    assert not marked(request)
    assert set(request) <= {"model", "messages", "max_tokens", "tools", "temperature"}
    # One string, as before caching: OpenAI caches the longest prefix it has seen by itself.
    assert all(isinstance(message["content"], str) for message in request["messages"])


@pytest.mark.parametrize(
    ("model", "mode", "marks"),
    [
        ("anthropic/claude-sonnet-4-5", "auto", True),
        ("anthropic/claude-sonnet-4-5", "off", False),
        ("bedrock/anthropic.claude-3-5-sonnet-20241022-v2:0", "auto", True),
        ("bedrock/us.amazon.nova-pro-v1:0", "auto", True),
        ("bedrock/meta.llama3-70b-instruct-v1:0", "auto", False),
        ("openai/gpt-4.1", "auto", False),
        ("gemini/gemini-2.5-flash", "auto", False),
        ("deepseek/deepseek-chat", "auto", False),
        ("ollama_chat/llama3", "auto", False),
        ("agentwake/offline", "auto", False),
    ],
)
def test_cache_points_only_for_providers_with_explicit_caching(model: str, mode: str, marks: bool) -> None:
    points = cache_points(model, mode)
    assert (points == [{"location": "message", "role": "system"}]) if marks else points is None


def test_prompt_cache_takes_auto_or_off() -> None:
    base = {"agent": {"model": "openai/x"}}
    config = parse_config(base, env={})
    assert config.agent is not None and config.agent.prompt_cache == "auto"
    with pytest.raises(ConfigError, match=r"agent\.prompt_cache: Input should be 'auto' or 'off'"):
        parse_config({"agent": {"model": "openai/x", "prompt_cache": "on"}}, env={})


# ---- cached tokens, their price and where they are shown ----------------------------------------

# litellm's prices of claude-sonnet-4-5 (its local price map), USD per token.
SONNET_IN, SONNET_CACHED, SONNET_WRITE, SONNET_OUT = 3e-6, 3e-7, 3.75e-6, 15e-6


def priced(usage: dict[str, int]) -> float:
    return (
        usage["input_tokens"] * SONNET_IN
        + usage["cache_read_input_tokens"] * SONNET_CACHED
        + usage["cache_creation_input_tokens"] * SONNET_WRITE
        + usage["output_tokens"] * SONNET_OUT
    )


def cached_metric() -> float:
    return metrics.REGISTRY.get_sample_value("agentwake_llm_tokens_total", {"kind": "cached"}) or 0.0


async def test_cache_reads_are_recorded_priced_at_the_cached_rate_and_shown(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = cached_metric()
    async with FakeAnthropic(min_cacheable=64) as fake:
        fake.script(text("Nothing to do."), text("Nothing to do."))
        await run_two_events(rig, model=ANTHROPIC_MODEL, api_base=fake.url)
        first_usage, second_usage = fake.usages
    assert first_usage["cache_creation_input_tokens"] > 0 and first_usage["cache_read_input_tokens"] == 0
    # The second run reads the shared prefix (tools, system prompt, the rule's instructions) and
    # writes its own event for a next call it might make.
    read = second_usage["cache_read_input_tokens"]
    assert 0 < read < first_usage["cache_creation_input_tokens"]
    assert second_usage["cache_creation_input_tokens"] > 0

    [one] = rig.store.core.find_events("T-900001")[0]["runs"]
    [two] = rig.store.core.find_events("T-900002")[0]["runs"]
    assert one["cached_tokens"] == 0 and two["cached_tokens"] == read
    # The input tokens are all of them, read, written or neither (as litellm reports them).
    assert two["prompt_tokens"] == sum(v for k, v in second_usage.items() if k != "output_tokens")
    # Cache writes and reads at their own rates: the second run's input costs a fraction of the first's.
    assert one["cost_usd"] == pytest.approx(priced(first_usage))
    assert two["cost_usd"] == pytest.approx(priced(second_usage))
    assert two["cost_usd"] < one["cost_usd"] / 2
    assert cached_metric() - before == read

    # The action log, `show` and the operator page show them.
    [latest] = rig.store.core.actions(1)
    assert latest["cached_tokens"] == read
    config = tmp_path / "show.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "aw.db"}"\n')
    monkeypatch.setattr(cli, "out", Console(width=250, markup=False))
    shown = CliRunner().invoke(cli.app, ["show", "T-900002", "-c", str(config)])
    assert shown.exit_code == 0, shown.output
    assert f"in ({read} cached) /" in " ".join(shown.output.split())
    listed = CliRunner().invoke(cli.app, ["actions", "--json", "-c", str(config)])
    assert listed.exit_code == 0, listed.output
    assert [row["cached_tokens"] for row in json.loads(listed.output)] == [read, 0]
    table = CliRunner().invoke(cli.app, ["actions", "-c", str(config)])
    assert table.exit_code == 0 and "cached" in table.output
    page = TEMPLATES.get_template("macros.html").module.run_block(run_shown(two))  # type: ignore[attr-defined]
    assert f"({read} cached)" in str(page)


# ---- check: templates without a cache point ---------------------------------------------------------


def cache_point_project(tmp_path: Path, template: str, prompt_cache: str = "auto") -> Path:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "ticket.created.md.j2").write_text(template)
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\npath = "aw.db"\n'
        f'[agent]\nmodel = "agentwake/offline"\nprompts = "prompts"\nprompt_cache = "{prompt_cache}"\n'
        f"{demo_server_toml(tmp_path / 'demo.db')}\n"
        '[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\n'
    )
    return config


def cache_warnings(config: Path) -> list[dict[str, Any]]:
    result = CliRunner().invoke(cli.app, ["check", "--json", "-c", str(config)])
    report = json.loads(result.stdout)
    return [f for f in report["findings"] if f["kind"] == "prompt" and "cache_point" in f["message"]]


def test_check_warns_of_a_template_without_a_cache_point(tmp_path: Path) -> None:
    config = cache_point_project(tmp_path, "A ticket:\n{{ event.data_block }}\nLabel it.\n")
    [warning] = cache_warnings(config)
    assert warning["severity"] == "warning" and warning["what"] == "ticket.created.md.j2"
    assert "has no {{ cache_point }}" in warning["message"]


@pytest.mark.parametrize(
    ("template", "prompt_cache"),
    [("Label it.\n{{ cache_point }}\n{{ event.data_block }}\n", "auto"), ("{{ event.data_block }}\n", "off")],
    ids=["with a cache point", "caching off"],
)
def test_check_is_quiet_with_a_cache_point_or_with_caching_off(
    tmp_path: Path, template: str, prompt_cache: str
) -> None:
    assert cache_warnings(cache_point_project(tmp_path, template, prompt_cache)) == []
