"""The Slack bridge end to end: Slack's signed Events API requests and its Socket Mode envelopes →
``agentwake bridge slack`` → ``agentwake run`` (push delivery) → a scripted LLM → tool calls that reach
the fake Slack Web API, and the agent's own posts coming back from Slack without waking it.

Everything is real and on loopback: the bridge is the stdio server ``agentwake run`` starts, with both
ingress paths on (``--listen`` and ``--socket-mode``); requests are signed as Slack signs them; the
Socket Mode client is slack-sdk's; the LLM is tests/fake_llm.py and Slack is agentwake/fakes/slack.py, which
sends the bot's own writes back as events, as Slack does.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from _support import agentwake_run, bootstrapped, bridge_server_toml, read_db, settled, write_bridge_config
from fake_llm import FakeLLM, Reply, text, tool_calls

from agentwake.fakes.slack import BOT_USER, CHANNEL, FakeSlack

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

POLICY = """
[[rules]]
name = "answer-mentions"
action = "agent"
tools = ["slack__reply_in_thread"]
match.event = "app_mention"

[[rules]]
name = "acknowledge-alarms"
action = "agent"
tools = ["slack__add_reaction"]
match.event = "reaction_added"
match.data = { reaction = "rotating_light" }
"""
SUBSCRIPTIONS = f"""
[[subscriptions]]
name = "mentions"
server = "slack"
event = "app_mention"
delivery = "push"

[[subscriptions]]
name = "alarms"
server = "slack"
event = "reaction_added"
delivery = "push"
arguments = {{ channel = "{CHANNEL}" }}
"""


def field(name: str, prompt: str) -> str | None:
    found = re.search(rf'"{name}":\s*"([^"]+)"', prompt)
    return found.group(1) if found else None


def answer_what_the_prompt_names(body: dict[str, Any]) -> Reply:
    """The scripted model: reply in the mention's thread, or acknowledge the alarm; once the tool answered, stop."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return text("done")
    prompt = "\n".join(str(m.get("content")) for m in messages if m["role"] == "user")
    if "reaction_added" in prompt:
        channel, ts = field("itemChannel", prompt), field("itemTs", prompt)
        assert channel and ts, prompt
        return tool_calls(
            ("slack__add_reaction", {"channel": channel, "timestamp": ts, "name": "white_check_mark"})
        )
    channel, ts = field("channel", prompt), field("threadTs", prompt)
    assert channel and ts, prompt
    return tool_calls(("slack__reply_in_thread", {"channel": channel, "thread_ts": ts, "text": "On it."}))


def write_config(tmp_path: Path, slack: FakeSlack, llm: FakeLLM) -> Path:
    server = bridge_server_toml(
        "slack",
        tmp_path / "bridge",
        ["--listen", "127.0.0.1:0", "--socket-mode", "--api-base", slack.url],
        ["SLACK_SIGNING_SECRET", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"],
    )
    return write_bridge_config(tmp_path, server, llm.url, SUBSCRIPTIONS, policies=("10-slack.toml", POLICY))


async def test_signed_requests_and_socket_mode_reach_the_agent_and_its_own_posts_never_wake_it(
    tmp_path: Path,
) -> None:
    async with FakeSlack() as slack, FakeLLM() as llm:
        llm.responder = answer_what_the_prompt_names
        slack.echo = True
        config = write_config(tmp_path, slack, llm)
        env = {
            "SLACK_SIGNING_SECRET": slack.signing_secret,
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_APP_TOKEN": slack.app_token,
            "FAKE_LLM_KEY": "sk-test",
        }
        async with agentwake_run(config, **env) as service:
            line = service.lines[await service.wait_for("webhooks on http://")]
            found = re.search(r"webhooks on (http://\S+)", line)
            assert found, line
            url = found.group(1)
            await slack.wait_connection(1, timeout=60)
            await bootstrapped(tmp_path / "aw.db", {"mentions", "alarms"}, service)

            # Events API: a forged and a stale request are refused; the signed one is accepted once,
            # and its replay and Slack's retry are duplicates.
            message, (mention, _) = slack.say(CHANNEL, f"<@{BOT_USER}> the deploy to eu-west failed")
            body = json.dumps(mention).encode()
            assert (await slack.deliver(url, body, secret="forged")).status == 401
            assert (await slack.deliver(url, body, timestamp=int(time.time()) - 600)).status == 401
            assert (await slack.deliver(url, body)).body["status"] == "accepted"
            assert (await slack.deliver(url, body)).body["status"] == "duplicate"
            assert (await slack.deliver(url, body, retry_num=1)).body["status"] == "duplicate"

            reply = await slack.wait_for("chat.postMessage", timeout=60)
            # Posted so that it can mention no one (the default, allow_mentions false).
            assert reply.json == {
                "channel": CHANNEL,
                "text": "On it.",
                "thread_ts": message["ts"],
                "link_names": False,
                "parse": "none",
            }
            assert reply.headers["Authorization"] == f"Bearer {slack.bot_token}"

            # Socket Mode: a human's :rotating_light: on the message.
            alarm = slack.reaction_added(CHANNEL, message["ts"], "rotating_light")
            await slack.wait_ack(await slack.send_envelope(alarm))
            reacted = await slack.wait_for("reactions.add", timeout=60)
            assert reacted.args == {
                "channel": CHANNEL,
                "timestamp": message["ts"],
                "name": "white_check_mark",
            }

            runs = await settled(tmp_path / "aw.db", 2)
            assert sorted(runs) == [("alarms", "done"), ("mentions", "done")], service.log()
            # The agent's reply and reaction came back over Socket Mode and were acknowledged: the
            # bridge had decided about them, and its log holds only what the humans did.
            await slack.wait_quiet(timeout=30)
            logged = read_db(
                tmp_path / "bridge" / "events.db", "SELECT type, event_id FROM events ORDER BY seq"
            )
            assert [kind for kind, _ in logged] == ["app_mention", "reaction_added"], logged
        assert len(slack.calls("chat.postMessage")) == len(slack.calls("reactions.add")) == 1
        assert len(slack.acks) == 3  # the alarm, and the echoes of the reply and the reaction
        assert len(llm.requests) == 4  # two runs, two turns each
