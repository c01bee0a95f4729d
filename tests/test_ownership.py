"""Several processes on one PostgreSQL store: each subscription's delivery loop is driven by one of
them at a time (agentwake.ownership), a dead one's taken over within the lease, and a former
owner's late cursor write refused by its fence.

Two ``PostgresStore`` instances on one database are two processes as far as the store knows; the
end-to-end test runs two real ``agentwake run`` processes.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from _postgres import postgres_server, postgres_url  # noqa: F401 - fixtures, found by pytest by name
from _support import agentwake_run, demo_server_toml
from test_push_demo import add_tickets

from agentwake.config import load_config
from agentwake.delivery.common import subscription_key
from agentwake.errors import FencedOut, StoreError
from agentwake.ownership import LeaseManager, Unshared, ownership_for
from agentwake.store import IncomingEvent, Store, SubscriptionKey, open_config_reader
from agentwake.store.postgres import PostgresStore
from agentwake.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

LEASE_S = 0.6
NAMES = [f"sub-{n}" for n in range(6)]
KEY = SubscriptionKey("sub-0", "demo", "ticket.created", {})


@pytest.fixture
async def stores(postgres_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:  # noqa: F811
    """Two stores on one database: two processes."""
    first = await PostgresStore.open(postgres_url)
    second = await PostgresStore.open(postgres_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


class Outage:
    """A store whose lease calls fail (``broken``) or hang (``hanging``) on demand: a process cut
    off from the database. Records when each successful round was sent."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.broken = False
        self.hanging = False
        self.renewed_at: list[float] = []

    async def hold_subscriptions(
        self, owner: str, names: Sequence[str], until: str, now: str
    ) -> dict[str, int]:
        sent = time.monotonic()
        if self.hanging:
            await anyio.sleep_forever()
        if self.broken:
            raise StoreError("the server of the PostgreSQL database cannot be reached")
        held = await self.store.hold_subscriptions(owner, names, until, now)
        self.renewed_at.append(sent)
        return held

    async def release_subscriptions(self, owner: str, names: Sequence[str] | None = None) -> None:
        if self.broken or self.hanging:
            raise StoreError("the server of the PostgreSQL database cannot be reached")
        await self.store.release_subscriptions(owner, names)

    async def subscription_owners(self, *, processes: bool = False) -> list[dict[str, Any]]:
        if self.hanging:
            await anyio.sleep_forever()
        if self.broken:
            raise StoreError("the server of the PostgreSQL database cannot be reached")
        return await self.store.subscription_owners(processes=processes)


def manager(store: Any, names: Sequence[str] = NAMES, owner: str | None = None) -> LeaseManager:
    made = LeaseManager(store, lambda: names, LEASE_S)
    if owner is not None:
        made.owner = owner
    return made


async def until(condition: Any, limit_s: float = 10) -> None:
    with anyio.fail_after(limit_s):
        while not condition():  # noqa: ASYNC110 - the other manager runs in this loop, on its own clock
            await anyio.sleep(0.01)


class Drivers:
    """Which managers are inside ``driving`` for each name, as the supervisor's loops would be."""

    def __init__(self) -> None:
        self.inside: dict[str, set[str]] = {name: set() for name in NAMES}
        self.most = 0
        self.fences: dict[tuple[str, str], list[int | None]] = {}

    async def drive(self, who: str, ownership: LeaseManager, name: str) -> None:
        while True:
            async with ownership.driving(name) as fence:
                self.inside[name].add(who)
                self.most = max(self.most, len(self.inside[name]))
                self.fences.setdefault((who, name), []).append(fence)
                try:
                    await anyio.sleep_forever()
                finally:
                    self.inside[name].discard(who)

    def start(self, tg: anyio.abc.TaskGroup, who: str, ownership: LeaseManager) -> None:
        for name in NAMES:
            tg.start_soon(self.drive, who, ownership, name)

    def driven_by(self, who: str) -> set[str]:
        return {name for name, inside in self.inside.items() if who in inside}


async def test_two_managers_on_one_database_each_drive_every_subscription_exactly_once(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = manager(stores[0]), manager(stores[1])
    drivers = Drivers()
    async with anyio.create_task_group() as tg:
        for who, ownership in (("a", a), ("b", b)):
            await tg.start(ownership.run)
            drivers.start(tg, who, ownership)
        await until(lambda: drivers.driven_by("a") | drivers.driven_by("b") == set(NAMES))
        # Several renewals later, still one each: renewals keep what each holds.
        rounds = a.rounds + b.rounds
        await until(lambda: a.rounds + b.rounds >= rounds + 6)
        assert not drivers.driven_by("a") & drivers.driven_by("b")
        assert drivers.driven_by("a") | drivers.driven_by("b") == set(NAMES)
        assert drivers.most == 1
        owners = {row["subscription"]: row["owner"] for row in await stores[0].subscription_owners()}
        assert owners == {name: a.owner if name in a.held() else b.owner for name in NAMES}
        tg.cancel_scope.cancel()


async def test_a_killed_managers_subscriptions_are_taken_over_within_the_lease_and_one_round(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = manager(stores[0]), manager(stores[1])
    drivers = Drivers()
    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as process_a:
            # "a" starts first and takes everything; "b" joins and is handed its share.
            async with anyio.create_task_group() as a_tasks:
                await a_tasks.start(a.run)
                drivers.start(a_tasks, "a", a)
                await until(lambda: drivers.driven_by("a") == set(NAMES))
                await tg.start(b.run)
                drivers.start(tg, "b", b)
                await until(lambda: len(drivers.driven_by("b")) == 3 and len(drivers.driven_by("a")) == 3)
                # Killed: no release, its leases lapse on their own.
                killed_at = time.monotonic()
                process_a.cancel()
        await until(lambda: drivers.driven_by("b") == set(NAMES))
        taken_after = time.monotonic() - killed_at
        assert taken_after <= LEASE_S + b.interval_s + 0.3
        assert drivers.most == 1
        # The takeover raised every fence.
        assert {drivers.fences[("b", name)][-1] for name in NAMES} == {2}
        tg.cancel_scope.cancel()


async def test_a_clean_release_hands_the_subscriptions_over_at_the_next_round(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a, b = manager(stores[0]), manager(stores[1])
    drivers = Drivers()
    async with anyio.create_task_group() as tg:
        async with anyio.create_task_group() as a_tasks:
            await a_tasks.start(a.run)
            drivers.start(a_tasks, "a", a)
            await until(lambda: drivers.driven_by("a") == set(NAMES))
            await tg.start(b.run)
            drivers.start(tg, "b", b)
            a_tasks.cancel_scope.cancel()
        # A clean stop: its loops have ended, then it gives its leases up.
        await a.release()
        released_at = time.monotonic()
        await until(lambda: drivers.driven_by("b") == set(NAMES))
        assert time.monotonic() - released_at <= b.interval_s + 0.3
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("failure", ["broken", "hanging"])
async def test_a_manager_cut_off_from_the_database_stops_driving_before_its_lease_lapses(
    stores: tuple[PostgresStore, PostgresStore], failure: str
) -> None:
    outage = Outage(stores[0])
    a = manager(outage, ["sub-0"])
    b = manager(stores[1], ["sub-0"])
    stopped: list[float] = []

    async def drive_a() -> None:
        async with a.driving("sub-0") as fence:
            assert fence == 1
            try:
                await anyio.sleep_forever()
            finally:
                stopped.append(time.monotonic())

    await stores[0].register(KEY)
    async with anyio.create_task_group() as tg:
        await tg.start(a.run)
        tg.start_soon(drive_a)
        await until(lambda: a.held() == {"sub-0": 1})
        setattr(outage, failure, True)
        await until(lambda: bool(stopped))
        last_renewal = outage.renewed_at[-1]
        # Stopped at two thirds of the lease after the last renewal sent: before it could lapse.
        assert LEASE_S * 2 / 3 - 0.05 <= stopped[0] - last_renewal < LEASE_S
        assert a.held() == {}
        # Another process takes it over once the lease lapsed; the cut-off one's late write is refused.
        await tg.start(b.run)
        await until(lambda: b.held() == {"sub-0": 2})
        assert time.monotonic() - last_renewal >= LEASE_S - 0.05
        with pytest.raises(FencedOut):
            await stores[0].ingest(
                KEY, [IncomingEvent("E-1", KEY.event, "2026-12-03T08:00:00.000Z", {})], "1", fence=1
            )
        assert await stores[0].event_ids() == []
        tg.cancel_scope.cancel()


async def test_a_fenced_out_loop_waits_for_the_next_round_instead_of_driving_again_at_once(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    a = manager(stores[0], ["sub-0"])
    await a.round()
    assert a.held() == {"sub-0": 1}
    # Another process took it over meanwhile (a paused "a" whose lease lapsed).
    await stores[1].hold_subscriptions("b", ["sub-0"], "2999-01-01T00:00:00.000Z", "2998-01-01T00:00:00.000Z")
    a.fenced_out("sub-0", 1)
    assert a.held() == {}
    entered = anyio.Event()

    async def drive() -> None:
        async with a.driving("sub-0"):
            entered.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drive)
        await a.round()  # "b" holds it: still not driven here
        await anyio.wait_all_tasks_blocked()
        assert not entered.is_set()
        tg.cancel_scope.cancel()


async def test_a_sqlite_store_gets_no_leases_and_drives_everything_unfenced_at_once(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "aw.db")
    try:
        ownership = ownership_for(store, lambda: NAMES, 10.0)
        assert isinstance(ownership, Unshared) and not ownership.shared
        async with ownership.driving("sub-0") as fence:
            assert fence is None
        await ownership.release()
        assert await store.subscription_owners() == []
    finally:
        await store.close()


async def test_the_status_reader_shows_each_subscriptions_owner_and_fence(
    stores: tuple[PostgresStore, PostgresStore],
    postgres_url: str,  # noqa: F811
) -> None:
    await stores[0].hold_subscriptions(
        "host:1:abc", ["tickets"], "2026-12-03T08:00:10.000Z", "2026-12-03T08:00:00.000Z"
    )
    from agentwake.config import StoreConfig

    reader = open_config_reader(StoreConfig(url=postgres_url))
    try:
        assert reader.subscription_owners() == [
            {
                "subscription": "tickets",
                "owner": "host:1:abc",
                "fence": 1,
                "lease_until": "2026-12-03T08:00:10.000Z",
            }
        ]
    finally:
        reader.close()


# ---- two real `agentwake run` processes ----------------------------------------------------------------


def service_toml(tmp_path: Path, url: str, lease_s: float) -> Path:
    config = tmp_path / "agentwake.toml"
    config.write_text(
        f'[store]\nurl = "{url}"\nlease_s = {lease_s}\n\n'
        + demo_server_toml(tmp_path / "demo.db", DEMO_NEXT_POLL_MS="100")
        + '\n[[subscriptions]]\nname = "tickets"\nserver = "demo"\nevent = "ticket.created"\ndelivery = "poll"\n'
        + "poll_floor_ms = 100\n"
    )
    return config


async def stored_ids(store: Store) -> list[str]:
    return await store.event_ids("tickets")


async def test_two_agentwake_run_processes_store_every_event_once_and_a_killed_owner_is_taken_over(
    tmp_path: Path,
    postgres_url: str,  # noqa: F811
) -> None:
    lease_s = 2.0
    config = service_toml(tmp_path, postgres_url, lease_s)
    add_tickets(tmp_path / "demo.db", 20)
    store = await PostgresStore.open(postgres_url)
    try:
        # Start from the demo's first ticket, as an earlier run would have left it.
        key = subscription_key(load_config(config).subscriptions[0])
        await store.register(key)
        await store.ingest(key, [], "0")
        async with agentwake_run(config) as first:
            await first.wait_for("subscription tickets: this process drives it now (fence 1)")
            async with agentwake_run(config) as second:
                await second.wait_for("agentwake starting")
                with anyio.fail_after(30):
                    while len(await stored_ids(store)) < 20:  # noqa: ASYNC110 - written by another process
                        await anyio.sleep(0.05)
                add_tickets(tmp_path / "demo.db", 10)
                with anyio.fail_after(30):
                    while len(await stored_ids(store)) < 30:  # noqa: ASYNC110 - written by another process
                        await anyio.sleep(0.05)
                assert not any("drives it now" in line for line in second.lines)
                first.process.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
                await first.process.wait()
                await second.wait_for(
                    "subscription tickets: this process drives it now (fence 2)", timeout=lease_s * 3
                )
                assert time.monotonic() - killed_at <= lease_s + lease_s / 3 + 1.0
                add_tickets(tmp_path / "demo.db", 10)
                with anyio.fail_after(30):
                    while len(await stored_ids(store)) < 40:  # noqa: ASYNC110 - written by another process
                        await anyio.sleep(0.05)
                assert await second.stop() == 0
        assert await stored_ids(store) == [f"T-{n:06d}" for n in range(1, 41)]
        [tickets] = await store.subscriptions()
        assert (tickets["events_received"], tickets["duplicates"], tickets["gaps"]) == (40, 0, 0)
        assert tickets["cursor"] == "40"
        # The clean stop gave the lease up.
        [owner] = await store.subscription_owners()
        assert owner["fence"] == 2 and owner["lease_until"] < "2000"
    finally:
        await store.close()


# ---- the supervisor's side ----------------------------------------------------------------------------


class FencedLoop:
    """A delivery loop reduced to its cursor write: each run stores the cursor under its fence."""

    def __init__(self, store: Store) -> None:
        self.subscription = load_sub()
        self.store = store
        self.fence: int | None = None
        self.runs: list[int | None] = []
        self.ran = anyio.Event()
        self.stored = anyio.Event()

    async def run(self) -> None:
        self.runs.append(self.fence)
        ran, self.ran = self.ran, anyio.Event()
        ran.set()
        await self.store.ingest(KEY, [], f"c{len(self.runs)}", fence=self.fence)
        self.stored.set()
        await anyio.sleep_forever()


def load_sub() -> Any:
    from agentwake.config import SubscriptionConfig

    return SubscriptionConfig.model_validate({"name": "sub-0", "server": "demo", "event": KEY.event})


async def test_a_loop_fenced_out_by_the_store_waits_until_this_process_holds_its_subscription_again(
    stores: tuple[PostgresStore, PostgresStore],
    postgres_url: str,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    from agentwake.config import parse_config
    from agentwake.supervisor import Supervisor

    caplog.set_level(logging.INFO, logger="agentwake")

    config = parse_config(
        {
            "store": {"url": postgres_url, "lease_s": LEASE_S},
            "servers": {"demo": {"command": "demo"}},
            "subscriptions": [{"name": "sub-0", "server": "demo", "event": KEY.event}],
        }
    )
    a = manager(stores[0], ["sub-0"])
    supervisor = Supervisor(config, stores[0], ownership=a)
    loop = FencedLoop(stores[0])
    await stores[0].register(KEY)
    await a.round()
    # Behind "a"'s back (as after a pause past its lease), "b" holds the subscription.
    await stores[1].release_subscriptions(a.owner)
    await stores[1].hold_subscriptions("b", ["sub-0"], "2999-01-01T00:00:00.000Z", "2998-01-01T00:00:00.000Z")
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor._run_loop, loop, "poll")
        with anyio.fail_after(5):
            await loop.ran.wait()
        await until(lambda: a.held() == {})
        assert "subscription sub-0 is now driven by another process (fence 2 > 1)" in caplog.text
        await a.round()  # "b" still holds it: the loop is not started again
        await anyio.wait_all_tasks_blocked()
        assert loop.runs == [1]
        assert await stores[0].cursor("sub-0") is None
        # "b" stops cleanly: "a" takes it at its next round and drives it from there.
        await stores[1].release_subscriptions("b")
        await a.round()
        with anyio.fail_after(5):
            await loop.stored.wait()  # the second run's write, under the new fence
        assert loop.runs == [1, 3]
        assert a.held() == {"sub-0": 3}
        assert await stores[0].cursor("sub-0") == "c2"
        tg.cancel_scope.cancel()


async def test_every_process_routes_the_webhook_subscriptions_another_process_made_rotated_or_retired(
    stores: tuple[PostgresStore, PostgresStore],
) -> None:
    from agentwake import signing
    from agentwake.delivery.routes import WebhookRoutes
    from agentwake.delivery.webhook import load_routes

    other, here = stores
    routes = WebhookRoutes()
    hook = SubscriptionKey("hooks", "demo", "ticket.created", {})
    url = "https://agentwake.example/hooks/hooks"
    await other.register(hook)
    record = await other.prepare_webhook(hook, url, signing.generate_secret())
    await load_routes(here, routes, changed_only=True)
    assert routes.lookup("wh-1") is None  # not subscribed yet: no id to route
    # But its subscribe is under way there: the server's verification challenge may come here.
    body = b'{"type":"verification","challenge":"c"}'
    header = signing.sign([signing.decode_secret(record.secret)], "msg-1", 1_700_000_000, body)
    assert routes.subscribing
    matched = routes.match_in_flight("msg-1", "1700000000", header, body)
    assert matched is not None and matched[0] == hook
    subscribed = dict(refresh_before=None, delivery_status=None, previous_until="2999-01-01T00:00:00.000Z")
    await other.webhook_subscribed("hooks", webhook_id="wh-1", sent_secret=record.secret, **subscribed)
    await load_routes(here, routes, changed_only=True)
    route = routes.lookup("wh-1")
    assert route is not None and route.key == hook and len(route.secrets) == 1
    assert not routes.subscribing  # bound: nothing is under way any more
    binds = routes.binds
    await load_routes(here, routes, changed_only=True)
    assert routes.binds == binds  # nothing changed: nothing bound again
    # Rotated by the other process: the pending secret is accepted here too, then the new one.
    await other.request_rotation(["hooks"], signing.generate_secret)
    await load_routes(here, routes, changed_only=True)
    route = routes.lookup("wh-1")
    assert route is not None and len(route.secrets) == 2
    # Retired there: refused here (410), no longer routed.
    await other.retire_webhook("hooks", "removed from the config", unsubscribed=False)
    await load_routes(here, routes, changed_only=True)
    assert routes.lookup("wh-1") is None and routes.is_retired("wh-1")
