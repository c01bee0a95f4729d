"""Poll leases: the ``LeaseTable`` on its own, and the on_subscribe/on_unsubscribe hooks it drives.

The hook tests are real round trips: an ``MCPServer`` with the extension, the
SDK's in-process ``mcp.Client``, and events/poll sent as a custom request.
Lease time is a fake monotonic clock the tests advance by hand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from agentwake.mcp import _EventsRequest, _Params
from agentwake.server import EventContext, EventResult, EventsExtension, forbidden
from agentwake.server._leases import LeaseTable

RESULT = TypeAdapter(dict[str, Any])
TTL = timedelta(seconds=60)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeClock:
    """A monotonic clock that only moves when the test says so."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.value = start

    def __call__(self) -> float:
        return self.value

    def advance(self, seconds: float) -> None:
        self.value += seconds


# ---- LeaseTable -------------------------------------------------------------------


def test_the_first_touch_of_a_key_creates_a_lease_and_later_touches_renew_it() -> None:
    clock = FakeClock()
    table = LeaseTable(TTL, clock=clock)

    lease, is_new = table.touch(None, "ticket.created", {"queue": "ops"})
    clock.advance(10)
    again, again_new = table.touch(None, "ticket.created", {"queue": "ops"})

    assert is_new is True
    assert again_new is False
    assert again is lease
    assert lease.expires_at == clock() + 60
    assert len(table) == 1


def test_argument_order_does_not_change_the_lease_key() -> None:
    table = LeaseTable(TTL, clock=FakeClock())

    _, first = table.touch(None, "e", {"a": 1, "b": {"x": 1, "y": 2}})
    _, second = table.touch(None, "e", {"b": {"y": 2, "x": 1}, "a": 1})

    assert (first, second) == (True, False)
    assert LeaseTable.key(None, "e", {"a": 1, "b": 2}) == LeaseTable.key(None, "e", {"b": 2, "a": 1})


@pytest.mark.parametrize(
    ("principal", "name", "arguments"),
    [
        (None, "e", {"a": 2}),
        (None, "e", {"a": 1, "b": 2}),
        (None, "e", {}),
        (None, "other", {"a": 1}),
        ("alice", "e", {"a": 1}),
    ],
)
def test_a_different_principal_name_or_arguments_is_a_different_lease(
    principal: str | None, name: str, arguments: dict[str, Any]
) -> None:
    table = LeaseTable(TTL, clock=FakeClock())
    table.touch(None, "e", {"a": 1})

    _, is_new = table.touch(principal, name, arguments)

    assert is_new is True
    assert len(table) == 2


def test_a_lease_keeps_its_own_copy_of_the_arguments() -> None:
    table = LeaseTable(TTL, clock=FakeClock())
    arguments = {"queue": "ops"}

    lease, _ = table.touch(None, "e", arguments)
    arguments["queue"] = "billing"

    assert lease.arguments == {"queue": "ops"}


def test_a_lease_is_not_expired_before_its_ttl_has_elapsed() -> None:
    clock = FakeClock()
    table = LeaseTable(TTL, clock=clock)
    table.touch(None, "e", {})

    clock.advance(59.999)

    assert table.expired() == []
    assert len(table) == 1


def test_a_lease_expires_once_its_ttl_has_elapsed_without_renewal_and_is_removed() -> None:
    clock = FakeClock()
    table = LeaseTable(TTL, clock=clock)
    table.touch(None, "e", {"a": 1})

    clock.advance(60)
    ended = table.expired()

    assert [(lease.name, lease.arguments) for lease in ended] == [("e", {"a": 1})]
    assert len(table) == 0
    assert table.expired() == []


def test_a_renewal_pushes_the_expiry_out_by_a_full_ttl() -> None:
    clock = FakeClock()
    table = LeaseTable(TTL, clock=clock)
    table.touch(None, "e", {})
    clock.advance(50)
    table.touch(None, "e", {})

    clock.advance(50)
    assert table.expired() == []
    clock.advance(10)
    assert len(table.expired()) == 1


def test_only_the_leases_past_their_expiry_are_returned() -> None:
    clock = FakeClock()
    table = LeaseTable(TTL, clock=clock)
    table.touch(None, "old", {})
    clock.advance(30)
    table.touch(None, "young", {})

    clock.advance(30)
    ended = table.expired()

    assert [lease.name for lease in ended] == ["old"]
    assert table.get(LeaseTable.key(None, "young", {})) is not None


def test_a_key_touched_after_its_lease_expired_is_new_again() -> None:
    clock = FakeClock()
    table = LeaseTable(TTL, clock=clock)
    table.touch(None, "e", {})
    clock.advance(61)
    table.expired()

    _, is_new = table.touch(None, "e", {})

    assert is_new is True


def test_dropping_a_lease_forgets_it_and_dropping_an_unknown_key_is_harmless() -> None:
    table = LeaseTable(TTL, clock=FakeClock())
    table.touch(None, "e", {"a": 1})

    table.drop(None, "e", {"a": 1})
    table.drop(None, "e", {"never": "seen"})

    assert len(table) == 0
    assert table.touch(None, "e", {"a": 1})[1] is True


def test_the_subscription_id_is_stable_for_a_key_and_differs_between_keys() -> None:
    table = LeaseTable(TTL, clock=FakeClock())

    first, _ = table.touch(None, "e", {"a": 1, "b": 2})
    table.drop(None, "e", {"a": 1, "b": 2})
    recreated, _ = table.touch(None, "e", {"b": 2, "a": 1})
    other, _ = table.touch(None, "e", {"a": 2})

    assert first.subscription_id == recreated.subscription_id
    assert first.subscription_id != other.subscription_id
    assert first.subscription_id


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-5)])
def test_a_lease_table_refuses_a_non_positive_ttl(ttl: timedelta) -> None:
    with pytest.raises(ValueError, match="TTL"):
        LeaseTable(ttl)


# ---- lifecycle hooks over the wire ------------------------------------------------------


@dataclass
class Calls:
    subscribed: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    unsubscribed: list[tuple[dict[str, Any], str]] = field(default_factory=list)


def make_extension(clock: FakeClock, calls: Calls) -> EventsExtension:
    events = EventsExtension(poll_lease_ttl=TTL, clock=clock)

    @events.event(
        name="ticket.created",
        description="A ticket was opened.",
        input_schema={"type": "object", "properties": {"queue": {"type": "string"}, "p": {"type": "string"}}},
    )
    async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        return EventResult(events=[], cursor="0")

    @events.on_subscribe("ticket.created")
    async def subscribed(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
        calls.subscribed.append((arguments, subscription_id))

    @events.on_unsubscribe("ticket.created")
    def unsubscribed(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
        calls.unsubscribed.append((arguments, subscription_id))

    return events


@dataclass
class Wire:
    client: Client

    async def poll(self, name: str, arguments: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"name": name, "cursor": None, **extra}
        if arguments is not None:
            params["arguments"] = arguments
        request = _EventsRequest(method="events/poll", params=_Params.model_validate(params))
        return await self.client.session.send_request(request, RESULT)  # type: ignore[type-var]


@asynccontextmanager
async def connect(events: EventsExtension, mode: str = "auto") -> AsyncIterator[Wire]:
    server = MCPServer("t", extensions=[events])
    events.install(server)
    async with Client(server, mode=mode) as client:
        yield Wire(client)


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
async def test_on_subscribe_fires_once_on_the_first_poll_and_not_on_renewals(mode: str) -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)

    async with connect(events, mode) as wire:
        await wire.poll("ticket.created", {"queue": "ops"})
        clock.advance(30)
        await wire.poll("ticket.created", {"queue": "ops"})
        clock.advance(30)
        await wire.poll("ticket.created", {"queue": "ops"})

    assert [arguments for arguments, _ in calls.subscribed] == [{"queue": "ops"}]
    assert calls.subscribed[0][1]
    assert calls.unsubscribed == []


@pytest.mark.anyio
async def test_the_same_arguments_in_a_different_order_renew_the_same_lease(mode: str) -> None:
    calls = Calls()
    events = make_extension(FakeClock(), calls)

    async with connect(events, mode) as wire:
        await wire.poll("ticket.created", {"queue": "ops", "p": "P1"})
        await wire.poll("ticket.created", {"p": "P1", "queue": "ops"})

    assert len(calls.subscribed) == 1


@pytest.mark.anyio
async def test_different_arguments_are_different_leases_each_with_its_own_on_subscribe(mode: str) -> None:
    calls = Calls()
    events = make_extension(FakeClock(), calls)

    async with connect(events, mode) as wire:
        await wire.poll("ticket.created", {"queue": "ops"})
        await wire.poll("ticket.created", {"queue": "billing"})
        await wire.poll("ticket.created")

    assert [arguments for arguments, _ in calls.subscribed] == [{"queue": "ops"}, {"queue": "billing"}, {}]
    assert len({subscription_id for _, subscription_id in calls.subscribed}) == 3


@pytest.mark.anyio
async def test_on_unsubscribe_fires_from_a_sweep_only_after_the_ttl_passed_without_renewal(mode: str) -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)

    async with connect(events, mode) as wire:
        await wire.poll("ticket.created", {"queue": "ops"})
        clock.advance(59)
        assert await events.sweep_leases() == 0
        await wire.poll("ticket.created", {"queue": "ops"})  # renewal
        clock.advance(59)
        assert await events.sweep_leases() == 0
        assert calls.unsubscribed == []

        clock.advance(1)
        assert await events.sweep_leases() == 1

    assert calls.unsubscribed == [({"queue": "ops"}, calls.subscribed[0][1])]


@pytest.mark.anyio
async def test_a_sweep_ends_only_the_leases_that_lapsed() -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)

    async with connect(events) as wire:
        await wire.poll("ticket.created", {"queue": "ops"})
        clock.advance(40)
        await wire.poll("ticket.created", {"queue": "billing"})
        clock.advance(20)
        ended = await events.sweep_leases()

    assert ended == 1
    assert [arguments for arguments, _ in calls.unsubscribed] == [{"queue": "ops"}]


@pytest.mark.anyio
async def test_a_poll_after_the_lease_was_swept_fires_on_subscribe_again() -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)

    async with connect(events) as wire:
        await wire.poll("ticket.created", {"queue": "ops"})
        clock.advance(61)
        await events.sweep_leases()
        await wire.poll("ticket.created", {"queue": "ops"})

    assert len(calls.subscribed) == 2
    assert len(calls.unsubscribed) == 1


@pytest.mark.anyio
async def test_an_on_subscribe_hook_that_raises_fails_the_poll_and_no_lease_is_kept(mode: str) -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)
    refusals = [forbidden("channel is private")]

    @events.on_subscribe("ticket.created")
    async def refuse_once(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
        if refusals:
            raise refusals.pop()

    async with connect(events, mode) as wire:
        with pytest.raises(MCPError) as caught:
            await wire.poll("ticket.created", {"queue": "ops"})
        assert caught.value.code == -32012
        assert caught.value.data == {"reason": "channel is private"}

        result = await wire.poll("ticket.created", {"queue": "ops"})

    assert result["cursor"] == "0"
    assert len(calls.subscribed) == 2  # the refused first poll left no lease behind
    clock.advance(61)
    assert await events.sweep_leases() == 1


@pytest.mark.anyio
async def test_a_poll_rejected_before_the_check_runs_never_fires_on_subscribe() -> None:
    calls = Calls()
    events = make_extension(FakeClock(), calls)

    async with connect(events) as wire:
        with pytest.raises(MCPError) as unknown:
            await wire.poll("no.such.event", {"queue": "ops"})
        with pytest.raises(MCPError) as invalid:
            await wire.poll("ticket.created", {"queue": 7})

    assert (unknown.value.code, invalid.value.code) == (-32011, -32602)
    assert calls.subscribed == []
    assert await events.sweep_leases() == 0


@pytest.mark.anyio
async def test_on_subscribe_hooks_see_the_poll_context_of_the_subscription() -> None:
    events = EventsExtension(clock=FakeClock())
    seen: list[EventContext] = []

    @events.event(name="e")
    async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        return EventResult(events=[], cursor="0")

    @events.on_subscribe("e")
    def remember(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
        seen.append(ctx)

    async with connect(events) as wire:
        await wire.poll("e")

    assert [(ctx.event_name, ctx.mode, ctx.principal) for ctx in seen] == [("e", "poll", None)]
    assert seen[0].request is not None


@pytest.mark.anyio
async def test_hooks_for_one_event_type_do_not_fire_for_another() -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)

    @events.event(name="other")
    async def check(ctx: EventContext, arguments: dict[str, Any], cursor: str | None) -> EventResult:
        return EventResult(events=[], cursor="0")

    async with connect(events) as wire:
        await wire.poll("other")
        clock.advance(61)
        assert await events.sweep_leases() == 1

    assert calls.subscribed == []
    assert calls.unsubscribed == []


@pytest.mark.anyio
async def test_a_failing_on_unsubscribe_hook_does_not_stop_the_other_leases_from_ending() -> None:
    clock, calls = FakeClock(), Calls()
    events = make_extension(clock, calls)

    @events.on_unsubscribe("ticket.created")
    def explode(ctx: EventContext, arguments: dict[str, Any], subscription_id: str) -> None:
        if arguments.get("queue") == "ops":
            raise RuntimeError("upstream teardown failed")

    async with connect(events) as wire:
        await wire.poll("ticket.created", {"queue": "ops"})
        await wire.poll("ticket.created", {"queue": "billing"})
        clock.advance(61)
        ended = await events.sweep_leases()

    assert ended == 2
    assert sorted(arguments["queue"] for arguments, _ in calls.unsubscribed) == ["billing", "ops"]
