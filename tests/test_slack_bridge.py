"""The Slack bridge (``agentwake bridge slack``) piece by piece: the mapping, Events API ingress (signature,
timestamp, url_verification, replays and retries), the app's own messages, filters, the tools, Socket Mode
and the command line.

Everything runs in process: a ``BridgeServer`` with its real aiohttp listener on loopback, the SDK's
in-memory ``mcp.Client`` for MCP, a real SQLite log in tmp_path, slack-sdk's real Socket Mode client, and
agentwake/fakes/slack.py as Slack (its Web API, its Socket Mode WebSocket, its signed Events API requests).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter
from typer.testing import CliRunner

from agentwake import protocol
from agentwake.bridges import slack_events
from agentwake.bridges.framework import BridgeOptions, BridgeServer
from agentwake.bridges.slack import SlackBridge, SlackSettings, scrub
from agentwake.cli import app
from agentwake.fakes.slack import BOT_ID, BOT_USER, CHANNEL, HUMAN, FakeSlack, signature
from agentwake.mcp import _EventsRequest, _Params

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parent / "fixtures" / "slack"
RESULT = TypeAdapter(dict[str, Any])
OPS = "C0OPS"


def fixture(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return body


@dataclass
class InProcess:
    server: BridgeServer
    bridge: SlackBridge
    client: Client
    url: str

    def logged(self, event_type: str) -> list[dict[str, Any]]:
        return [e.data for e in self.server.log.read(event_type, 0, 100).events]

    def head(self) -> int:
        return self.server.log.head()

    async def poll(
        self, name: str, cursor: str | None, arguments: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "cursor": cursor}
        if arguments is not None:
            params["arguments"] = arguments
        request = _EventsRequest(method="events/poll", params=_Params.model_validate(params))
        return await self.client.session.send_request(request, RESULT)  # type: ignore[type-var]


@asynccontextmanager
async def in_process(
    tmp_path: Path, slack: FakeSlack, *, socket_mode: bool = False, ignore_other_bots: bool = True
) -> AsyncIterator[InProcess]:
    """A Slack bridge in this process: its listener on a free loopback port (``--listen 127.0.0.1:0``),
    its MCP server behind an in-memory client, and with ``socket_mode`` its Socket Mode client."""
    options = BridgeOptions(
        state_dir=tmp_path / "bridge", listen="127.0.0.1:0", webhook_path="/slack/events", poll=socket_mode
    )
    settings = SlackSettings(
        signing_secret=slack.signing_secret.encode(),
        bot_token=slack.bot_token,
        app_token=slack.app_token if socket_mode else None,
        api_base=slack.url,
        ignore_other_bots=ignore_other_bots,
    )
    bridge = SlackBridge(options, settings)
    server = BridgeServer(bridge)
    try:
        async with server.events.running(), anyio.create_task_group() as tg, Client(server.mcp) as client:
            await server._start_webhook_listener(tg)
            assert server.webhook_address is not None
            host, port = server.webhook_address
            if socket_mode:
                tg.start_soon(bridge.poll_forever)
            yield InProcess(server, bridge, client, f"http://{host}:{port}/slack/events")
            tg.cancel_scope.cancel()
    finally:
        await bridge.aclose()
        server.log.close()
        server.webhook_store.close()


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        fake.add_channel(OPS, "ops")
        yield fake


# ---- the mapping ------------------------------------------------------------------------------------


def test_fixture_bodies_map_to_small_typed_events_with_occurrence_ids() -> None:
    mention = slack_events.from_callback(fixture("app_mention"))
    assert mention is not None and not mention.own
    assert mention.event_id == "app_mention:C0LAN2Q65:1718290800.000200"
    assert mention.data == {
        "channel": "C0LAN2Q65",
        "user": "U061F7AUR",
        "text": "<@U0LAN0Z89> the nightly deploy to eu-west failed again, can you look?",
        "textTruncated": False,
        "ts": "1718290800.000200",
        "threadTs": "1718290800.000200",
        "subtype": None,
        "files": [],
        "isReply": False,
        "parentUser": None,
        "occurredAt": "2024-06-13T15:00:00.000Z",
        "isBot": False,
    }
    reply = slack_events.from_callback(fixture("message_thread_reply"))
    assert reply is not None and reply.type == "message.channels"
    assert reply.event_id == "message.channels:C0LAN2Q65:1718290920.000500"
    assert (reply.data["threadTs"], reply.data["isBot"]) == ("1718290800.000200", False)
    assert reply.data["isReply"] and reply.data["subtype"] is None
    reaction = slack_events.from_callback(fixture("reaction_added"))
    assert reaction is not None
    assert (
        reaction.event_id
        == "reaction_added:C0LAN2Q65:1718290800.000200:U024BE7LH:rotating_light:1718291000.000700"
    )
    assert reaction.data == {
        "user": "U024BE7LH",
        "reaction": "rotating_light",
        "itemChannel": "C0LAN2Q65",
        "itemTs": "1718290800.000200",
        "itemUser": "U061F7AUR",
        "occurredAt": "2024-06-13T15:03:20.000Z",
        "isBot": False,
    }
    own = slack_events.from_callback(fixture("message_from_the_app"))
    assert own is not None and own.own
    other = slack_events.from_callback(fixture("message_from_another_app"))
    assert other is not None and not other.own and other.data["isBot"] and other.data["user"] is None
    edit = slack_events.from_callback(fixture("message_changed"))
    assert edit is not None and edit.type == "message.changed"
    assert edit.event_id == "message.changed:C0LAN2Q65:1718290920.000500:1718290990.000600"
    assert (edit.data["text"], edit.data["ts"], edit.data["user"]) == (
        "Same thing on eu-central since 02:10.",
        "1718290920.000500",
        "U061F7AUR",
    )
    for mapped in (mention, reply, reaction, own, other, edit):
        schema = slack_events.PAYLOAD_SCHEMAS[mapped.type]
        assert set(mapped.data) == set(schema["required"])

    long = fixture("app_mention")
    long["event"]["text"] = "x" * 5000
    cut = slack_events.from_callback(long)
    assert cut is not None and len(cut.data["text"]) == 2000 and cut.data["textTruncated"]
    broken = fixture("app_mention")
    broken["event"]["ts"] = "yesterday"
    with pytest.raises(slack_events.Unmapped, match=r"event\.ts") as caught:
        slack_events.from_callback(broken)
    assert "yesterday" not in str(caught.value)


def test_credentials_are_scrubbed_from_what_slack_sdk_logs() -> None:
    line = scrub(
        "Failed to connect (error: 401, url='wss://wss-primary.slack.com/link/?ticket=9a8b7c&app_id=A1')"
        " token xapp-1-A1-2-abc and xoxb-12-34-def via http://user:pa55@proxy.example:3128"
    )
    for secret in ("9a8b7c", "xapp-1-A1-2-abc", "xoxb-12-34-def", "pa55"):
        assert secret not in line
    assert "ticket=[redacted]&app_id=A1" in line and "http://[redacted]@proxy.example" in line


# ---- Events API ingress -----------------------------------------------------------------------------


async def test_a_signed_mention_is_accepted_once_and_replays_and_retries_are_duplicates(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        message, bodies = slack.say(CHANNEL, f"<@{BOT_USER}> is the deploy done?")
        mention, plain = bodies
        answer = await slack.deliver(bridge.url, mention)
        assert (answer.status, answer.body) == (200, {"status": "accepted", "event": mention["event_id"]})
        answer = await slack.deliver(bridge.url, plain)
        assert (answer.status, answer.body["status"]) == (200, "accepted")
        assert bridge.logged("app_mention") == [
            {
                "channel": CHANNEL,
                "user": HUMAN,
                "text": f"<@{BOT_USER}> is the deploy done?",
                "textTruncated": False,
                "ts": message["ts"],
                "threadTs": message["ts"],
                "subtype": None,
                "files": [],
                "isReply": False,
                "parentUser": None,
                "occurredAt": bridge.logged("app_mention")[0]["occurredAt"],
                "isBot": False,
            }
        ]
        assert [m["ts"] for m in bridge.logged("message.channels")] == [message["ts"]]

        # The same request again, freshly signed (a replay), and Slack's own retries.
        answer = await slack.deliver(bridge.url, mention)
        assert (answer.status, answer.body["status"]) == (200, "duplicate")
        for attempt, reason in ((1, "http_timeout"), (2, "http_error")):
            answer = await slack.deliver(bridge.url, mention, retry_num=attempt, retry_reason=reason)
            assert (answer.status, answer.body["status"]) == (200, "duplicate")
        # Another delivery of the same message (a new event_id): one occurrence, still one event.
        again = slack.event_callback(mention["event"])
        answer = await slack.deliver(bridge.url, again)
        assert (answer.status, answer.body["status"]) == (200, "accepted")
        assert bridge.head() == 2


async def test_unsigned_forged_stale_and_future_requests_are_refused_and_leave_nothing(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        _, (mention, _) = slack.say(CHANNEL, f"<@{BOT_USER}> pay the invoice")
        body = json.dumps(mention).encode()
        now = int(time.time())
        refused: dict[str, dict[str, Any]] = {
            "wrong secret": {"secret": "not-the-signing-secret"},
            "no signature": {"signature_header": ""},
            "v1 scheme": {
                "signature_header": signature(slack.signing_secret, now, body).replace("v0=", "v1=")
            },
            "another body": {"signature_header": signature(slack.signing_secret, now, body + b" ")},
            "another timestamp": {"signature_header": signature(slack.signing_secret, now - 1, body)},
            # Past the 5 minutes by 30 s, counted when each is sent (a loaded machine takes seconds).
            "stale": {"timestamp": -330},
            "in the future": {"timestamp": 330},
        }
        for what, how in refused.items():
            if "timestamp" in how:
                how = {"timestamp": int(time.time()) + how["timestamp"]}
            answer = await slack.deliver(bridge.url, body, **how)
            assert (answer.status, answer.body["status"]) == (401, "refused"), what
        assert "is too old" in (await slack.deliver(bridge.url, body, timestamp=now - 3600)).body["error"]
        assert bridge.head() == 0
        # Nothing was remembered: the same event, rightly signed now, is news.
        answer = await slack.deliver(bridge.url, body)
        assert (answer.status, answer.body["status"]) == (200, "accepted")
        assert (await slack.deliver(bridge.url, b"[1, 2]")).status == 400


async def test_url_verification_is_answered_with_its_challenge_only_when_signed(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        challenge = fixture("url_verification")
        answer = await slack.deliver(bridge.url, challenge)
        assert (answer.status, answer.body) == (200, {"challenge": challenge["challenge"]})
        answer = await slack.deliver(bridge.url, challenge, secret="guess")
        assert answer.status == 401 and "challenge" not in answer.body


async def test_a_retry_of_a_request_that_never_arrived_is_accepted(tmp_path: Path, slack: FakeSlack) -> None:
    async with in_process(tmp_path, slack) as bridge:
        reaction = slack.reaction_added(CHANNEL, slack.say(CHANNEL, "deployed")[0]["ts"], "tada")
        answer = await slack.deliver(bridge.url, reaction, retry_num=1, retry_reason="http_timeout")
        assert (answer.status, answer.body["status"]) == (200, "accepted")
        assert [e["reaction"] for e in bridge.logged("reaction_added")] == ["tada"]


async def test_the_apps_own_posts_and_reactions_and_other_apps_posts_never_become_events(
    tmp_path: Path, slack: FakeSlack
) -> None:
    slack.echo = True  # the fake sends the bot's writes back as events, as Slack does
    async with in_process(tmp_path, slack) as bridge:
        slack.events_url = bridge.url
        message, _ = slack.say(CHANNEL, "the build is red")
        reply = await bridge.client.call_tool(
            "reply_in_thread",
            {"channel": CHANNEL, "thread_ts": message["ts"], "text": f"<@{BOT_USER}> on it"},
        )
        assert not reply.is_error, reply
        reacted = await bridge.client.call_tool(
            "add_reaction", {"channel": CHANNEL, "timestamp": message["ts"], "name": ":eyes:"}
        )
        assert not reacted.is_error, reacted
        # The reply (a message, not a mention: the bot wrote it) and the reaction came back, signed.
        echoes = await slack.wait_deliveries(2)
        assert [(d.status, d.body["status"], d.body["reason"]) for d in echoes] == [
            (200, "ignored", "the app's own")
        ] * 2

        alert = slack.event_callback(
            {
                "type": "message",
                "subtype": "bot_message",
                "text": "ALERT: checkout-api error rate 7%",
                "bot_id": "B0ALERTS",
                "app_id": "A0ALERTS",
                "ts": slack.next_ts(),
                "channel": CHANNEL,
                "channel_type": "channel",
            }
        )
        answer = await slack.deliver(bridge.url, alert)
        assert answer.body["status"] == "ignored" and "--keep-other-bots" in answer.body["reason"]
        assert bridge.head() == 0
        assert bridge.server.log.seen_delivery(alert["event_id"])

    async with in_process(tmp_path / "keep", slack, ignore_other_bots=False) as bridge:
        answer = await slack.deliver(bridge.url, alert)
        assert answer.body["status"] == "accepted"
        assert [(m["isBot"], m["user"]) for m in bridge.logged("message.channels")] == [(True, None)]
        own = slack.callbacks_for(CHANNEL, slack.messages(CHANNEL)[-1])  # the bot's reply again
        assert slack.messages(CHANNEL)[-1]["bot_id"] == BOT_ID
        assert (await slack.deliver(bridge.url, own[0])).body["status"] == "ignored"


# ---- filters ------------------------------------------------------------------------------------------


async def test_the_channel_and_user_filters_and_message_channels_requires_a_channel(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        for channel, user, text in ((CHANNEL, HUMAN, "one"), (OPS, HUMAN, "two"), (OPS, "U0BOB", "three")):
            for body in slack.say(channel, f"<@{BOT_USER}> {text}", user=user)[1]:
                assert (await slack.deliver(bridge.url, body)).body["status"] == "accepted"

        async def texts(name: str, arguments: dict[str, Any]) -> list[str]:
            polled = await bridge.poll(name, "0", arguments)
            return [event["data"]["text"].split()[-1] for event in polled["events"]]

        assert await texts("app_mention", {}) == ["one", "two", "three"]
        assert await texts("app_mention", {"channel": OPS}) == ["two", "three"]
        assert await texts("message.channels", {"channel": OPS, "user": "U0BOB"}) == ["three"]
        assert await texts("message.channels", {"channel": CHANNEL}) == ["one"]
        for name, arguments in (
            ("message.channels", {}),
            ("message.channels", {"channel": "general"}),
            ("app_mention", {"user": "alice"}),
            ("reaction_added", {"team": "T0FAKE"}),
        ):
            with pytest.raises(MCPError) as caught:
                await bridge.poll(name, "0", arguments)
            assert caught.value.code == protocol.INVALID_PARAMS, (name, arguments)


# ---- tools --------------------------------------------------------------------------------------------


async def test_tools_send_the_right_requests_and_errors_name_slacks_code(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        client = bridge.client
        assert {tool.name for tool in (await client.list_tools()).tools} == {
            "post_message",
            "reply_in_thread",
            "add_reaction",
            "get_thread",
            "get_user",
        }
        parent, _ = slack.say(CHANNEL, "is prod down?")
        slack.say(CHANNEL, "looks like it", thread_ts=parent["ts"])

        async def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = await client.call_tool(tool, arguments)
            assert not result.is_error, result
            content: dict[str, Any] | None = result.structured_content
            assert content is not None
            return content

        posted = await call("post_message", {"channel": OPS, "text": "Incident opened."})
        request = slack.calls("chat.postMessage")[-1]
        assert request.json == {
            "channel": OPS,
            "text": "Incident opened.",
            "link_names": False,
            "parse": "none",
        }
        assert request.headers["Authorization"] == f"Bearer {slack.bot_token}"
        assert posted == {"channel": OPS, "ts": slack.messages(OPS)[-1]["ts"]}

        replied = await call(
            "reply_in_thread", {"channel": CHANNEL, "thread_ts": parent["ts"], "text": "Yes."}
        )
        assert slack.calls("chat.postMessage")[-1].json == {
            "channel": CHANNEL,
            "text": "Yes.",
            "thread_ts": parent["ts"],
            "link_names": False,
            "parse": "none",
        }
        assert replied["threadTs"] == parent["ts"]

        assert await call(
            "add_reaction", {"channel": CHANNEL, "timestamp": parent["ts"], "name": "eyes"}
        ) == {
            "ok": True,
            "alreadyReacted": False,
        }
        assert slack.calls("reactions.add")[-1].args == {
            "channel": CHANNEL,
            "timestamp": parent["ts"],
            "name": "eyes",
        }
        again = await call("add_reaction", {"channel": CHANNEL, "timestamp": parent["ts"], "name": ":eyes:"})
        assert again["alreadyReacted"] is True

        thread = await call("get_thread", {"channel": CHANNEL, "thread_ts": parent["ts"], "limit": 10})
        assert slack.calls("conversations.replies")[-1].args == {
            "channel": CHANNEL,
            "ts": parent["ts"],
            "limit": "10",
        }
        assert [(m["user"], m["text"], m["isBot"]) for m in thread["messages"]] == [
            (HUMAN, "is prod down?", False),
            (HUMAN, "looks like it", False),
            (BOT_USER, "Yes.", True),
        ]
        user = await call("get_user", {"user": HUMAN})
        assert slack.calls("users.info")[-1].args == {"user": HUMAN}
        assert user == {
            "id": HUMAN,
            "name": "alice",
            "realName": "Alice Example",
            "displayName": "alice",
            "title": "",
            "isBot": False,
            "deleted": False,
            "timezone": "Europe/Amsterdam",
        }

        sent = len(slack.requests)
        for tool, arguments in (
            ("post_message", {"channel": "#general", "text": "hi"}),
            ("post_message", {"channel": CHANNEL, "text": ""}),
            ("reply_in_thread", {"channel": CHANNEL, "thread_ts": "yesterday", "text": "hi"}),
            ("add_reaction", {"channel": CHANNEL, "timestamp": parent["ts"], "name": "two words"}),
            ("get_user", {"user": "alice"}),
        ):
            assert (await client.call_tool(tool, arguments)).is_error, (tool, arguments)
        assert len(slack.requests) == sent

        result = await client.call_tool("post_message", {"channel": "C0NOWHERE", "text": "hello?"})
        text = result.content[0].text  # type: ignore[union-attr]
        assert result.is_error and text.endswith("Slack API chat.postMessage: channel_not_found"), text
        result = await client.call_tool("get_user", {"user": "U0NOBODY"})
        assert result.is_error and "user_not_found" in result.content[0].text  # type: ignore[union-attr]


PHISHING = "<!everyone> reset your SSO password at <https://evil.example/login|sso.acme.com>"
BROADCASTS = (PHISHING, "<!channel>", "<!here>", "<!subteam^S0123|@oncall>", "<@U0123ABCD>")


async def test_posts_mention_no_one_and_show_real_urls_unless_allow_mentions(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        parent, _ = slack.say(CHANNEL, "who is on call?")
        places = (
            ("post_message", {"channel": OPS}),
            ("reply_in_thread", {"channel": CHANNEL, "thread_ts": parent["ts"]}),
        )

        async def posted(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = await bridge.client.call_tool(tool, arguments)
            assert not result.is_error, result
            sent = slack.calls("chat.postMessage")[-1].json
            assert isinstance(sent, dict)
            return sent

        for tool, where in places:
            sent = await posted(tool, {**where, "text": PHISHING})
            # Shown as typed, the real URL included; Slack makes no mention or link of it.
            assert sent["text"] == (
                "&lt;!everyone&gt; reset your SSO password at &lt;https://evil.example/login|sso.acme.com&gt;"
            )
            assert (sent["link_names"], sent["parse"]) == (False, "none")
            expected = {
                "<!channel>": "&lt;!channel&gt;",
                "<!here>": "&lt;!here&gt;",
                "<!subteam^S0123|@oncall>": "&lt;!subteam^S0123|@oncall&gt;",
                "<@U0123ABCD>": "&lt;@U0123ABCD&gt;",
                "@here & @channel, plain": "@here &amp; @channel, plain",
            }
            for text, escaped in expected.items():
                sent = await posted(tool, {**where, "text": text, "allow_mentions": False})
                assert (sent["text"], sent["link_names"], sent["parse"]) == (escaped, False, "none"), text

            # allow_mentions (which the policy pins to false unless its rule allows it): as given.
            for text in BROADCASTS:
                sent = await posted(tool, {**where, "text": text, "allow_mentions": True})
                assert sent == {**where, "text": text}, text

        schema = {tool.name: tool.input_schema for tool in (await bridge.client.list_tools()).tools}
        for tool, _ in places:
            allow = schema[tool]["properties"]["allow_mentions"]
            assert allow["default"] is False and allow["type"] == "boolean"
            assert "policy" in allow["description"]
            assert "allow_mentions" not in schema[tool].get("required", [])


# ---- Socket Mode --------------------------------------------------------------------------------------


async def test_socket_mode_acks_each_envelope_after_its_commit_and_survives_reconnects(
    tmp_path: Path, slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="agentwake.bridge")
    async with in_process(tmp_path, slack, socket_mode=True) as bridge:
        # What the log held when each ack arrived: an ack must come after the commit, never before.
        slack.on_ack = lambda envelope_id: bridge.head()
        await slack.wait_connection(1)
        assert slack.calls("apps.connections.open")[0].headers["Authorization"] == f"Bearer {slack.app_token}"

        _, (mention, plain) = slack.say(CHANNEL, f"<@{BOT_USER}> status?")
        first = await slack.wait_ack(await slack.send_envelope(mention))
        assert (first.connection, first.seen) == (0, 1)
        assert bridge.logged("app_mention")[0]["text"] == f"<@{BOT_USER}> status?"
        # Slack's redelivery of an envelope (as after a lost ack) is acked and stores nothing.
        retried = await slack.wait_ack(
            await slack.send_envelope(mention, retry_attempt=1, retry_reason="timeout")
        )
        assert retried.seen == 1
        # Interactivity is not handled yet; its envelope is acknowledged all the same.
        await slack.wait_ack(await slack.send_envelope({"type": "block_actions"}, kind="interactive"))

        await slack.disconnect()
        await slack.wait_connection(2)
        assert len(slack.calls("apps.connections.open")) == 2
        second = await slack.wait_ack(await slack.send_envelope(plain))
        assert (second.connection, second.seen) == (1, 2)
        assert [m["ts"] for m in bridge.logged("message.channels")] == [mention["event"]["ts"]]
        # The same event over HTTP is a duplicate: both ingress paths share the event_id.
        assert (await slack.deliver(bridge.url, plain)).body["status"] == "duplicate"

        # A connection Slack drops without a word is replaced as well.
        await slack.drop()
        await slack.wait_connection(3)
        reaction = slack.reaction_added(CHANNEL, mention["event"]["ts"], "eyes")
        third = await slack.wait_ack(await slack.send_envelope(reaction))
        assert (third.connection, third.seen) == (2, 3)

    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "socket_mode: connected" in logged
    assert "ticket=[redacted]" in logged and not re.search(r"ticket=(?!\[redacted\])", logged)
    for secret in (slack.app_token, slack.bot_token, slack.signing_secret):
        assert secret not in logged


# ---- the command line -----------------------------------------------------------------------------------


def test_bad_command_lines_exit_2_with_one_error_line_and_no_secret(tmp_path: Path) -> None:
    secrets: dict[str, str | None] = {
        "SLACK_SIGNING_SECRET": "signing-never-print-this",
        "SLACK_BOT_TOKEN": "xoxb-never-print-this",
        "SLACK_APP_TOKEN": "xapp-never-print-this",
    }
    cases: list[tuple[list[str], dict[str, str | None], list[str]]] = [
        (["--listen", "127.0.0.1:0"], {**secrets, "SLACK_SIGNING_SECRET": None}, ["SLACK_SIGNING_SECRET"]),
        (
            ["--listen", "127.0.0.1:0", "--signing-secret-env", "AW_UNSET"],
            {**secrets, "AW_UNSET": None},
            ["AW_UNSET"],
        ),
        (["--socket-mode"], {**secrets, "SLACK_APP_TOKEN": None}, ["SLACK_APP_TOKEN", "--socket-mode"]),
        (["--socket-mode"], {**secrets, "SLACK_APP_TOKEN": "xoxb-not-an-app-token"}, ["xapp-"]),
        (["--api-base", "ftp://slack.example/api/"], secrets, ["API base URL"]),
        (["--api-base", "https://u:p@slack.example/api/"], secrets, ["credentials"]),
    ]
    level = logging.getLogger("agentwake.bridge").level
    try:
        for args, env, named in cases:
            result = CliRunner().invoke(
                app, ["bridge", "slack", "--state-dir", str(tmp_path / "state"), *args], env=env
            )
            errors = [line for line in result.output.splitlines() if line.startswith("error:")]
            assert result.exit_code == 2 and len(errors) == 1, (args, result.output)
            for needle in named:
                assert needle in errors[0], (args, result.output)
            for value in (*secrets.values(), "xoxb-not-an-app-token", "u:p"):
                assert value is not None and value not in result.output, (args, result.output)
    finally:
        logging.getLogger("agentwake.bridge").setLevel(level)
    assert not (tmp_path / "state").exists()
