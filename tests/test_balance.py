"""Several processes on one PostgreSQL store share the subscriptions (agentwake.ownership): each drives
about its share, a process joining later is handed its share, and a process that cannot reach a
server gives its subscriptions there back to one that can.

First the plan of one round as a pure function (``plan_round`` over the lease table's rows), then
real `agentwake run` processes on one throwaway database, each starting its own copy of
tests/balance_server.py (many independent streams, their items appearing over time).
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Iterable
from pathlib import Path

import anyio
import pytest
from _postgres import postgres_server, postgres_url  # noqa: F401 - fixtures, found by pytest by name
from _support import REPO, agentwake_run

from agentwake.config import parse_config
from agentwake.ownership import plan_round
from agentwake.store.postgres import PostgresStore

NOW = "2026-12-03T08:00:00.000Z"
LATER = "2026-12-03T08:00:10.000Z"


def lease(name: str, owner: str, until: str = LATER) -> dict[str, object]:
    return {"subscription": name, "owner": owner, "fence": 1, "lease_until": until}


def alive(*owners: str) -> list[dict[str, object]]:
    return [lease(f"@{owner}", owner) for owner in owners]


def names(count: int) -> list[str]:
    return [f"s{n:02d}" for n in range(count)]


def held_by(owner: str, subscriptions: Iterable[str]) -> list[dict[str, object]]:
    return [lease(name, owner) for name in subscriptions]


RNG = random.Random(7)

# ---- one round's plan ------------------------------------------------------------------------------


def test_a_process_holding_everything_hands_the_excess_to_the_processes_that_joined_at_once() -> None:
    subs = names(30)
    plan = plan_round("a", subs, alive("a", "b", "c") + held_by("a", subs), NOW, held=subs, rng=RNG)
    assert plan.share == 10
    assert len(plan.keep) == 10 and len(plan.release) == 20 and not plan.take
    assert plan.keep | plan.release == set(subs)


def test_the_joining_process_takes_free_subscriptions_up_to_its_share_only() -> None:
    subs = names(30)
    rows = alive("a", "b", "c") + held_by("a", subs[:10])  # "a" handed 20 back
    plan = plan_round("b", subs, rows, NOW, held=(), rng=RNG)
    assert len(plan.take) == 10 and not plan.take & set(subs[:10])


def test_nothing_moves_when_nobody_is_over_its_share_or_nobody_below_it() -> None:
    subs = names(31)
    rows = (
        alive("a", "b", "c") + held_by("a", subs[:11]) + held_by("b", subs[11:22]) + held_by("c", subs[22:])
    )
    plan = plan_round("a", subs, rows, NOW, held=subs[:11], rng=RNG)
    assert (plan.share, plan.keep, plan.release, plan.take) == (
        11,
        frozenset(subs[:11]),
        frozenset(),
        frozenset(),
    )
    # 12 against a share of 11, but the others are at 11 and 8: only 1 moves, to the one below it.
    rows = (
        alive("a", "b", "c") + held_by("a", subs[:12]) + held_by("b", subs[12:23]) + held_by("c", subs[23:])
    )
    plan = plan_round("a", subs, rows, NOW, held=subs[:12], rng=RNG)
    assert len(plan.release) == 1
    # Over its share with everyone else at theirs: nobody would take what it gave, so it keeps it.
    rows = alive("a", "b") + held_by("a", subs[:16]) + held_by("b", subs[16:])
    plan = plan_round("a", subs, rows, NOW, held=subs[:16], rng=RNG)
    assert plan.share == 16 and not plan.release


def test_a_free_subscription_nobody_below_its_share_can_take_is_taken_beyond_the_share() -> None:
    subs = names(4)
    rows = alive("a", "b") + held_by("a", subs[:2]) + held_by("b", subs[2:3])
    # "b" is below its share (2): "a", at its share, leaves the free one to it...
    assert not plan_round("a", subs, rows, NOW, held=subs[:2], rng=RNG).take
    # ...unless "b" cannot reach that subscription's server.
    rows.append(lease("!b srv 2026-12-03T07:59:00.000Z", "b"))
    plan = plan_round("a", subs, rows, NOW, held=subs[:2], server_of={"s03": "srv"}.get, rng=RNG)
    assert plan.take == {"s03"}


def test_a_pinned_process_drives_exactly_its_subscriptions_whatever_the_share() -> None:
    subs = [*names(4), "alerts.p1", "alerts.p2"]
    config = parse_config(
        {"store": {"url": "postgresql://agentwake@127.0.0.1:5432/aw", "drive": ["alerts.*", "s00"]}}, env={}
    )
    assert config.store.drive == ["alerts.*", "s00"]
    rows = alive("a", "b", "c") + held_by("b", ["s01"])
    plan = plan_round("a", subs, rows, NOW, held=["s02"], pinned=config.store.drive, rng=RNG)
    assert plan.take == {"alerts.p1", "alerts.p2", "s00"}, "all it matches, beyond a share of 2"
    assert "s02" in plan.release and not plan.keep & {"s01", "s02", "s03"}


def test_dead_processes_and_lapsed_leases_do_not_count() -> None:
    subs = names(6)
    rows = [*alive("a"), lease("@b", "b", until=NOW), *held_by("b", subs)]
    rows = [*rows[:2], *(dict(row, lease_until="2026-12-03T07:00:00.000Z") for row in rows[2:])]
    plan = plan_round("a", subs, rows, NOW, held=(), rng=RNG)
    assert plan.share == 6 and plan.take == set(subs) and not plan.peers


def test_a_process_that_cannot_reach_a_server_gives_its_subscriptions_back_only_to_one_that_can() -> None:
    subs = names(20)
    server_of = dict.fromkeys(subs, "srv").get
    rows = alive("a", "b") + held_by("a", subs)
    plan = plan_round("a", subs, rows, NOW, held=subs, server_of=server_of, unwanted=set(subs), rng=RNG)
    assert plan.release == set(subs) and not plan.keep
    # "b" cannot reach it either: "a" keeps them all (nobody better), and is the only one counted.
    rows.append(lease("?b srv", "b"))
    plan = plan_round("a", subs, rows, NOW, held=subs, server_of=server_of, unwanted=set(subs), rng=RNG)
    assert plan.keep == set(subs) and not plan.release and plan.share == 20


def test_a_process_does_not_take_a_server_it_has_not_reached_while_another_can_drive_it() -> None:
    subs = names(10)
    server_of = dict.fromkeys(subs, "srv").get
    plan = plan_round("a", subs, alive("a", "b"), NOW, held=(), server_of=server_of, avoid=set(subs), rng=RNG)
    assert not plan.take
    # Alone (or with peers that cannot either), it takes them: a single process runs as before.
    plan = plan_round("a", subs, alive("a"), NOW, held=(), server_of=server_of, avoid=set(subs), rng=RNG)
    assert plan.take == set(subs)
    # The others count it out: "b" takes them all, beyond a share computed without "a".
    rows = [*alive("a", "b"), lease("?a srv", "a")]
    plan = plan_round("b", subs, rows, NOW, held=(), server_of=server_of, rng=RNG)
    assert plan.share == 10 and plan.take == set(subs)


def test_a_pinned_process_takes_exactly_its_subscriptions_and_never_hands_them_over() -> None:
    subs = names(10)
    rows = alive("a", "b", "c")
    plan = plan_round("p", subs, rows, NOW, held=["s00", "s09"], pinned=["s0[0-4]"], rng=RNG)
    assert plan.keep == {"s00"} and plan.take == {"s01", "s02", "s03", "s04"} and plan.release == {"s09"}


# ---- real processes -----------------------------------------------------------------------------------

LEASE_S = 2.0
STREAMS = 30
ITEMS = 40
PERIOD_MS = (
    250  # ITEMS appear over 10 s, from the first process's start: delivery goes on through the handovers
)
# A start of `agentwake run` takes seconds on a busy machine; these bound waits, they are not waited out.
START_S = 90.0
SETTLE_S = 60.0


def balance_toml(
    folder: Path, url: str, start: float, *, subscriptions: int = STREAMS, die_file: Path | None = None
) -> Path:
    """A process's config in its own folder: one balance server (its command a wrapper that fails
    while ``die_file`` exists, and whose server exits when it appears), ``subscriptions`` streams."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        "BALANCE_ITEMS": str(ITEMS),
        "BALANCE_START": repr(start),
        "BALANCE_PERIOD_MS": str(PERIOD_MS),
        "BALANCE_NEXT_POLL_MS": "100",
        "PYTHONPATH": str(REPO),
    }
    args = [str(REPO / "tests" / "balance_server.py")]
    if die_file is not None:
        env["BALANCE_DIE_FILE"] = str(die_file)
    text = (
        f'[store]\nurl = "{url}"\nlease_s = {LEASE_S}\n\n'
        f"[servers.balance]\ncommand = {json.dumps(sys.executable)}\nargs = {json.dumps(args)}\n"
        f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}\n"
    )
    for n in range(subscriptions):
        text += (
            f'\n[[subscriptions]]\nname = "s{n:02d}"\nserver = "balance"\nevent = "stream.item"\n'
            f'delivery = "poll"\npoll_floor_ms = 100\narguments = {{ stream = "s{n:02d}" }}\n'
        )
    config = folder / "agentwake.toml"
    config.write_text(text)
    return config


async def leases(store: PostgresStore) -> Counter[str]:
    """How many subscriptions each process holds now (live leases only)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    return Counter(row["owner"] for row in await store.subscription_owners() if row["lease_until"] > now)


async def wait_until(what: str, check: object, limit_s: float) -> float:
    """Seconds until the coroutine function ``check`` returns true; fails with ``what`` after ``limit_s``."""
    started = time.monotonic()
    try:
        with anyio.fail_after(limit_s):
            while not await check():  # type: ignore[operator]  # noqa: ASYNC110 - other processes
                await anyio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"not within {limit_s:g}s: {what}") from None
    return time.monotonic() - started


async def stored_exactly_once(store: PostgresStore) -> None:
    """Every item of every stream is in the inbox once; no duplicate delivered, no gap."""
    for row in await store.subscriptions():
        assert (row["events_received"], row["duplicates"], row["gaps"]) == (ITEMS, 0, 0), row
        assert row["cursor"] == str(ITEMS)
    for n in range(STREAMS):
        assert await store.event_ids(f"s{n:02d}") == [f"s{n:02d}-{i}" for i in range(1, ITEMS + 1)]


async def all_stored(store: PostgresStore) -> bool:
    return sum(row["events_received"] for row in await store.subscriptions()) >= STREAMS * ITEMS


async def held_by_pid(store: PostgresStore) -> dict[int, int]:
    """How many subscriptions each process holds now, by pid (an owner is host:pid:random)."""
    return {int(owner.split(":")[1]): count for owner, count in (await leases(store)).items()}


pytestmark = pytest.mark.anyio


async def test_three_processes_share_thirty_subscriptions_a_later_one_gets_its_share_and_nothing_is_lost(
    tmp_path: Path,
    postgres_url: str,  # noqa: F811
) -> None:
    start = time.time()
    config = balance_toml(tmp_path / "p", postgres_url, start)
    store = await PostgresStore.open(postgres_url)
    try:
        async with agentwake_run(config) as first:
            await first.wait_for("this process drives it now", timeout=START_S)
            await wait_until("the first process holds all 30", lambda: _holds(store, [30]), SETTLE_S)
            async with agentwake_run(config) as second:
                await wait_until("two processes hold 15 each", lambda: _holds(store, [15, 15]), START_S)
                async with agentwake_run(config) as third:
                    await third.wait_for("agentwake starting", timeout=START_S)
                    joined = await wait_until(
                        "three processes each hold 8 to 12", lambda: _spread(store, 3), START_S
                    )
                    await wait_until("every item stored", lambda: all_stored(store), SETTLE_S)
                    spread = sorted((await leases(store)).values())
                    assert len(spread) == 3 and all(8 <= n <= 12 for n in spread), spread
                    # A clean stop: the two left share its subscriptions again.
                    assert await third.stop() == 0
                    left = await wait_until(
                        "two processes hold 15 each", lambda: _holds(store, [15, 15]), SETTLE_S
                    )
                assert await second.stop() == 0
            assert await first.stop() == 0
        await stored_exactly_once(store)
        sys.stderr.write(
            f"third process balanced {joined:.1f}s after its start log; rebalanced {left:.1f}s after its stop\n"
        )
    finally:
        await store.close()


async def _holds(store: PostgresStore, counts: list[int]) -> bool:
    return sorted((await leases(store)).values()) == sorted(counts)


async def _spread(store: PostgresStore, processes: int) -> bool:
    held = await leases(store)
    return (
        len(held) == processes and sum(held.values()) == STREAMS and all(8 <= n <= 12 for n in held.values())
    )


async def test_a_process_that_cannot_reach_its_server_hands_its_subscriptions_to_a_healthy_one(
    tmp_path: Path,
    postgres_url: str,  # noqa: F811
) -> None:
    start = time.time()
    die = tmp_path / "broken" / "server-down"
    die.parent.mkdir()
    die.touch()
    broken_config = balance_toml(tmp_path / "broken", postgres_url, start, die_file=die)
    healthy_config = balance_toml(tmp_path / "healthy", postgres_url, start)
    store = await PostgresStore.open(postgres_url)
    try:
        async with agentwake_run(broken_config) as broken:
            # Alone, it holds everything, though its server never answers (nobody better).
            await broken.wait_for("this process drives it now", timeout=START_S)
            await wait_until("the broken process holds all 30", lambda: _holds(store, [30]), SETTLE_S)
            async with agentwake_run(healthy_config) as healthy:
                await healthy.wait_for("agentwake starting", timeout=START_S)
                # It never reached its server: it gives everything back at once to the one that did.
                only_healthy = {healthy.process.pid: STREAMS}
                handed = await wait_until(
                    "the healthy process holds all 30",
                    lambda: _equals(held_by_pid(store), only_healthy),
                    SETTLE_S,
                )
                await wait_until("every item stored", lambda: all_stored(store), SETTLE_S)
                # Its server back: it reaches it, and takes its share again.
                die.unlink()
                await wait_until("15 each", lambda: _holds(store, [15, 15]), SETTLE_S)
                # Its server gone again: it gives its 15 back after GIVE_BACK_LEASES lease periods.
                seen = len(broken.lines)
                die.touch()
                down_at = time.monotonic()
                await broken.wait_for("giving them back for another process", after=seen, timeout=SETTLE_S)
                gave_back = time.monotonic() - down_at
                await wait_until(
                    "the healthy process holds all 30 again",
                    lambda: _equals(held_by_pid(store), only_healthy),
                    SETTLE_S,
                )
                taken = time.monotonic() - down_at
                assert gave_back >= 3 * LEASE_S - 0.5, gave_back  # not before the bound
                assert await healthy.stop() == 0
            assert await broken.stop() == 0
        await stored_exactly_once(store)
        sys.stderr.write(
            f"handed over {handed:.1f}s after the healthy start; gave back {gave_back:.1f}s, taken {taken:.1f}s\n"
        )
    finally:
        await store.close()


async def _equals(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def test_status_names_each_subscriptions_driver_and_a_server_that_driver_cannot_reach(
    tmp_path: Path,
    postgres_url: str,  # noqa: F811
) -> None:
    from datetime import timedelta

    from rich.console import Console

    from agentwake.cli.views import print_status_view, status_snapshot
    from agentwake.clock import iso, utc_now
    from agentwake.config import load_config
    from agentwake.delivery.common import subscription_key

    config = balance_toml(tmp_path / "p", postgres_url, time.time(), subscriptions=2)
    since = "2026-12-03T08:00:00.000Z"
    store = await PostgresStore.open(postgres_url)
    try:
        for sub in load_config(config).subscriptions:
            await store.register(subscription_key(sub))
        now = utc_now()
        until, at = iso(now + timedelta(seconds=60)), iso(now)
        # As two processes' rounds leave the table: the first cannot reach the server.
        await store.hold_subscriptions(
            "host:1:abc", ["s00", "@host:1:abc", f"!host:1:abc balance {since}"], until, at
        )
        await store.hold_subscriptions("host:2:def", ["s01", "@host:2:def"], until, at)
        assert [row["subscription"] for row in await store.subscription_owners()] == ["s00", "s01"]
    finally:
        await store.close()
    service, rows = await anyio.to_thread.run_sync(status_snapshot, config)
    by_name = {row["subscription"]: row for row in rows}
    assert by_name["s00"]["driven_by"] == "host:1:abc"
    assert by_name["s00"]["driver_failing"] == f"server unreachable since {since}"
    assert (by_name["s01"]["driven_by"], by_name["s01"]["driver_failing"]) == ("host:2:def", None)
    console = Console(record=True, width=400)
    print_status_view(service, rows, console)
    shown = console.export_text()
    assert f"host:1:abc drives 1 subscription(s): s00 (balance: server unreachable since {since})" in shown
    assert "host:2:def drives 1 subscription(s): s01\n" in shown
    assert f"(driven by host:1:abc: server unreachable since {since})" in shown
