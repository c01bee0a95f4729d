"""Approvals in Slack: held events posted with Approve and Deny buttons, answered through agentwake.

In process: the real operator endpoint over a real SQLite store holding held events
(tests/test_approvals_api.py), agentwake/fakes/slack.py as Slack's Web API, and a Slack bridge
with its aiohttp listener on loopback receiving signed clicks as Slack sends them.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from test_approvals_api import SLACK_TOKEN, TITLE, TOKEN, Held, held_endpoint
from typer.testing import CliRunner

from agentwake.bridges.framework import BridgeOptions, BridgeServer
from agentwake.bridges.slack import SlackBridge, SlackSettings
from agentwake.bridges.slack_approvals import APPROVE, DENY, PAUSE_RULE, RESUME_RULE, ApprovalSettings
from agentwake.cli import app
from agentwake.fakes.slack import HUMAN, FakeSlack, Recorded, signature

pytestmark = pytest.mark.anyio

OPS = "C0APPROVALS"
APPROVER = "U0APPROVER"


@dataclass
class Rig:
    held: Held
    slack: FakeSlack
    bridge: SlackBridge
    url: str  # the interactions URL
    http: aiohttp.ClientSession
    # The messages' ts by row, as first posted (an update takes the buttons away).
    posted: dict[int, str] = field(default_factory=dict)

    def click_body(self, row: int, action: str, *, user: str = APPROVER) -> bytes:
        return urllib.parse.urlencode({"payload": json.dumps(self.click(row, action, user=user))}).encode()

    def click(self, row: int, action: str, *, user: str = APPROVER) -> dict[str, Any]:
        return {
            "type": "block_actions",
            "user": {"id": user, "username": "someone"},
            "channel": {"id": OPS, "name": "approvals"},
            "message": {"ts": self.posted_ts(row)},
            "actions": [{"action_id": action, "value": str(row), "type": "button"}],
            "response_url": "https://hooks.slack.invalid/actions/1",
            "container": {"type": "message", "channel_id": OPS},
        }

    def posted_ts(self, row: int) -> str:
        if row in self.posted:
            return self.posted[row]
        for message in self.slack.messages(OPS):
            values = [e.get("value") for b in message["blocks"] for e in b.get("elements", [])]
            if str(row) in values:
                self.posted[row] = str(message["ts"])
                return self.posted[row]
        raise AssertionError(f"row {row} was not posted")

    async def send(
        self, body: bytes, *, stamp: int | None = None, signed: bool = True, signed_body: bytes | None = None
    ) -> int:
        stamp = int(time.time()) if stamp is None else stamp
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": str(stamp),
        }
        if signed:
            headers["X-Slack-Signature"] = signature(self.slack.signing_secret, stamp, signed_body or body)
        async with self.http.post(self.url, data=body, headers=headers) as response:
            return response.status


@asynccontextmanager
async def rig(tmp_path: Path, *, count: int = 1, socket_mode: bool = False) -> AsyncIterator[Rig]:
    async with (
        held_endpoint(tmp_path, count=count) as held,
        FakeSlack() as slack,
        aiohttp.ClientSession() as http,
    ):
        slack.add_channel(OPS, "approvals")
        options = BridgeOptions(
            state_dir=tmp_path / "bridge",
            listen="127.0.0.1:0",
            webhook_path="/slack/events",
            poll=socket_mode,
        )
        settings = SlackSettings(
            signing_secret=slack.signing_secret.encode(),
            bot_token=slack.bot_token,
            app_token=slack.app_token if socket_mode else None,
            api_base=slack.url,
            approvals=ApprovalSettings(
                url=held.url,
                token=SLACK_TOKEN,  # read and approve, nothing else
                channel=OPS,
                approvers=frozenset({APPROVER}),
                rules=("hold-*",),
                interval_s=3600,  # the first poll at start; the tests poll again themselves
            ),
        )
        bridge = SlackBridge(options, settings)
        server = BridgeServer(bridge)
        try:
            async with anyio.create_task_group() as tg:
                await server._start_webhook_listener(tg)
                assert server.webhook_address is not None
                host, port = server.webhook_address
                tg.start_soon(bridge.background)
                if socket_mode:
                    tg.start_soon(bridge.poll_forever)
                    await slack.wait_connection(1, timeout=60)
                await slack.wait_for("chat.postMessage", count=count, timeout=60)
                # The fake records a post as it is asked; the bridge notes it as posted only once the
                # answer is back. Its first poll holds the approvals lock while it posts: past the lock,
                # every row is noted, and a click on one is not taken for a click on a stranger's message.
                assert bridge.approvals is not None
                async with bridge.approvals._lock:
                    pass
                found = Rig(held, slack, bridge, f"http://{host}:{port}/slack/interactions", http)
                for row in held.rows:
                    found.posted_ts(row)
                yield found
                tg.cancel_scope.cancel()
        finally:
            await bridge.aclose()
            server.log.close()
            server.webhook_store.close()


def buttons(call: Recorded) -> list[dict[str, Any]]:
    blocks = call.args["blocks"]
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


async def test_a_held_event_is_posted_once_with_both_buttons_and_escaped_text(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        assert r.bridge.approvals is not None
        assert await r.bridge.approvals.poll_once() == 0  # already posted: not again
        [post] = r.slack.calls("chat.postMessage")
        assert post.args["channel"] == OPS
        row = str(r.held.rows[0])
        assert [(b["action_id"], b["value"]) for b in buttons(post)] == [
            (APPROVE, row),
            (DENY, row),
            (PAUSE_RULE, row),
        ]
        text = post.args["blocks"][0]["text"]["text"]
        assert "T-1" in text and "hold-suspicious" in text and "close_ticket" in text
        assert "Close &lt;@U0BOSS&gt; &amp; &lt;!channel&gt; now 1" in text
        assert "<@" not in text and "<!" not in text and "<@" not in post.args["text"]
        assert TITLE not in text


async def test_an_approvers_signed_click_approves_in_agentwake_and_updates_the_message(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path) as r:
        row = r.held.rows[0]
        # Someone else's click changes nothing.
        assert await r.send(r.click_body(row, APPROVE, user=HUMAN)) == 200
        assert (await r.held.detail(row))["state"] == "held"
        assert r.slack.calls("chat.update") == []
        # Unsigned, wrongly signed, or stale: 401, and nothing.
        assert await r.send(r.click_body(row, APPROVE), signed=False) == 401
        body = r.click_body(row, APPROVE)
        assert await r.send(body, stamp=int(time.time()) - 600) == 401
        assert await r.send(body.replace(b"approve", b"deny"), signed_body=body) == 401
        assert (await r.held.detail(row))["state"] == "held"

        assert await r.send(body) == 200
        update = await r.slack.wait_for("chat.update", timeout=60)
        approved = await r.held.detail(row)
        assert approved["state"] == "pending"  # back in the inbox: the agent runs on it
        assert approved["approval_note"] == f"approved in Slack by <@{APPROVER}>"
        # Who approved: the Slack user the bridge's token relayed, from the bridge's address.
        [answer] = approved["answers"]
        assert (answer["answer"], answer["who"], answer["via"]) == (
            "approved",
            f"slack:{APPROVER}",
            "relayed by token slack",
        )
        assert answer["address"] == "127.0.0.1" and answer["at"] and answer["rule"] == "hold-suspicious"
        assert answer["tools"] == ["close_ticket"]
        assert update.args["ts"] == r.posted_ts(row) and update.args["channel"] == OPS
        assert buttons(update) == []
        assert f"Approved by <@{APPROVER}>" in update.args["text"]
        # A second click on the answered message does nothing more.
        assert await r.send(body) == 200
        assert r.bridge.approvals is not None
        await r.bridge.approvals.poll_once()
        assert len(r.slack.calls("chat.update")) == 1
        assert len(r.slack.calls("chat.postMessage")) == 1


async def test_deny_records_the_reason_and_events_answered_elsewhere_lose_their_buttons(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, count=2) as r:
        first, second = r.held.rows
        assert await r.send(r.click_body(first, DENY)) == 200
        update = await r.slack.wait_for("chat.update", timeout=60)
        denied = await r.held.detail(first)
        assert denied["state"] == "denied"
        assert denied["approval_note"] == f"denied in Slack by <@{APPROVER}>"
        assert f"Denied by <@{APPROVER}>" in update.args["text"] and buttons(update) == []

        # The other is approved on the operator endpoint (the CLI, the page): the next poll says so.
        async with r.http.post(
            f"{r.held.url}/approvals/{second}/approve",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response:
            assert response.status == 200
        assert r.bridge.approvals is not None
        await r.bridge.approvals.poll_once()
        closed = r.slack.calls("chat.update")[1]
        assert closed.args["ts"] == r.posted_ts(second)
        assert "answered outside Slack" in closed.args["text"] and buttons(closed) == []


async def test_a_click_over_socket_mode_is_acknowledged_and_answered_the_same_way(tmp_path: Path) -> None:
    async with rig(tmp_path, socket_mode=True) as r:
        row = r.held.rows[0]
        await r.slack.wait_ack(
            await r.slack.send_envelope(r.click(row, APPROVE, user=HUMAN), kind="interactive")
        )
        assert (await r.held.detail(row))["state"] == "held"
        await r.slack.wait_ack(await r.slack.send_envelope(r.click(row, APPROVE), kind="interactive"))
        update = await r.slack.wait_for("chat.update", timeout=60)
        assert (await r.held.detail(row))["state"] == "pending"
        assert f"Approved by <@{APPROVER}>" in update.args["text"] and buttons(update) == []


def test_approvals_flags_are_checked_and_the_token_never_printed(tmp_path: Path) -> None:
    env: dict[str, str | None] = {"SLACK_BOT_TOKEN": "xoxb-never-print-this", "AGENTWAKE_TOKEN": None}
    url = ["--approvals-url", "http://127.0.0.1:9464"]
    cases: list[tuple[list[str], dict[str, str | None], str]] = [
        ([*url, "--approvals-channel", OPS, "--approver", APPROVER], env, "AGENTWAKE_TOKEN"),
        ([*url], {**env, "AGENTWAKE_TOKEN": "aw-never-print-this"}, "--approver"),
        (["--approvals-channel", OPS, "--approver", APPROVER], env, "need --approvals-url"),
        (
            [
                "--approvals-url",
                "https://u:aw-never-print-this@x/",
                "--approvals-channel",
                OPS,
                "--approver",
                "U1",
            ],
            {**env, "AGENTWAKE_TOKEN": "aw-never-print-this"},
            "credentials",
        ),
    ]
    for args, case_env, needle in cases:
        result = CliRunner().invoke(
            app, ["bridge", "slack", "--state-dir", str(tmp_path / "state"), *args], env=case_env
        )
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert result.exit_code == 2 and len(errors) == 1 and needle in errors[0], (args, result.output)
        assert "never-print-this" not in result.output
    assert not (tmp_path / "state").exists()


async def test_an_approver_pauses_the_held_events_rule_from_slack_and_resumes_it(tmp_path: Path) -> None:
    """The "Pause rule" button pauses the rule agentwake listed for the row (as the approver), and the
    message the bridge posts about it resumes it; other people's clicks change nothing."""
    async with rig(tmp_path) as r:
        row = r.held.rows[0]
        assert await r.send(r.click_body(row, PAUSE_RULE, user=HUMAN)) == 200
        assert await r.held.store.pauses() == []
        # The click's value names a row; the rule comes from what the bridge kept for that message.
        forged = r.click(row, PAUSE_RULE)
        forged["actions"][0]["value"] = str(row + 1000)
        body = urllib.parse.urlencode({"payload": json.dumps(forged)}).encode()
        assert await r.send(body) == 200
        assert await r.held.store.pauses() == []

        assert await r.send(r.click_body(row, PAUSE_RULE)) == 200
        note = await r.slack.wait_for("chat.postMessage", count=2, timeout=60)
        [pause] = await r.held.store.pauses()
        assert (pause.scope, pause.name, pause.by) == ("rule", "hold-suspicious", f"slack:{APPROVER}")
        assert pause.reason == f"paused in Slack by <@{APPROVER}>"
        assert "Rule `hold-suspicious` paused by" in note.args["text"]
        [resume_button] = buttons(note)
        assert resume_button["action_id"] == RESUME_RULE
        assert (await r.held.detail(row))["state"] == "held"  # pausing answers nothing

        resume_ts = str(r.slack.messages(OPS)[-1]["ts"])
        # The bridge keeps the note's ts once chat.postMessage has answered: a click before that is
        # not on a message of its own (as Slack could deliver it, a moment after the post).
        assert r.bridge.approvals is not None
        with anyio.fail_after(60):
            while resume_ts not in await r.bridge.approvals._pause_messages():  # noqa: ASYNC110 - a state file
                await anyio.sleep(0.01)
        click = r.click(row, RESUME_RULE)
        click["message"] = {"ts": resume_ts}
        by_someone = {**click, "user": {"id": HUMAN}}
        assert await r.send(urllib.parse.urlencode({"payload": json.dumps(by_someone)}).encode()) == 200
        assert len(await r.held.store.pauses()) == 1
        assert await r.send(urllib.parse.urlencode({"payload": json.dumps(click)}).encode()) == 200
        update = await r.slack.wait_for("chat.update", timeout=60)
        assert await r.held.store.pauses() == []
        assert update.args["ts"] == resume_ts and buttons(update) == []
        assert f"resumed by <@{APPROVER}>" in update.args["text"]
