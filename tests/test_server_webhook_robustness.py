"""The webhook sender under pressure: races with the store, store errors, hostile input.

A subscription that ended (unsubscribed, or terminated just before a shutdown) is
never written back to the store nor resumed on the next start; a store error while
deleting a terminated subscription, or an event too deeply nested to encode, ends
only that one thing and every other delivery goes on; an endpoint answering the
verification with a body nested too deep, or echoing a lone surrogate, fails the
challenge like any wrong echo.

Everything is real: an in-process MCP server and client, an HTTPS receiver on
loopback, SQLite files. ``WatchedStore`` is a real ``SqliteWebhookStore`` that can
hold one save or fail deletes on purpose and tells the test what it wrote, so tests
wait on the store and on the sender's own log lines, never on sleeps.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
import trustme
from _webhook_server_support import (
    WAIT,
    Caller,
    Changes,
    Receiver,
    Signals,
    Wire,
    declare_incidents,
    incident,
    new_secret,
    serving,
    webhook_settings,
)
from mcp import Client
from mcp.server.mcpserver import MCPServer

from agentwake.server import EventContext, EventsExtension, SqliteWebhookStore, StoredWebhook, forbidden

pytestmark = pytest.mark.anyio


class WatchedStore(SqliteWebhookStore):
    """A real SQLite store that reports its saves and can hold one save or fail deletes on purpose.

    The extension calls it from worker threads; what it notes is handed to the test's event
    loop, where ``until`` waits for it.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hold_save_of: str | None = None  # the next save of this id waits for ``release``
        self.held = False
        self.release = threading.Event()
        self.fail_deletes = False
        self.saved: list[str] = []  # ids, in the order they were written
        self._token = anyio.lowlevel.current_token()
        self._changes = Changes()

    def save(self, record: StoredWebhook) -> None:
        if record.id == self.hold_save_of:
            self.hold_save_of = None
            self._tell(self._note_held)
            if not self.release.wait(WAIT):
                raise TimeoutError("the test never released the held save")
        super().save(record)
        self._tell(self._note_saved, record.id)

    def delete(self, subscription_id: str) -> None:
        if self.fail_deletes:
            raise sqlite3.OperationalError("database is locked")
        super().delete(subscription_id)

    def _tell(self, note: Callable[..., None], *args: Any) -> None:
        anyio.from_thread.run_sync(note, *args, token=self._token)

    def _note_held(self) -> None:
        self.held = True
        self._changes.changed()

    def _note_saved(self, subscription_id: str) -> None:
        self.saved.append(subscription_id)
        self._changes.changed()

    async def until(self, predicate: Callable[[], bool]) -> None:
        await self._changes.until(predicate)


def incidents(ca: trustme.CA, caller: Caller, **settings: Any) -> EventsExtension:
    events = EventsExtension(webhook=webhook_settings(ca, **settings), principal_of=caller)
    declare_incidents(events)
    return events


async def test_a_subscription_unsubscribed_while_a_flush_waits_on_another_save_is_not_written_back(
    ca: trustme.CA, tmp_path: Path, signals: Signals
) -> None:
    caller = Caller()
    path = tmp_path / "hooks.db"
    store = WatchedStore(path)
    events = incidents(ca, caller, store=store, sweep_interval=timedelta(milliseconds=20))
    resumed: list[str] = []
    try:
        async with Receiver(ca) as receiver:
            async with serving(events, caller) as wire:
                kept = await wire.subscribe(
                    "incident.created", receiver.url("/kept"), new_secret(), {"severity": "P1"}, ttlMs=None
                )
                dropped = await wire.subscribe(
                    "incident.created", receiver.url("/dropped"), new_secret(), {"severity": "P2"}, ttlMs=None
                )
                # kept comes first in every flush; the one that saves its moved watermark is held there.
                store.hold_save_of = kept["id"]
                events.emit(incident(1, "P1"))
                await store.until(lambda: store.held)
                # dropped's watermark moves while that flush waits, then dropped is unsubscribed.
                events.emit(incident(2, "P2"))
                await signals.done("inc-2")
                await wire.unsubscribe("incident.created", receiver.url("/dropped"), {"severity": "P2"})
                saves_of_kept = store.saved.count(kept["id"])
                store.release.set()
                # kept read inc-2 too, so a later flush saves it again: by then the held flush is over.
                await store.until(lambda: store.saved.count(kept["id"]) >= saves_of_kept + 2)
                stored = [r.id for r in store.load()]
            store.close()

            store = WatchedStore(path)
            events = incidents(ca, caller, store=store)

            @events.on_subscribe("incident.created")
            def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
                resumed.append(sid)

            async with serving(events, caller):
                live = events.webhook_subscriptions()
    finally:
        store.release.set()
        store.close()

    assert stored == [kept["id"]], f"unsubscribed {dropped['id']} was written back"
    assert resumed == [kept["id"]] and live == 1  # only kept is resumed after the restart


async def test_a_subscription_terminated_just_before_a_shutdown_is_not_resumed_on_the_next_start(
    ca: trustme.CA, tmp_path: Path
) -> None:
    caller = Caller()
    path = tmp_path / "hooks.db"
    resumed: list[str] = []

    def lifetime() -> tuple[EventsExtension, SqliteWebhookStore]:
        store = SqliteWebhookStore(path)
        events = incidents(ca, caller, store=store)

        @events.on_subscribe("incident.created")
        def on_subscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
            resumed.append(sid)

        return events, store

    async with Receiver(ca) as receiver:
        events, store = lifetime()
        server = MCPServer("t", extensions=[events])
        events.install(server)
        try:
            async with events.running():
                async with Client(server) as client:
                    granted = await Wire(client, caller).subscribe(
                        "incident.created", receiver.url(), new_secret(), ttlMs=None
                    )
                # The server shuts down right after ending it: its background work never gets to run.
                terminated = events.terminate_webhooks("incident.created", error=forbidden("access revoked"))
            left = [r.id for r in store.load()]
        finally:
            store.close()

        events, store = lifetime()
        try:
            async with serving(events, caller):
                live = events.webhook_subscriptions()
        finally:
            store.close()

    assert terminated == 1
    assert left == [], "the terminated subscription is still in the store after the shutdown"
    assert resumed == [granted["id"]] and live == 0  # on_subscribe once, at the subscribe only


async def test_a_store_error_deleting_a_terminated_subscription_does_not_stop_the_other_deliveries(
    ca: trustme.CA, tmp_path: Path
) -> None:
    caller = Caller()
    store = WatchedStore(tmp_path / "hooks.db")
    events = incidents(ca, caller, store=store)
    ended = anyio.Event()

    @events.on_unsubscribe("incident.created")
    def on_unsubscribe(ctx: EventContext, arguments: dict[str, Any], sid: str) -> None:
        ended.set()

    try:
        async with Receiver(ca) as receiver:
            async with serving(events, caller) as wire:
                await wire.subscribe(
                    "incident.created", receiver.url("/victim"), new_secret(), {"severity": "P1"}, ttlMs=None
                )
                bystander = await wire.subscribe(
                    "incident.created",
                    receiver.url("/bystander"),
                    new_secret(),
                    {"severity": "P2"},
                    ttlMs=None,
                )
                store.fail_deletes = True  # sqlite says "database is locked"
                count = events.terminate_webhooks(
                    "incident.created",
                    error=forbidden("access revoked"),
                    where=lambda arguments, principal: arguments.get("severity") == "P1",
                )
                with anyio.fail_after(WAIT):
                    await ended.wait()
                events.emit(incident(1, "P2"))
                delivered = await receiver.next("event")
                live = events.webhook_subscriptions()
                store.fail_deletes = False  # the store recovers: the shutdown deletes what is left
            left = [r.id for r in store.load()]
    finally:
        store.close()

    assert count == 1 and live == 1
    assert (delivered.path, delivered.document["eventId"]) == ("/bystander", "inc-1")
    assert left == [bystander["id"]]


async def test_an_event_nested_deeper_than_the_recursion_limit_is_abandoned_and_every_delivery_goes_on(
    ca: trustme.CA, signals: Signals
) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    deep: dict[str, Any] = {}
    level = deep
    for _ in range(2 * sys.getrecursionlimit()):
        level["x"] = {}
        level = level["x"]
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        await wire.subscribe("incident.created", receiver.url("/all"), new_secret())
        await wire.subscribe("incident.created", receiver.url("/p2"), new_secret(), {"severity": "P2"})
        events.emit(incident(1, "P1", blob=deep))  # only /all gets it
        events.emit(incident(2, "P2"))
        arrivals = [await receiver.next("event") for _ in range(2)]
        await signals.until(lambda: "inc-1" in signals.finished)
        live = events.webhook_subscriptions()

    assert signals.finished["inc-1"] == "abandoned"
    assert sorted((r.path, r.document["eventId"]) for r in arrivals) == [("/all", "inc-2"), ("/p2", "inc-2")]
    assert len(receiver.of("event")) == 2  # inc-1 was never sent
    assert live == 2


@pytest.mark.parametrize(
    "answer",
    [
        # Deeper than the default recursion limit, and within the 4096 bytes read of the answer.
        pytest.param(b"[" * 3000, id="nested-too-deep"),
        pytest.param(b'{"challenge": "\\udc00"}', id="lone-surrogate"),
    ],
)
async def test_a_verification_answer_nested_too_deep_or_echoing_a_lone_surrogate_fails_the_challenge(
    ca: trustme.CA, answer: bytes
) -> None:
    caller = Caller()
    events = incidents(ca, caller)
    async with Receiver(ca) as receiver, serving(events, caller) as wire:
        receiver.respond = lambda received: (200, answer)
        error = await wire.subscribe_error("incident.created", receiver.url(), new_secret())
        subscriptions = events.webhook_subscriptions()
    assert (error.code, error.message, error.data) == (
        -32015,
        "CallbackEndpointError",
        {"reason": "challenge_failed"},
    )
    assert subscriptions == 0
