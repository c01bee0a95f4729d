"""Drain a ticket backlog from the demo server over stdio and compare with raw SQLite.

    .venv/bin/python bench/poll_drain.py              # 100,000 tickets, 3 rounds
    .venv/bin/python bench/poll_drain.py --events 20000 --repeat 1 --json

The end-to-end figure is agentwake's real poll path: ``PollLoop`` -> ``ServerConnection``
(the MCP SDK over a stdio subprocess running ``examples.demo_server``) -> ``Store.ingest``
(one transaction per batch of ``max_events``). The two baselines insert the very same
events without any MCP in between: ``SqliteCore.ingest`` in a tight loop (the store's own
cost) and plain ``sqlite3`` ``executemany`` into an identical ``events`` table (SQLite alone).
Seeding the upstream database is not measured.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import sqlite_utils
from _harness import BenchFailure, finish

from agentwake.clock import now_iso
from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.common import subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.mcp import ServerConnection
from agentwake.service import settle_collector
from agentwake.store import IncomingEvent
from agentwake.store.sqlite import SqliteCore, SqliteStore
from agentwake.store.sqlite.inbox import INSERT_EVENT_SQL
from agentwake.store.sqlite.schema import migrations

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # examples/ is read from the checkout, not installed

from examples.demo_server import TicketStore, random_ticket  # noqa: E402

DEFAULT_EVENTS: Final = 100_000
DEFAULT_REPEAT: Final = 3
SEED_BATCH: Final = 10_000
MAX_EVENTS: Final = 1000
SEED: Final = 20240601
TARGET_EVENTS_PER_S: Final = 10_000.0
TARGET_RATIO: Final = 0.3


@dataclass(frozen=True, slots=True)
class Figures:
    events: int
    polls: int
    seconds: float
    events_per_s: float
    baseline_store_seconds: float
    baseline_store_events_per_s: float
    baseline_sqlite_seconds: float
    baseline_sqlite_events_per_s: float
    ratio: float
    ratios: list[float]
    store_overhead: float
    target_events_per_s: float
    target_ratio: float
    pass_events_per_s: bool
    pass_ratio: bool


def seed_backlog(path: Path, count: int, seed: int) -> None:
    rng = random.Random(seed)
    tickets = TicketStore(path)
    try:
        remaining = count
        while remaining > 0:
            batch = min(remaining, SEED_BATCH)
            tickets.create([random_ticket(rng) for _ in range(batch)])
            remaining -= batch
    finally:
        tickets.close()


def server_config(db: Path) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=["-m", "examples.demo_server"],
        env={
            "DEMO_DB": str(db),
            "DEMO_RATE": "0",
            "DEMO_ALERT_INTERVAL": "0",
            "DEMO_LOAD_INTERVAL": "0",
        },
        cwd=REPO_ROOT,
    )


def subscription() -> SubscriptionConfig:
    return SubscriptionConfig(name="tickets", server="demo", event="ticket.created", max_events=MAX_EVENTS)


async def drain(tmp: Path, demo_db: Path, expected: int) -> tuple[float, int, list[IncomingEvent]]:
    """Run the real poll loop until the server says hasMore=false; return (seconds, polls, events)."""
    sub = subscription()
    key = subscription_key(sub)
    async with ServerConnection("demo", server_config(demo_db)) as conn:
        store = await SqliteStore.open(tmp / "agentwake.db")
        try:
            await store.register(key)
            await store.ingest(key, [], "0")  # persist cursor "0": replay from the start of the backlog
            drained = anyio.Event()

            async def sleep_when_drained(seconds: float) -> None:
                # PollLoop sleeps only when hasMore is false (or before a retry, which
                # would show up as a wrong count below).
                drained.set()
                await anyio.sleep_forever()

            loop = PollLoop(sub, conn, store, sleep=sleep_when_drained)
            # As `agentwake run` does after start-up (agentwake/service.py).
            settle_collector()
            async with anyio.create_task_group() as tg:
                start = time.perf_counter()
                tg.start_soon(loop.run)
                await drained.wait()
                seconds = time.perf_counter() - start
                tg.cancel_scope.cancel()

            ids = await store.event_ids("tickets")
            if len(ids) != expected or len(set(ids)) != expected:
                raise BenchFailure(
                    f"the store holds {len(ids)} events ({len(set(ids))} distinct) after the drain,"
                    f" expected {expected}"
                )
            # Oldest first: the same events, in the same order, the poll loop ingested.
            inbox = (await store.inbox(expected))[::-1]
            events = [IncomingEvent(r["event_id"], r["event"], r["timestamp"], r["data"]) for r in inbox]
        finally:
            await store.close()
    return seconds, loop.polls, events


def batches(events: list[IncomingEvent]) -> list[list[IncomingEvent]]:
    return [events[i : i + MAX_EVENTS] for i in range(0, len(events), MAX_EVENTS)]


def baseline_store(path: Path, events: list[IncomingEvent]) -> float:
    """SqliteCore.ingest of the same batches, one transaction each, no MCP and no threads."""
    key = subscription_key(subscription())
    store = SqliteCore.open(path)
    try:
        store.register(key)
        chunks = batches(events)
        start = time.perf_counter()
        done = 0
        for chunk in chunks:
            done += len(chunk)
            store.ingest(key, chunk, str(done))
        seconds = time.perf_counter() - start
        count = len(store.event_ids("tickets"))
    finally:
        store.close()
    if count != len(events):
        raise BenchFailure(f"baseline store holds {count} events, expected {len(events)}")
    return seconds


def baseline_sqlite(path: Path, events: list[IncomingEvent]) -> float:
    """Plain sqlite3 executemany of the same tuples into an identical events table."""
    key = subscription_key(subscription())
    now = now_iso()
    rows: list[tuple[Any, ...]] = [
        (
            key.server,
            key.name,
            e.name,
            e.event_id,
            e.timestamp,
            json.dumps(e.data, separators=(",", ":"), ensure_ascii=False),
            None,
            now,
            now,
        )
        for e in events
    ]
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        # The very schema the store creates, from its own migrations.
        migrations.apply(sqlite_utils.Database(db))
        start = time.perf_counter()
        for i in range(0, len(rows), MAX_EVENTS):
            db.execute("BEGIN")
            db.executemany(INSERT_EVENT_SQL, rows[i : i + MAX_EVENTS])
            db.execute("COMMIT")
        seconds = time.perf_counter() - start
        count = int(db.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        db.close()
    if count != len(events):
        raise BenchFailure(f"baseline sqlite3 table holds {count} events, expected {len(events)}")
    return seconds


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


async def run(count: int, seed: int, repeat: int = DEFAULT_REPEAT) -> Figures:
    """``repeat`` rounds of (drain, then the store baseline right after it); medians are reported.

    These machines are noisy: a baseline measured next to its own drain, and the median
    over rounds, keeps one slow moment from deciding the ratio.
    """
    drains: list[float] = []
    stores: list[float] = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="agentwake-bench-") as tmpdir:
        tmp = Path(tmpdir)
        demo_db = tmp / "tickets.db"
        seed_backlog(demo_db, count, seed)
        for round_ in range(repeat):
            here = tmp / f"round-{round_}"
            here.mkdir()
            seconds, polls, events = await drain(here, demo_db, count)
            store_s = baseline_store(here / "baseline-store.db", events)
            drains.append(seconds)
            stores.append(store_s)
            ratios.append(rate(count, seconds) / rate(count, store_s))
        sqlite_s = baseline_sqlite(tmp / "baseline-sqlite.db", events)
    seconds = statistics.median(drains)
    store_s = statistics.median(stores)
    e2e = rate(count, seconds)
    store_rate = rate(count, store_s)
    sqlite_rate = rate(count, sqlite_s)
    ratio = statistics.median(ratios)
    return Figures(
        events=count,
        polls=polls,
        seconds=round(seconds, 4),
        events_per_s=round(e2e, 1),
        baseline_store_seconds=round(store_s, 4),
        baseline_store_events_per_s=round(store_rate, 1),
        baseline_sqlite_seconds=round(sqlite_s, 4),
        baseline_sqlite_events_per_s=round(sqlite_rate, 1),
        ratio=round(ratio, 4),
        ratios=[round(r, 4) for r in ratios],
        store_overhead=round(sqlite_rate / store_rate, 3),
        target_events_per_s=TARGET_EVENTS_PER_S,
        target_ratio=TARGET_RATIO,
        pass_events_per_s=e2e >= TARGET_EVENTS_PER_S,
        pass_ratio=ratio >= TARGET_RATIO,
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(f: Figures) -> None:
    print(f"events drained:                 {f.events:,} in {f.polls} polls of up to {MAX_EVENTS}")
    print(f"drain time:                     {f.seconds:.3f} s")
    print(f"end-to-end over stdio:          {f.events_per_s:,.0f} events/s")
    print(
        f"baseline, SqliteCore.ingest:    {f.baseline_store_events_per_s:,.0f} events/s"
        f" ({f.baseline_store_seconds:.3f} s)"
    )
    print(
        f"baseline, plain sqlite3:        {f.baseline_sqlite_events_per_s:,.0f} events/s"
        f" ({f.baseline_sqlite_seconds:.3f} s; {f.store_overhead:.2f}x the store's rate: the store is"
        f" {'slower' if f.store_overhead > 1 else 'faster'})"
    )
    print(
        f"ratio end-to-end / store:       {f.ratio:.3f} (median of {', '.join(f'{r:.3f}' for r in f.ratios)})"
    )
    print(
        f"target end-to-end >= {f.target_events_per_s:,.0f}/s:  {verdict(f.pass_events_per_s)}"
        f" ({f.events_per_s:,.0f}/s)"
    )
    print(f"target ratio >= {f.target_ratio}:           {verdict(f.pass_ratio)} ({f.ratio:.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="backlog size (default 100000)")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed for the tickets")
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help="rounds of drain + baseline; medians are reported (default 3)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.events < 1:
        parser.error("--events must be at least 1")
    return finish(
        lambda: anyio.run(run, args.events, args.seed, args.repeat), as_json=args.json, report=report
    )


if __name__ == "__main__":
    sys.exit(main())
