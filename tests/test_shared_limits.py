"""Limits that hold across every process sharing a store, counted inside the store's transactions.

``[servers.X] max_concurrent_runs`` and ``[agent] max_runs_per_hour`` / ``max_cost_per_day_usd``
are counted by the claim itself; a rule's ``max_concurrent`` by ``take_rule_slot``. Each test runs
on SQLite and on PostgreSQL, with two stores on one database standing for two processes; the races
start both at once, so a count taken outside the transaction (or without PostgreSQL's advisory
lock) lets both through.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest
from _stores import backend_fixture, second_store_fixture, store_fixture  # noqa: F401 - fixtures, by name

from agentwake.clock import iso
from agentwake.store import IncomingEvent, Store, SubscriptionKey
from agentwake.store.quotas import ClaimLimits, quota
from agentwake.store.records import ABANDONED_RUN

pytestmark = pytest.mark.anyio

START = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
DEMO = SubscriptionKey("tickets", "demo", "ticket.created", {})
OTHER = SubscriptionKey("feed", "other", "feed.item", {})


def at(seconds: float) -> str:
    return iso(START + timedelta(seconds=seconds))


async def add(store: Store, key: SubscriptionKey, count: int, prefix: str = "E") -> None:
    await store.register(key)
    events = [IncomingEvent(f"{prefix}-{n}", key.event, at(0), {"n": n}) for n in range(count)]
    await store.ingest(key, events, str(count))


async def claim(store: Store, limit: int, limits: ClaimLimits, now: float = 1) -> list[int]:
    return [event.id for event in await store.claim(limit, at(now), lease_until=at(now + 60), limits=limits)]


def test_a_quota_counts_the_events_being_handled_and_the_agents_usage() -> None:
    caps = ClaimLimits({"demo": 2})
    assert quota(5, caps, handled={"demo": 1}).per_server == {"demo": 1}
    assert quota(5, caps, handled={"demo": 2}).excluded == ("demo",)
    hourly = ClaimLimits(max_runs_per_hour=10)
    assert quota(5, hourly, handled={"demo": 3}, runs_last_hour=4).limit == 3
    assert quota(5, hourly, handled={}, runs_last_hour=12).limit == 0
    spend = ClaimLimits(max_cost_per_day_usd=1.0)
    assert quota(5, spend, handled={}, spend_last_day=1.0).limit == 0
    assert quota(5, spend, handled={}, spend_last_day=0.99).limit == 5
    # Trimmed in claim order: a capped server's events past its quota are skipped, others kept.
    assert quota(3, caps, handled={"demo": 1}).trim(
        [(1, "demo"), (2, "demo"), (3, "other"), (4, "other")]
    ) == [
        1,
        3,
        4,
    ]


async def test_a_servers_cap_counts_what_another_process_is_handling(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 6)
    await add(store, OTHER, 2, prefix="F")
    caps = ClaimLimits({"demo": 2})
    first = await claim(store, 10, caps)
    assert len(first) == 4  # two of demo's, both of other's
    assert await claim(second_store, 10, caps) == []  # demo is at its cap, held by the first process
    await store.finish(first[:1], "done")
    assert len(await claim(second_store, 10, caps)) == 1
    # A crashed process's claims count until their leases lapse; then its events are claimed again.
    # Here every lease has lapsed: two of demo's (its cap) and both of other's again.
    assert len(await claim(second_store, 10, caps, now=120)) == 4


async def test_two_processes_claiming_at_once_never_go_past_a_servers_cap(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 40)
    caps = ClaimLimits({"demo": 3})
    for round_ in range(5):
        now = 1 + round_ * 100  # each round after the last one's leases lapsed
        got: list[list[int]] = [[], []]

        async def take(side: int, from_store: Store, now: float = now, got: list[list[int]] = got) -> None:
            got[side] = await claim(from_store, 3, caps, now=now)

        async with anyio.create_task_group() as tg:
            tg.start_soon(take, 0, store)
            tg.start_soon(take, 1, second_store)
        assert len(got[0]) + len(got[1]) == 3, got


async def test_runs_started_this_hour_and_events_in_hand_count_against_max_runs_per_hour(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 6)
    limits = ClaimLimits(max_runs_per_hour=4, hour_ago=at(-3600), day_ago=at(-86400))
    [first] = await claim(store, 1, limits)
    await store.start_run(
        first, kind="agent", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
    )
    # One run started (its event still in hand, counted once as the run and once as in hand: the
    # conservative count), so another process may take at most two more.
    assert len(await claim(second_store, 10, limits)) == 2
    assert await claim(store, 10, limits) == []


async def test_nothing_is_claimed_by_any_process_once_the_days_spend_reaches_the_limit(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 3)
    [first] = await claim(store, 1, ClaimLimits())
    run = await store.start_run(
        first, kind="agent", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
    )
    from agentwake.store import RunProgress

    await store.finish_run(
        run,
        status="completed",
        reason=None,
        progress=RunProgress([], 1, 10, 10, 0.5),
        duration_ms=5,
        verdict=None,
    )
    limits = ClaimLimits(max_cost_per_day_usd=0.5, hour_ago=at(-3600), day_ago=at(-86400))
    assert await claim(second_store, 10, limits) == []
    assert len(await claim(second_store, 10, ClaimLimits(max_cost_per_day_usd=0.51, day_ago=at(-86400)))) == 2


async def test_a_rules_slots_are_shared_by_every_process_and_lapse_with_their_events(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 4)
    rows = await claim(store, 4, ClaimLimits())
    assert await store.take_rule_slot(rows[0], "r", 2, at(2))
    assert await second_store.take_rule_slot(rows[1], "r", 2, at(2))
    assert not await second_store.take_rule_slot(rows[2], "r", 2, at(2))
    assert await second_store.take_rule_slot(rows[2], "other", 1, at(2))  # per rule
    await store.give_rule_slot(rows[0])
    assert await second_store.take_rule_slot(rows[3], "r", 2, at(2))
    # An event that leaves 'processing' holds no slot.
    await second_store.finish([rows[1]], "done")
    assert await store.take_rule_slot(rows[0], "r", 2, at(2))
    assert not await second_store.take_rule_slot(rows[2], "r", 2, at(2))  # rows 0 and 3 hold r's two
    # Slots whose events' leases lapsed (their process died) are free.
    [again] = [e.id for e in await store.claim(1, at(120), lease_until=at(180))]
    assert await store.take_rule_slot(again, "r", 1, at(120))


async def test_two_processes_taking_a_rules_last_slot_at_once_never_both_get_it(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 10)
    rows = await claim(store, 10, ClaimLimits())
    for round_ in range(5):  # a rule of its own each round: each starts with two free slots
        taken: list[bool] = []

        async def take(
            from_store: Store, event_row: int, rule: str = f"r{round_}", taken: list[bool] = taken
        ) -> None:
            taken.append(await from_store.take_rule_slot(event_row, rule, 2, at(2)))

        async with anyio.create_task_group() as tg:
            for n, event_row in enumerate(rows):
                tg.start_soon(take, store if n % 2 else second_store, event_row)
        assert taken.count(True) == 2, round_


async def test_a_run_left_running_by_a_dead_process_is_marked_interrupted_when_its_event_is_claimed_again(
    store: Store, second_store: Store
) -> None:
    await add(store, DEMO, 1)
    [row] = await claim(store, 1, ClaimLimits())
    run = await store.start_run(
        row, kind="agent", attempt=1, model="m", decision={}, system_prompt=None, user_prompt=None
    )
    # The first process dies; once the lease lapses another claims the event again.
    assert await claim(second_store, 1, ClaimLimits(), now=120) == [row]
    detail = await second_store.event_detail(row)
    assert detail is not None
    [cut_off] = detail["runs"]
    assert (cut_off["run_id"], cut_off["status"]) == (run, "interrupted")
    assert cut_off["reason"] == ABANDONED_RUN and cut_off["finished_at"] is not None
