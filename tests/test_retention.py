"""Retention (``[store.retention]``, ``agentwake.store.retention``) on both backends: what each state
and table keeps, dedup after an event's row is gone, a dry run changing nothing, and a prune in small
batches that never keeps ingest or claims waiting for it to end.

Age is made by pruning "later": each prune is given a ``now`` days after the rows were written.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from typing import Any, TypeVar

import anyio
import pytest
from _stores import Backend, backend_fixture, store_fixture  # noqa: F401 - fixtures, by their names

from agentwake.clock import utc_now
from agentwake.store import (
    EventVerdict,
    IncomingEvent,
    RejectedEvent,
    RunProgress,
    Settlement,
    Store,
    SubscriptionKey,
    ToolCallRecord,
    WebhookDelivery,
)
from agentwake.store.retention import PruneReport, PruneTarget, Retention, Script, open_target, prune

pytestmark = pytest.mark.anyio

T = TypeVar("T")
KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})
DEADLINE_S = 60.0


def days(n: float) -> Any:
    return utc_now() + timedelta(days=n)


def incoming(event_id: str) -> IncomingEvent:
    return IncomingEvent(event_id, KEY.event, "2026-12-03T08:00:00.000Z", {"n": event_id, "pad": "x" * 200})


async def ingest(store: Store, *ids: str) -> list[int]:
    await store.register(KEY)
    await store.ingest(KEY, [incoming(i) for i in ids], ids[-1])
    rows = []
    for event_id in ids:
        [found] = await store.find_events(event_id, KEY.server)
        rows.append(int(found["id"]))
    return rows


async def claim_all(store: Store, count: int) -> list[int]:
    claimed = await store.claim(count, lease_until=(utc_now() + timedelta(minutes=5)).isoformat())
    assert len(claimed) == count
    return [e.id for e in claimed]


async def done_with_run(store: Store, event_id: str, *, state: str = "done") -> tuple[int, int]:
    """An event handled by an agent run with one tool call; its row and the run's id."""
    [row] = await ingest(store, event_id)
    [claimed] = await store.claim(1)
    assert claimed.id == row
    run = await store.start_run(
        row,
        kind="agent",
        attempt=claimed.attempts,
        model="m",
        decision={},
        system_prompt="sys",
        user_prompt="usr",
    )
    call = ToolCallRecord(1, "c1", "demo__close", "demo", "close", {"id": 1}, "ok", "closed", 3)
    journal = await store.journal_tool_call(run, call, f"key-{event_id}")
    await store.settle_tool_call(journal, status="ok", result="closed", reply="closed", duration_ms=3)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "done"}]
    await store.finish_run(
        run,
        status="completed" if state == "done" else "failed",
        reason=None,
        progress=RunProgress(messages, 1, 10, 5, 0.01),
        duration_ms=7,
        verdict=EventVerdict(state),  # type: ignore[arg-type]
    )
    return row, run


async def state_of(store: Store, row: int) -> str | None:
    found = await store.event_detail(row)
    return None if found is None else str(found["state"])


async def pruned(backend: Backend, store: Store, later_days: float, **retention: Any) -> PruneReport:
    target = await open_target(backend.store_config(), store)
    try:
        return await prune(target, Retention(pause_s=0, **retention), now=days(later_days))
    finally:
        await target.close()


async def test_each_state_is_kept_as_long_as_its_retention_says(backend: Backend, store: Store) -> None:
    done_row, run = await done_with_run(store, "ran")
    failed_row, _ = await done_with_run(store, "failed-run", state="failed")
    rows = await ingest(store, "ignored", "held", "dead", "denied", "approved", "pending")
    ignored, held, dead, denied, approved, pending = rows
    claimed = await claim_all(store, 5)
    assert sorted(claimed) == sorted([ignored, held, dead, denied, approved])
    await store.settle(
        [
            Settlement(ignored, {"action": "ignore"}, "ignored"),
            Settlement(held, {"action": "approve"}, "held"),
            Settlement(denied, {"action": "approve"}, "held"),
            Settlement(approved, {"action": "approve"}, "held"),
        ]
    )
    await store.finish([dead], "dead", "gave up")
    await store.answer(denied, approve=False, note="no")
    await store.answer(approved, approve=True, note="yes")  # pending again, then done by hand
    [again] = await store.claim(1)
    await store.finish([again.id], "done")
    await store.ingest(
        KEY, [], None, rejected=[RejectedEvent("bad", KEY.event, "2026-12-03T08:00:00.000Z", "too big", "x")]
    )

    # 31 days on: what ended without a run goes; the ran event's transcript is cleared, its run kept.
    report = await pruned(backend, store, 31)
    assert report.counts["events"] == 2  # ignored and rejected
    assert report.counts["transcripts"] == 1
    assert report.keys_kept == 2
    assert await state_of(store, ignored) is None
    assert await store.find_events("bad", KEY.server) == []
    shown = await store.event_detail(done_row)
    assert shown is not None
    [kept_run] = shown["runs"]
    assert (kept_run["run_id"], kept_run["messages"], kept_run["system_prompt"]) == (run, [], None)
    assert kept_run["tool_calls"][0]["tool"] == "demo__close"
    assert kept_run["tool_calls"][0]["result"] is None
    failed_detail = await store.event_detail(failed_row)
    assert failed_detail is not None and failed_detail["runs"][0]["messages"] != []  # a retry resumes from it
    for row, state in (
        (held, "held"),
        (dead, "dead"),
        (pending, "pending"),
        (denied, "denied"),
        (failed_row, "failed"),
    ):
        assert await state_of(store, row) == state

    # 91 days on: runs are past runs_days, failed past failed_days; answered events stay for the audit.
    report = await pruned(backend, store, 91)
    assert report.counts["events"] == 2
    assert report.counts["runs"] == 2 and report.counts["tool_calls"] == 2
    assert await state_of(store, done_row) is None and await state_of(store, failed_row) is None
    assert await state_of(store, denied) == "denied" and await state_of(store, approved) == "done"

    # 366 days on: the answered ones go with their answers; held, dead and pending are never pruned.
    report = await pruned(backend, store, 366)
    assert (report.counts["events"], report.counts["answers"]) == (2, 2)
    assert await store.answers() == []
    for row, state in ((held, "held"), (dead, "dead"), (pending, "pending")):
        assert await state_of(store, row) == state
    assert (await pruned(backend, store, 3000)).counts["events"] == 0


async def test_a_pruned_event_redelivered_is_still_a_duplicate(backend: Backend, store: Store) -> None:
    [row] = await ingest(store, "E-1")
    await claim_all(store, 1)
    await store.finish([row], "done")
    report = await pruned(backend, store, 31)
    assert (report.counts["events"], report.keys_kept) == (1, 1)
    assert await store.find_events("E-1", KEY.server) == []

    again = await store.ingest(KEY, [incoming("E-1"), incoming("E-2")], "c2")
    assert (again.inserted, again.duplicates) == (1, 1)
    [via_webhook] = await store.ingest_deliveries([WebhookDelivery(KEY, incoming("E-1"), "c3")])
    assert (via_webhook.inserted, via_webhook.duplicates) == (0, 1)
    assert await store.find_events("E-1", KEY.server) == []
    assert [s["duplicates"] for s in await store.subscriptions()] == [2]

    # The key itself goes dedup_days after the row was pruned; then the id is new again.
    report = await pruned(backend, store, 31 + 366)
    assert report.counts["seen"] == 1
    assert (await store.ingest(KEY, [incoming("E-1")], "c4")).inserted == 1


async def test_a_dry_run_counts_what_a_prune_deletes_and_changes_nothing(
    backend: Backend, store: Store
) -> None:
    await done_with_run(store, "ran")
    rows = await ingest(store, *(f"E-{i}" for i in range(7)))
    await claim_all(store, 7)
    await store.finish(rows, "done")
    before = [await store.event_detail(r) for r in rows]
    target = await open_target(backend.store_config(), store)
    try:
        dry = await prune(target, Retention(pause_s=0, batch_rows=3), now=days(100), dry_run=True)
        assert [await store.event_detail(r) for r in rows] == before
        real = await prune(target, Retention(pause_s=0, batch_rows=3), now=days(100))
    finally:
        await target.close()
    assert dry.dry_run and not real.dry_run
    assert dry.counts == real.counts
    assert (real.counts["events"], real.counts["runs"], real.counts["tool_calls"]) == (8, 1, 1)
    assert dry.keys_kept == real.keys_kept == 8


class Gated:
    """A prune target that stops before its ``gate_at``-th transaction until ``go`` is set."""

    def __init__(self, inner: PruneTarget, gate_at: int) -> None:
        self.inner = inner
        self.dialect = inner.dialect
        self.calls = 0
        self.gate_at = gate_at
        self.reached = anyio.Event()
        self.go = anyio.Event()

    async def run(self, script: Script[T], *, write: bool) -> T:
        self.calls += 1
        if self.calls == self.gate_at:
            self.reached.set()
            await self.go.wait()
        return await self.inner.run(script, write=write)

    def exclusive(self) -> AbstractAsyncContextManager[bool]:
        return self.inner.exclusive()

    async def reclaim(self, pause_s: float) -> int:
        return await self.inner.reclaim(pause_s)

    async def vacuum(self) -> int:
        return await self.inner.vacuum()

    async def storage(self) -> dict[str, Any]:
        return await self.inner.storage()

    async def close(self) -> None:
        await self.inner.close()


async def test_a_long_prune_goes_in_small_batches_while_ingest_and_claims_go_on(
    backend: Backend, store: Store
) -> None:
    ids = [f"E-{i}" for i in range(600)]
    rows = await ingest(store, *ids)
    await claim_all(store, len(rows))
    await store.finish(rows, "done")
    sizes: list[int] = []

    def progress(table: str, report: PruneReport) -> None:
        sizes.append(report.counts["events"])

    gated = Gated(await open_target(backend.store_config(), store), gate_at=7)
    result: list[PruneReport] = []

    async def pruning() -> None:
        result.append(
            await prune(gated, Retention(pause_s=0, batch_rows=50), now=days(31), progress=progress)
        )

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as tg:
            tg.start_soon(pruning)
            await gated.reached.wait()  # mid-prune: some batches done, more to come
            assert 0 < sizes[-1] < len(rows)
            assert (await store.ingest(KEY, [incoming("new")], "c-new")).inserted == 1
            [claimed] = await store.claim(1)
            assert claimed.event_id == "new"
            assert not result  # the prune is still under way
            gated.go.set()
    await gated.close()
    [report] = result
    assert report.counts["events"] == len(rows)
    steps = [b - a for a, b in zip([0, *sizes], sizes, strict=False)]
    assert max(steps) <= 50
    assert await state_of(store, claimed.id) == "processing"


async def test_storage_says_the_size_and_the_oldest_kept_event(backend: Backend, store: Store) -> None:
    target = await open_target(backend.store_config(), store)
    try:
        empty = await target.storage()
        assert empty["oldest_event_at"] is None and empty["size_bytes"] > 0
        await ingest(store, "E-1", "E-2")
        [first] = await store.find_events("E-1", KEY.server)
        assert (await target.storage())["oldest_event_at"] == first["received_at"]
    finally:
        await target.close()
    assert empty["backend"] == ("sqlite" if backend.url is None else "postgresql")


async def test_two_pruners_at_once_on_postgres_one_skips(backend: Backend, store: Store) -> None:
    if backend.url is None:
        pytest.skip("SQLite prunes are serialized by its one writer")
    first = await open_target(backend.store_config(), store)
    second = await open_target(backend.store_config(), store)
    try:
        async with first.exclusive() as mine:
            assert mine
            report = await prune(second, Retention(pause_s=0), now=days(31))
            assert report.skipped is not None
    finally:
        await first.close()
        await second.close()
