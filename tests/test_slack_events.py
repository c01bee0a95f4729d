"""The Slack bridge's event types beyond mentions, channel messages and reactions: DMs (message.im),
private channels (message.groups), group DMs (message.mpim), edits (message.changed), deletions
(message.deleted) and joins (member_joined_channel), and the subtype, files and thread fields of every
message event.

Slack's own examples (slackapi/bolt-python's scenario bodies, read from ``conftest.UPSTREAM_PAYLOADS``,
their timestamps moved to now) go through the signed Events API and through Socket Mode of a real
bridge on loopback (tests/test_slack_bridge.py's harness); the fake Slack's ``say``, ``edit``,
``delete`` and ``join`` make the same shapes for the rest.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import UPSTREAM_PAYLOADS
from test_slack_bridge import InProcess, in_process

from agentwake.bridges import slack_events
from agentwake.fakes.slack import BOT_USER, CHANNEL, DM, HUMAN, FakeSlack

pytestmark = pytest.mark.anyio

BOLT = UPSTREAM_PAYLOADS / "slack" / "bolt-python"
PRIVATE = "C0PRIVATE"
GROUP_DM = "C0MPIM"
_TS = re.compile(r"^\d{10}\.\d{6}$")


def upstream(label: str, *, app_user: str | None = None) -> dict[str, Any]:
    """One of Slack's example bodies, its timestamps moved to now (in order) and its event_id made
    unique; with ``app_user``, the app's bot user in ``authorizations`` is that one instead."""
    body: dict[str, Any] = json.loads((BOLT / f"{label}.json").read_text())
    stamps: list[float] = []

    def collect(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                collect(item)
        elif isinstance(value, list):
            for item in value:
                collect(item)
        elif isinstance(value, str) and _TS.fullmatch(value):
            stamps.append(float(value))

    collect(body)
    shift = time.time() - max(stamps, default=float(body["event_time"]))

    def moved(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: moved(item) for key, item in value.items()}
        if isinstance(value, list):
            return [moved(item) for item in value]
        if isinstance(value, str) and _TS.fullmatch(value):
            seconds, _, micros = value.partition(".")
            return f"{int(seconds) + int(shift)}.{micros}"
        return value

    fresh: dict[str, Any] = moved(body)
    fresh["event_time"] = int(body["event_time"] + shift)
    fresh["event_id"] = f"Ev{label.replace('.', '_').upper()}{time.monotonic_ns()}"[:64]
    if app_user is not None:
        for entry in fresh.get("authorizations", []):
            entry["user_id"] = app_user
    return fresh


def another_delivery(body: dict[str, Any]) -> dict[str, Any]:
    """The same event under a new event_id, as a second ingress path or a resend would bring it."""
    again = copy.deepcopy(body)
    again["event_id"] = body["event_id"][:40] + "-AGAIN"
    return again


def logged(bridge: InProcess, event_type: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.event_id, e.data) for e in bridge.server.log.read(event_type, 0, 100).events]


async def through_both_paths(
    tmp_path: Path, slack: FakeSlack, body: dict[str, Any], event_type: str
) -> tuple[str, dict[str, Any]]:
    """``body`` signed to the Events API of one bridge and as a Socket Mode envelope to another; both
    store the same event. A bridge with both paths that sees it twice (two event_ids) stores it once.
    Returns the event's id and data."""
    async with in_process(tmp_path / "events_api", slack) as bridge:
        answer = await slack.deliver(bridge.url, body)
        assert (answer.status, answer.body["status"]) == (200, "accepted"), answer.body
        [(event_id, data)] = logged(bridge, event_type)
        jsonschema.validate(data, slack_events.PAYLOAD_SCHEMAS[event_type])
    connections = len(slack.connections)
    async with in_process(tmp_path / "socket_mode", slack, socket_mode=True) as bridge:
        await slack.wait_connection(connections + 1)
        await slack.wait_ack(await slack.send_envelope(body))
        assert logged(bridge, event_type) == [(event_id, data)]
        # The other path sees it too, under another event_id: still one event.
        answer = await slack.deliver(bridge.url, another_delivery(body))
        assert (answer.status, answer.body["status"]) == (200, "accepted")
        assert bridge.head() == 1
    return event_id, data


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        fake.add_channel(PRIVATE, "security", kind="group")
        fake.add_channel(GROUP_DM, "mpdm-alice--bob--agentwake-1", kind="mpim")
        yield fake


# ---- Slack's own examples, through both ingress paths --------------------------------------------------


async def test_a_dm_to_the_app_is_message_im_from_either_path(tmp_path: Path, slack: FakeSlack) -> None:
    body = upstream("message.im")
    event = body["event"]
    event_id, data = await through_both_paths(tmp_path, slack, body, "message.im")
    assert event_id == f"message.im:D111:{event['ts']}"
    assert data == {
        "channel": "D111",
        "user": "W222",
        "text": "When Slack was released?",
        "textTruncated": False,
        "ts": event["ts"],
        "threadTs": event["thread_ts"],
        "subtype": None,
        "files": [],
        "isReply": True,
        "parentUser": "W222",
        "occurredAt": data["occurredAt"],
        "isBot": False,
    }


async def test_a_file_shared_in_a_private_channel_is_message_groups_without_content_or_urls(
    tmp_path: Path, slack: FakeSlack
) -> None:
    # In Slack's example the sharer is the app's own bot user: as it is, the bridge drops it.
    own = upstream("message.file_share.group")
    assert own["event"]["user"] == own["authorizations"][0]["user_id"]
    async with in_process(tmp_path / "own", slack) as bridge:
        answer = await slack.deliver(bridge.url, own)
        assert (answer.body["status"], answer.body["reason"]) == ("ignored", "the app's own")
        assert bridge.head() == 0

    body = upstream("message.file_share.group", app_user="U0APPBOT")
    event_id, data = await through_both_paths(tmp_path, slack, body, "message.groups")
    assert event_id == f"message.groups:G111:{body['event']['ts']}"
    assert data["subtype"] == "file_share" and data["text"] == "Here is your file!"
    assert data["files"] == [{"name": "test.png", "filetype": "png", "mimetype": "image/png", "size": 42706}]
    served = json.dumps(data)
    for leak in ("files.slack.com", "slack-files.com", "url_private", "thumb", "permalink", "F111"):
        assert leak not in served


async def test_a_file_shared_in_a_channel_is_message_channels_with_its_subtype(
    tmp_path: Path, slack: FakeSlack
) -> None:
    body = upstream("message.file_share.channel")
    _, data = await through_both_paths(tmp_path, slack, body, "message.channels")
    assert (data["subtype"], data["isReply"]) == ("file_share", False)
    assert data["files"] == [{"name": "file.png", "filetype": "png", "mimetype": "image/png", "size": 92582}]
    assert "files.slack.com" not in json.dumps(data)


async def test_a_thread_broadcast_and_a_thread_reply_are_messages_that_know_their_thread(
    tmp_path: Path, slack: FakeSlack
) -> None:
    body = upstream("message.thread_broadcast")
    event = body["event"]
    _, data = await through_both_paths(tmp_path / "broadcast", slack, body, "message.channels")
    assert (data["subtype"], data["isReply"], data["threadTs"], data["parentUser"]) == (
        "thread_broadcast",
        True,
        event["thread_ts"],
        "U111",  # from the thread's root, which a broadcast carries
    )
    reply = upstream("message.channel.thread_reply")
    _, data = await through_both_paths(tmp_path / "reply", slack, reply, "message.channels")
    assert (data["subtype"], data["isReply"], data["threadTs"], data["parentUser"]) == (
        None,
        True,
        reply["event"]["thread_ts"],
        "W222",
    )


async def test_an_edit_is_message_changed_with_the_new_text_from_either_path(
    tmp_path: Path, slack: FakeSlack
) -> None:
    body = upstream("message.message_changed")
    event = body["event"]
    event_id, data = await through_both_paths(tmp_path, slack, body, "message.changed")
    # Slack's example message has no ts of its own: its previous version's names it.
    edited = event["previous_message"]["ts"]
    assert event_id == f"message.changed:C111:{edited}:{event['ts']}"
    assert data == {
        "channel": "C111",
        "channelType": "channel",
        "user": "U111",
        "text": "updated message",
        "textTruncated": False,
        "ts": edited,
        "threadTs": edited,
        "occurredAt": data["occurredAt"],
        "isBot": False,
    }
    assert "original message" not in json.dumps(data)


async def test_a_deletion_is_message_deleted_without_its_text_from_either_path(
    tmp_path: Path, slack: FakeSlack
) -> None:
    body = upstream("message.message_deleted")
    event = body["event"]
    event_id, data = await through_both_paths(tmp_path, slack, body, "message.deleted")
    assert event_id == f"message.deleted:C111:{event['deleted_ts']}"
    assert data == {
        "channel": "C111",
        "channelType": "channel",
        "user": "U111",
        "ts": event["deleted_ts"],
        "threadTs": event["deleted_ts"],
        "occurredAt": data["occurredAt"],
        "isBot": False,
    }


async def test_a_join_is_member_joined_channel_with_its_inviter_from_either_path(
    tmp_path: Path, slack: FakeSlack
) -> None:
    body = upstream("member_joined_channel")  # Slack's example carries no event_ts: event_time names it
    event_id, data = await through_both_paths(tmp_path, slack, body, "member_joined_channel")
    assert event_id == f"member_joined_channel:C111:U999:{body['event_time']}"
    assert data == {
        "channel": "C111",
        "channelType": "channel",
        "user": "U999",
        "inviter": "U222",
        "occurredAt": data["occurredAt"],
        "isBot": False,
    }


async def test_the_apps_own_and_other_apps_messages_from_slacks_examples_are_dropped(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        for label, reason in (
            ("message.user_with_authorizations", "the app's own"),
            ("message.bot", "the app's own"),
            ("message.classic_bot_message", "another app's (--keep-other-bots keeps them)"),
        ):
            answer = await slack.deliver(bridge.url, upstream(label))
            assert (answer.body["status"], answer.body["reason"]) == ("ignored", reason), label
        assert bridge.head() == 0


# ---- the fake's conversations, edits, deletions and joins --------------------------------------------


async def test_dms_private_channels_and_group_dms_each_have_their_event_type(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack, socket_mode=True) as bridge:
        await slack.wait_connection(1)
        sent = {}
        for channel, event_type in (
            (DM, "message.im"),
            (PRIVATE, "message.groups"),
            (GROUP_DM, "message.mpim"),
            (CHANNEL, "message.channels"),
        ):
            message, bodies = slack.say(channel, f"<@{BOT_USER}> the VPN is down")
            # A DM has no app_mention: every message there is to the app.
            assert [b["event"]["type"] for b in bodies] == (
                ["message"] if channel == DM else ["app_mention", "message"]
            )
            assert bodies[-1]["event"]["channel_type"] == slack.channels[channel].kind
            await slack.wait_ack(await slack.send_envelope(bodies[-1]))
            sent[event_type] = (channel, message["ts"])
        for event_type, (channel, ts) in sent.items():
            assert [e for e, _ in logged(bridge, event_type)] == [f"{event_type}:{channel}:{ts}"]

        # Private channels need a channel filter, as public ones do; DMs and group DMs do not.
        assert len((await bridge.poll("message.im", "0", {}))["events"]) == 1
        assert len((await bridge.poll("message.mpim", "0", {"user": HUMAN}))["events"]) == 1
        assert len((await bridge.poll("message.groups", "0", {"channel": PRIVATE}))["events"]) == 1
        for name in ("message.groups", "message.channels"):
            assert slack_events.ARGUMENTS_SCHEMAS[name]["required"] == ["channel"]
        for name in (
            "message.im",
            "message.mpim",
            "message.changed",
            "message.deleted",
            "member_joined_channel",
        ):
            assert "required" not in slack_events.ARGUMENTS_SCHEMAS[name]


async def test_files_broadcasts_and_replies_from_the_fake(tmp_path: Path, slack: FakeSlack) -> None:
    async with in_process(tmp_path, slack) as bridge:
        parent, _ = slack.say(CHANNEL, "the nightly export failed")
        spec = {"name": "export.log", "filetype": "text", "mimetype": "text/plain", "size": 5120}
        shared, [body] = slack.say(
            CHANNEL, "here is the log", thread_ts=parent["ts"], files=[spec, {**spec, "name": "trace.txt"}]
        )
        assert body["event"]["files"][0]["url_private"].startswith("https://files.slack.com/")
        broadcast, [cast] = slack.say(CHANNEL, "fixed, see thread", thread_ts=parent["ts"], broadcast=True)
        for sent in (body, cast):
            assert (await slack.deliver(bridge.url, sent)).body["status"] == "accepted"
        [(_, with_files), (_, broadcasted)] = logged(bridge, "message.channels")
        assert with_files["files"] == [spec, {**spec, "name": "trace.txt"}]
        assert (with_files["subtype"], with_files["isReply"], with_files["parentUser"]) == (
            "file_share",
            True,
            HUMAN,
        )
        assert "files.slack.com" not in json.dumps(with_files)
        assert (broadcasted["subtype"], broadcasted["threadTs"], broadcasted["parentUser"]) == (
            "thread_broadcast",
            parent["ts"],
            HUMAN,
        )
        assert shared["ts"] != broadcast["ts"]


async def test_edits_deletions_and_joins_from_the_fake_and_the_apps_own_are_dropped(
    tmp_path: Path, slack: FakeSlack
) -> None:
    slack.echo = True  # the bot's own update comes back as message_changed, as on Slack
    async with in_process(tmp_path, slack, socket_mode=True) as bridge:
        await slack.wait_connection(1)
        message, _ = slack.say(DM, "restart the worker pls")
        edit = slack.edit(DM, message["ts"], "restart the *billing* worker please " + "x" * 3000)
        await slack.wait_ack(await slack.send_envelope(edit))
        [(event_id, data)] = logged(bridge, "message.changed")
        assert event_id == f"message.changed:{DM}:{message['ts']}:{edit['event']['ts']}"
        assert (data["channelType"], data["user"], data["ts"]) == ("im", HUMAN, message["ts"])
        assert len(data["text"]) == 2000 and data["textTruncated"]

        deletion = slack.delete(DM, message["ts"])
        assert (await slack.deliver(bridge.url, deletion)).body["status"] == "accepted"
        assert [e for e, _ in logged(bridge, "message.deleted")] == [f"message.deleted:{DM}:{message['ts']}"]

        joined = slack.join(PRIVATE, "U0BOB", inviter=HUMAN)
        assert (await slack.deliver(bridge.url, joined)).body["status"] == "accepted"
        [(_, join)] = logged(bridge, "member_joined_channel")
        assert (join["channel"], join["channelType"], join["user"], join["inviter"]) == (
            PRIVATE,
            "group",
            "U0BOB",
            HUMAN,
        )
        head = bridge.head()

        # The app's own: its post, its update (echoed by the fake over Socket Mode), its deletion and
        # joining by itself; and an unfurl, which nobody edited.
        posted = await bridge.client.call_tool("post_message", {"channel": CHANNEL, "text": "Restarted."})
        assert not posted.is_error, posted
        ts = slack.messages(CHANNEL)[-1]["ts"]
        await bridge.bridge.api.post_blocks(CHANNEL, ts, "Restarted (billing).", [])
        await slack.wait_quiet()
        for body in (slack.delete(CHANNEL, ts), slack.join(CHANNEL, BOT_USER)):
            answer = await slack.deliver(bridge.url, body)
            assert (answer.body["status"], answer.body["reason"]) == ("ignored", "the app's own"), body
        human, _ = slack.say(CHANNEL, "see https://status.example")
        unfurl = slack.edit(CHANNEL, human["ts"], human["text"])
        del unfurl["event"]["message"]["edited"]
        assert (await slack.deliver(bridge.url, unfurl)).body["status"] == "ignored"
        assert bridge.head() == head
        assert len(slack.acks) == 3  # the edit, and the echoes of the post and the update
        # Added to a channel by someone is news, though it is the app that joined.
        invited = slack.join(PRIVATE, BOT_USER, inviter=HUMAN)
        assert (await slack.deliver(bridge.url, invited)).body["status"] == "accepted"


async def test_edit_and_deletion_filters_and_a_deleted_thread_parent(
    tmp_path: Path, slack: FakeSlack
) -> None:
    async with in_process(tmp_path, slack) as bridge:
        parent, _ = slack.say(PRIVATE, "prod db password rotated")
        other, _ = slack.say(CHANNEL, "lunch?", user="U0BOB")
        for body in (
            slack.edit(PRIVATE, parent["ts"], "prod db password rotated (done)"),
            slack.edit(CHANNEL, other["ts"], "lunch at 12?"),
        ):
            assert (await slack.deliver(bridge.url, body)).body["status"] == "accepted"
        polled = await bridge.poll("message.changed", "0", {"channel": PRIVATE})
        assert [e["data"]["text"] for e in polled["events"]] == ["prod db password rotated (done)"]
        polled = await bridge.poll("message.changed", "0", {"user": "U0BOB"})
        assert [e["data"]["text"] for e in polled["events"]] == ["lunch at 12?"]

        # A thread's parent deleted while its replies remain stays as a tombstone: a deletion, one
        # event with the deletion Slack may send for it too.
        slack.say(PRIVATE, "rotating now", thread_ts=parent["ts"])
        tombstone = slack.edit(PRIVATE, parent["ts"], "This message was deleted.")
        tombstone["event"]["message"]["subtype"] = "tombstone"
        for body in (tombstone, slack.delete(PRIVATE, parent["ts"])):
            assert (await slack.deliver(bridge.url, body)).body["status"] == "accepted"
        [(event_id, data)] = logged(bridge, "message.deleted")
        assert event_id == f"message.deleted:{PRIVATE}:{parent['ts']}"
        assert (data["channelType"], data["user"]) == ("group", HUMAN)
