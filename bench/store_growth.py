"""A store that has run for months, and one kept bounded by retention.

    .venv/bin/python bench/store_growth.py             # 1,000,000 done events with their runs; 60 s soak
    .venv/bin/python bench/store_growth.py --quick --json

Size: two SQLite stores made in the same run, one empty and one holding ``--events`` done events,
each with an agent run (a short transcript and one tool call), written directly in bulk before
the clock starts. On each, the claim latency (p50/p99 of claiming one of ``--pending`` pending
events, through the store's own ``claim``) and the wall time of ``agentwake status`` (a new
process, the median of ``--repeat``); the big store's figures are given as ratios to the empty one's.

Soak: a steady event rate (``--rate`` events/s for ``--seconds``) through the async store, each
event claimed and handled by a run with a transcript, while the background pruner
(``agentwake.store.retention``) runs with retention compressed to seconds (an hour of the
service's life in ``--seconds``: events kept ``--keep-s``, the pruner every ``--interval-s``).
The store's size (file and WAL) is sampled every second; it levels off when the last third of
the samples grows no more than ``LEVEL_GROWTH`` over the middle third's peak.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import anyio
from _harness import BenchFailure, finish

from agentwake.clock import iso, now_iso, utc_now
from agentwake.store import EventVerdict, IncomingEvent, RunProgress, SubscriptionKey, ToolCallRecord
from agentwake.store.retention import Retention, prune
from agentwake.store.sqlite import SqliteCore, SqliteStore
from agentwake.store.sqlite.retention import SqlitePruneTarget
from agentwake.store.sqlite.views import file_size, wal_path

KEY: Final = SubscriptionKey("tickets", "demo", "ticket.created", {})
CHUNK: Final = 50_000
# The last third of the soak may grow this much over the middle third's peak and still be level.
LEVEL_GROWTH: Final = 0.10
TRANSCRIPT: Final = json.dumps(
    [{"role": "user", "content": "x" * 600}, {"role": "assistant", "content": "closed it " + "y" * 400}]
)


@dataclass
class Figures:
    events: int
    fill_s: float
    empty_claim_p50_ms: float
    empty_claim_p99_ms: float
    big_claim_p50_ms: float
    big_claim_p99_ms: float
    claim_p99_ratio: float
    empty_status_s: float
    big_status_s: float
    status_ratio: float
    big_store_bytes: int
    soak_seconds: float
    soak_events: int
    soak_sizes: list[int] = field(default_factory=list)
    soak_middle_peak: int = 0
    soak_last_peak: int = 0
    soak_levels_off: bool = False


def make_store(path: Path, events: int) -> float:
    """A store with ``events`` done events, each with a completed agent run and one tool call."""
    started = time.monotonic()
    SqliteCore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous=OFF")
    now = now_iso()
    conn.execute(
        "INSERT INTO subscriptions (name, server, event, arguments, status, created_at, updated_at)"
        " VALUES (?, ?, ?, '{}', 'active', ?, ?)",
        [KEY.name, KEY.server, KEY.event, now, now],
    )
    for start in range(0, events, CHUNK):
        count = min(CHUNK, events - start)
        ids = range(start + 1, start + count + 1)
        with conn:
            conn.executemany(
                "INSERT INTO events (id, server, subscription, name, event_id, timestamp, data, received_at,"
                " state, attempts, state_changed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'done', 1, ?)",
                ((i, KEY.server, KEY.name, KEY.event, f"E-{i}", now, f'{{"n": {i}}}', now, now) for i in ids),
            )
            conn.executemany(
                "INSERT INTO runs (id, event_row, kind, attempt, model, status, decision, system_prompt,"
                " user_prompt, messages, steps, started_at, finished_at, duration_ms)"
                " VALUES (?, ?, 'agent', 1, 'm', 'completed', '{}', 'You triage tickets.', ?, ?, 1, ?, ?, 900)",
                ((i, i, f"ticket {i}", TRANSCRIPT[:200], now, now) for i in ids),
            )
            conn.executemany(
                "INSERT INTO tool_calls (run_id, step, call_id, tool, status, result, at)"
                " VALUES (?, 1, 'c1', 'demo__close', 'ok', 'closed', ?)",
                ((i, now) for i in ids),
            )
    conn.close()
    return time.monotonic() - started


def add_pending(path: Path, count: int) -> None:
    core = SqliteCore.open(path)
    try:
        core.register(KEY)
        stamp = now_iso()
        core.ingest(KEY, [IncomingEvent(f"P-{i}", KEY.event, stamp, {"n": i}) for i in range(count)], "p")
    finally:
        core.close()


def claim_latencies(path: Path, count: int) -> tuple[float, float]:
    core = SqliteCore.open(path)
    try:
        lease = iso(utc_now().replace(year=utc_now().year + 1))
        took = []
        for _ in range(count):
            started = time.perf_counter()
            claimed = core.claim(1, lease_until=lease)
            took.append(time.perf_counter() - started)
            if len(claimed) != 1:
                raise BenchFailure(f"a claim among pending events took {len(claimed)}")
    finally:
        core.close()
    took.sort()
    return took[len(took) // 2] * 1000, took[min(len(took) - 1, int(len(took) * 0.99))] * 1000


def status_time(folder: Path, path: Path, repeat: int) -> float:
    config = folder / f"{path.stem}.toml"
    config.write_text(f'[store]\npath = "{path}"\n')
    times = []
    for _ in range(repeat + 1):  # the first one warms the page cache
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "agentwake.cli", "status", "-c", str(config)],
            capture_output=True,
            text=True,
            check=False,
        )
        times.append(time.monotonic() - started)
        if done.returncode != 0:
            raise BenchFailure(f"agentwake status failed: {done.stderr[-500:]}")
    return statistics.median(times[1:])


def store_bytes(path: Path) -> int:
    return file_size(path) + file_size(wal_path(path))


async def soak(
    path: Path, seconds: float, rate: float, keep_s: float, interval_s: float
) -> tuple[int, list[int]]:
    """Events at ``rate`` per second, each run with a transcript, while the pruner keeps ``keep_s``."""
    store = await SqliteStore.open(path)
    await store.register(KEY)
    target = await SqlitePruneTarget.open(path)
    retention = Retention(
        done_s=keep_s,
        failed_s=keep_s,
        runs_s=keep_s,
        transcript_s=keep_s / 2,
        answered_s=keep_s,
        gaps_s=keep_s,
        dedup_s=keep_s * 2,
        batch_rows=500,
        pause_s=0.01,
    )
    sizes: list[int] = []
    sent = 0
    call = ToolCallRecord(1, "c1", "demo__close", "demo", "close", {"id": 1}, "ok", "closed " + "z" * 300, 3)
    progress = RunProgress(json.loads(TRANSCRIPT), 1, 100, 20, 0.001)
    deadline = time.monotonic() + seconds

    async def pruner() -> None:
        while True:
            await anyio.sleep(interval_s)
            await prune(target, retention)
            await target.reclaim(retention.pause_s)

    async def sampler() -> None:
        while True:
            sizes.append(store_bytes(path))
            await anyio.sleep(1)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pruner)
            tg.start_soon(sampler)
            tick = 0.1
            while time.monotonic() < deadline:
                started = time.monotonic()
                batch = max(1, int(rate * tick))
                events = [
                    IncomingEvent(f"S-{sent + i}", KEY.event, now_iso(), {"n": sent + i, "text": "w" * 300})
                    for i in range(batch)
                ]
                sent += batch
                await store.ingest(KEY, events, str(sent))
                for event in await store.claim(batch):
                    run = await store.start_run(
                        event.id,
                        kind="agent",
                        attempt=event.attempts,
                        model="m",
                        decision={},
                        system_prompt="You triage tickets. " * 20,
                        user_prompt="ticket " * 50,
                    )
                    row = await store.journal_tool_call(run, call, f"k-{event.id}")
                    await store.settle_tool_call(
                        row, status="ok", result=call.result, reply="closed", duration_ms=3
                    )
                    await store.finish_run(
                        run,
                        status="completed",
                        reason=None,
                        progress=progress,
                        duration_ms=5,
                        verdict=EventVerdict("done"),
                    )
                await anyio.sleep(max(0.0, tick - (time.monotonic() - started)))
            tg.cancel_scope.cancel()
    finally:
        await target.close()
        await store.close()
    return sent, sizes


def measure(args: argparse.Namespace) -> Figures:
    with tempfile.TemporaryDirectory(prefix="agentwake-growth-") as tmp:
        folder = Path(tmp)
        empty, big = folder / "empty.db", folder / "big.db"
        make_store(empty, 0)
        fill_s = make_store(big, args.events)
        for path in (empty, big):
            add_pending(path, args.pending)
        empty_status = status_time(folder, empty, args.repeat)
        big_status = status_time(folder, big, args.repeat)
        e50, e99 = claim_latencies(empty, args.pending)
        b50, b99 = claim_latencies(big, args.pending)
        big_bytes = store_bytes(big)
        big.unlink()
        soaked = folder / "soak.db"
        sent, sizes = anyio.run(soak, soaked, args.seconds, args.rate, args.keep_s, args.interval_s)
    third = max(1, len(sizes) // 3)
    middle, last = sizes[third : 2 * third] or sizes, sizes[2 * third :] or sizes
    middle_peak, last_peak = max(middle), max(last)
    return Figures(
        events=args.events,
        fill_s=round(fill_s, 1),
        empty_claim_p50_ms=round(e50, 3),
        empty_claim_p99_ms=round(e99, 3),
        big_claim_p50_ms=round(b50, 3),
        big_claim_p99_ms=round(b99, 3),
        claim_p99_ratio=round(b99 / e99, 2) if e99 else 0.0,
        empty_status_s=round(empty_status, 3),
        big_status_s=round(big_status, 3),
        status_ratio=round(big_status / empty_status, 2) if empty_status else 0.0,
        big_store_bytes=big_bytes,
        soak_seconds=args.seconds,
        soak_events=sent,
        soak_sizes=sizes,
        soak_middle_peak=middle_peak,
        soak_last_peak=last_peak,
        soak_levels_off=last_peak <= middle_peak * (1 + LEVEL_GROWTH),
    )


def report(f: Figures) -> None:
    print(
        f"store with {f.events} done events and their runs ({f.big_store_bytes / 1e6:.0f} MB, filled in {f.fill_s} s)"
    )
    print(
        f"  claim one pending  p50 {f.big_claim_p50_ms} ms, p99 {f.big_claim_p99_ms} ms"
        f"  (empty store: p50 {f.empty_claim_p50_ms} ms, p99 {f.empty_claim_p99_ms} ms; p99 x{f.claim_p99_ratio})"
    )
    print(f"  agentwake status   {f.big_status_s} s  (empty store: {f.empty_status_s} s; x{f.status_ratio})")
    print(f"soak: {f.soak_events} events in {f.soak_seconds:g} s under retention; size every second (kB):")
    print("  " + " ".join(str(s // 1000) for s in f.soak_sizes))
    verdict = "levels off" if f.soak_levels_off else "still grows"
    print(
        f"  middle third's peak {f.soak_middle_peak // 1000} kB, last third's {f.soak_last_peak // 1000} kB: {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="done events (with runs) in the big store"
    )
    parser.add_argument(
        "--pending", type=int, default=300, help="pending events claimed one by one in each store"
    )
    parser.add_argument("--repeat", type=int, default=3, help="agentwake status runs per store (median)")
    parser.add_argument("--seconds", type=float, default=60.0, help="soak length")
    parser.add_argument("--rate", type=float, default=200.0, help="soak events per second")
    parser.add_argument("--keep-s", type=float, default=10.0, help="soak retention of everything, in seconds")
    parser.add_argument("--interval-s", type=float, default=2.0, help="soak pruner interval")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()
    if args.quick:
        args.events, args.pending, args.repeat = 20_000, 50, 1
        args.seconds, args.rate, args.keep_s, args.interval_s = 9.0, 100.0, 2.0, 1.0
    return finish(lambda: measure(args), as_json=args.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
