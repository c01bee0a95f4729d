"""Push delivery over stdio: backlog drain throughput and live emit -> committed latency, against poll.

    .venv/bin/python bench/push_latency.py                      # 100,000 events, 100 ev/s for 5 s
    .venv/bin/python bench/push_latency.py --events 20000 --seconds 2 --repeat 1 --json
    .venv/bin/python bench/push_latency.py --load 1             # beside a busy-looping process

Both figures are agentwake's real paths: ``PushLoop`` (events/stream) or ``PollLoop``
(events/poll) -> ``ServerConnection`` (the MCP SDK over a stdio subprocess) -> ``SqliteStore``.
The server is ``bench/push_server.py``, hand-written and pre-encoding its output so that it
is not what is measured; how fast it writes the backlog on its own (to /dev/null) is
reported too (``server_events_per_s``).

* drain: a backlog of ``--events`` items, from cursor 0 until the cursor of the last one is
  stored; push and poll (the baseline, ``max_events`` 1000 as bench/poll_drain.py) alternate
  for ``--repeat`` rounds and the medians are reported. Each drain is checked exactly-once:
  every id stored once, none missing, the stored cursor the last item's.
* against SQLite alone: after each round's push drain, the very rows it stored are inserted
  with plain ``sqlite3`` ``executemany`` into an identical ``events`` table, in batches of 1000
  (bench/poll_drain.py's baseline), and let go before the poll drain; push's and poll's rates
  over that one's are the ratios the target (TARGET_SQLITE_RATIO) is about, all three measured
  in the same round.
* latency: the server emits ``--rate`` items a second for ``--seconds``, each stamped with
  ``time.time()`` as it is written (push) or becomes available (poll); an item is committed
  when the ``Store.ingest`` that holds it returns. Poll's figure is dominated by its poll
  interval (``poll_floor_ms``, default 1 s): it shows what push is for.
* ``--load N``: N processes spin on a core each for the whole run, the plain sqlite3 baseline's
  rounds included (its ratio compares like with like); the load averages before and after are
  printed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import anyio
from _harness import BenchFailure, busy_loops, finish, loadavg
from poll_drain import baseline_sqlite

from agentwake.config import ServerConfig, SubscriptionConfig
from agentwake.delivery.common import subscription_key
from agentwake.delivery.poll import PollLoop
from agentwake.delivery.push import PushLoop
from agentwake.mcp import ServerConnection
from agentwake.service import settle_collector
from agentwake.store import IncomingEvent, IngestResult, RejectedEvent, SubscriptionKey
from agentwake.store.sqlite import SqliteCore, SqliteStore

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
SERVER: Final = REPO_ROOT / "bench" / "push_server.py"
DEFAULT_EVENTS: Final = 100_000
DEFAULT_RATE: Final = 100.0
DEFAULT_SECONDS: Final = 5.0
DEFAULT_REPEAT: Final = 3
POLL_MAX_EVENTS: Final = 1000
DRAIN_TIMEOUT_S: Final = 600.0
TARGET_EVENTS_PER_S: Final = 10_000.0
TARGET_P50_MS: Final = 5.0
TARGET_P99_MS: Final = 25.0
TARGET_SQLITE_RATIO: Final = 0.6  # each drain's rate over a plain sqlite3 insert of the same rows


@dataclass(frozen=True, slots=True)
class Figures:
    events: int
    push_events_per_s: float
    push_seconds: float
    poll_events_per_s: float
    poll_seconds: float
    push_cpu_us_per_event: float
    poll_cpu_us_per_event: float
    ratio: float
    ratios: list[float]
    sqlite_events_per_s: float
    push_vs_sqlite: float
    poll_vs_sqlite: float
    server_events_per_s: float
    rate: float
    seconds: float
    live_events: int
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    poll_latency_p50_ms: float | None
    poll_latency_p99_ms: float | None
    duplicates: int
    missing: int
    target_events_per_s: float
    target_p50_ms: float
    target_p99_ms: float
    pass_events_per_s: bool
    pass_latency: bool
    target_sqlite_ratio: float
    pass_push_vs_sqlite: bool
    pass_poll_vs_sqlite: bool
    load: int = 0  # busy-looping processes beside the whole run (--load)
    loadavg_before: list[float] | None = None
    loadavg_after: list[float] | None = None


class TimedStore(SqliteStore):
    """A SqliteStore that notes when each ingest returned, with the cursor it stored."""

    def __init__(self, core: SqliteCore) -> None:
        super().__init__(core)
        self.commits: list[tuple[str | None, float]] = []

    async def ingest(
        self,
        key: SubscriptionKey,
        events: Sequence[IncomingEvent],
        cursor: str | None,
        *,
        truncated: bool = False,
        cursor_before: str | None = None,
        rejected: Sequence[RejectedEvent] = (),
        fence: int | None = None,
    ) -> IngestResult:
        result = await super().ingest(
            key,
            events,
            cursor,
            truncated=truncated,
            cursor_before=cursor_before,
            rejected=rejected,
            fence=fence,
        )
        self.commits.append((cursor, time.time()))
        return result


def server_config(tmp: Path, *, backlog: int, live: int = 0, rate: float = DEFAULT_RATE) -> ServerConfig:
    return ServerConfig(
        command=sys.executable,
        args=[str(SERVER)],
        env={"BENCH_BACKLOG": str(backlog), "BENCH_LIVE": str(live), "BENCH_RATE": str(rate)},
        cwd=tmp,
        protocol="legacy",
    )


def subscription(mode: str) -> SubscriptionConfig:
    return SubscriptionConfig.model_validate(
        {
            "name": "feed",
            "server": "bench",
            "event": "feed.item",
            "delivery": mode,
            "max_events": POLL_MAX_EVENTS,
            "heartbeat_s": 30,
        }
    )


async def open_store(path: Path, sub: SubscriptionConfig) -> TimedStore:
    store = TimedStore((await SqliteStore.open(path)).core)
    key = subscription_key(sub)
    await store.register(key)
    await store.ingest(key, [], "0")  # from the start of the backlog
    store.commits.clear()
    return store


async def check_exactly_once(store: SqliteStore, first: int, last: int) -> tuple[int, int]:
    """(duplicates, missing) of items first..last; raises unless both are 0 and the cursor is last's."""
    ids = await store.event_ids("feed")
    expected = {f"item-{n}" for n in range(first, last + 1)}
    duplicates = len(ids) - len(set(ids))
    missing = len(expected - set(ids))
    extra = len(set(ids) - expected)
    cursor = await store.cursor("feed")
    if duplicates or missing or extra or cursor != str(last):
        raise BenchFailure(
            f"{len(ids)} events stored ({duplicates} duplicates, {missing} missing, {extra} unexpected),"
            f" cursor {cursor!r}; expected items {first}..{last} once each and cursor {last}"
        )
    return duplicates, missing


class Reached:
    """An on_stored callback: set once the stored cursor is ``target``."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.event = anyio.Event()

    def __call__(self, cursor: str | None) -> None:
        if cursor == self.target:
            self.event.set()


async def drain_push(tmp: Path, count: int) -> tuple[float, float, list[IncomingEvent]]:
    """(seconds, CPU seconds of this process, the events stored) to drain ``count`` items by push."""
    sub = subscription("push")
    async with ServerConnection("bench", server_config(tmp, backlog=count)) as conn:
        store = await open_store(tmp / "push.db", sub)
        try:
            reached = Reached(str(count))
            loop = PushLoop(sub, conn, store, on_stored=reached)
            settle_collector()  # as `agentwake run` does after start-up (agentwake/service.py)
            with anyio.fail_after(DRAIN_TIMEOUT_S):
                async with anyio.create_task_group() as tg:
                    start, cpu = time.perf_counter(), time.process_time()
                    tg.start_soon(loop.run)
                    await reached.event.wait()
                    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                    tg.cancel_scope.cancel()
            gc.unfreeze()
            await check_exactly_once(store, 1, count)
            rows = (await store.inbox(count))[::-1]
        finally:
            await store.close()
    events = [IncomingEvent(r["event_id"], r["event"], r["timestamp"], r["data"]) for r in rows]
    return seconds, cpu, events


async def drain_poll(tmp: Path, count: int) -> tuple[float, float]:
    sub = subscription("poll")
    async with ServerConnection("bench", server_config(tmp, backlog=count)) as conn:
        store = await open_store(tmp / "poll.db", sub)
        try:
            drained = anyio.Event()

            async def sleep_when_drained(seconds: float) -> None:
                drained.set()  # PollLoop sleeps only once hasMore is false
                await anyio.sleep_forever()

            loop = PollLoop(sub, conn, store, sleep=sleep_when_drained)
            settle_collector()
            with anyio.fail_after(DRAIN_TIMEOUT_S):
                async with anyio.create_task_group() as tg:
                    start, cpu = time.perf_counter(), time.process_time()
                    tg.start_soon(loop.run)
                    await drained.wait()
                    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
                    tg.cancel_scope.cancel()
            gc.unfreeze()
            await check_exactly_once(store, 1, count)
        finally:
            await store.close()
    return seconds, cpu


def latencies_ms(commits: list[tuple[str | None, float]], emitted: dict[int, float]) -> list[float]:
    """Each item's emit -> committed: committed with the first ingest whose cursor reached it."""
    marks = sorted((int(cursor), at) for cursor, at in commits if cursor is not None)
    out: list[float] = []
    i = 0
    for n in sorted(emitted):
        while i < len(marks) and marks[i][0] < n:
            i += 1
        if i == len(marks):
            raise BenchFailure(f"item {n} was never committed with its cursor")
        out.append((marks[i][1] - emitted[n]) * 1000)
    return out


async def live(tmp: Path, mode: str, rate: float, seconds: float) -> list[float]:
    sub = subscription(mode)
    total = max(1, round(rate * seconds))
    async with ServerConnection("bench", server_config(tmp, backlog=0, live=total, rate=rate)) as conn:
        store = await open_store(tmp / f"live-{mode}.db", sub)
        try:
            reached = Reached(str(total))
            loop: PushLoop | PollLoop
            if mode == "push":
                loop = PushLoop(sub, conn, store, on_stored=reached)
            else:
                loop = PollLoop(sub, conn, store)
            settle_collector()
            with anyio.fail_after(seconds * 3 + 30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(loop.run)
                    while (await store.cursor("feed")) != str(total) and not reached.event.is_set():
                        with anyio.move_on_after(0.2):
                            await reached.event.wait()
                    tg.cancel_scope.cancel()
            gc.unfreeze()
            await check_exactly_once(store, 1, total)
            rows = await store.inbox(total)
            emitted = {int(r["data"]["n"]): float(r["data"]["emitted"]) for r in rows}
        finally:
            await store.close()
    return latencies_ms(store.commits, emitted)


def server_alone(tmp: Path, count: int) -> float:
    """How fast bench/push_server.py writes the backlog with nobody reading it (stdout to /dev/null)."""
    report = tmp / "server-report.json"
    env = {**os.environ, "BENCH_BACKLOG": str(count), "BENCH_REPORT": str(report)}
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
        {
            "jsonrpc": "2.0",
            "id": "s",
            "method": "events/stream",
            "params": {"name": "feed.item", "cursor": "0"},
        },
    ]
    with subprocess.Popen(
        [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env
    ) as proc:
        assert proc.stdin is not None
        proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests).encode())
        proc.stdin.flush()
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while not report.exists() or not report.read_text():
            if time.monotonic() > deadline:
                raise BenchFailure("the bench server wrote no report")
            time.sleep(0.01)
        time.sleep(0.05)  # the report is written in one go; let it land
        proc.stdin.close()
        proc.wait(10)
    return count / float(json.loads(report.read_text())["backlog_write_s"])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))
    return ordered[index]


async def run(count: int, rate: float, seconds: float, repeat: int, poll_latency: bool) -> Figures:
    pushes: list[float] = []
    polls: list[float] = []
    push_cpus: list[float] = []
    poll_cpus: list[float] = []
    ratios: list[float] = []
    sqlites: list[float] = []
    with tempfile.TemporaryDirectory(prefix="agentwake-bench-push-") as tmpdir:
        tmp = Path(tmpdir)
        server_rate = server_alone(tmp, count)
        for round_ in range(repeat):
            here = tmp / f"round-{round_}"
            here.mkdir()
            push_s, push_cpu, events = await drain_push(here, count)
            sqlites.append(baseline_sqlite(here / "baseline-sqlite.db", events))
            # Let go of them before the next drain: beside a dead copy of an earlier drain's events,
            # a push drain measured 15-30 % slower (a heap that large is not a service's).
            del events
            poll_s, poll_cpu = await drain_poll(here, count)
            pushes.append(push_s)
            polls.append(poll_s)
            push_cpus.append(push_cpu)
            poll_cpus.append(poll_cpu)
            ratios.append(poll_s / push_s)
        push_lat = await live(tmp, "push", rate, seconds)
        poll_lat = await live(tmp, "poll", rate, seconds) if poll_latency else None
    push_s = statistics.median(pushes)
    poll_s = statistics.median(polls)
    p50 = percentile(push_lat, 50)
    p99 = percentile(push_lat, 99)
    push_rate = count / push_s
    sqlite_s = statistics.median(sqlites)
    push_vs_sqlite = statistics.median(sq / pu for sq, pu in zip(sqlites, pushes, strict=True))
    poll_vs_sqlite = statistics.median(sq / po for sq, po in zip(sqlites, polls, strict=True))
    return Figures(
        events=count,
        push_events_per_s=round(push_rate, 1),
        push_seconds=round(push_s, 4),
        poll_events_per_s=round(count / poll_s, 1),
        poll_seconds=round(poll_s, 4),
        push_cpu_us_per_event=round(statistics.median(push_cpus) / count * 1e6, 2),
        poll_cpu_us_per_event=round(statistics.median(poll_cpus) / count * 1e6, 2),
        ratio=round(statistics.median(ratios), 4),
        ratios=[round(r, 4) for r in ratios],
        sqlite_events_per_s=round(count / sqlite_s, 1),
        push_vs_sqlite=round(push_vs_sqlite, 4),
        poll_vs_sqlite=round(poll_vs_sqlite, 4),
        server_events_per_s=round(server_rate, 1),
        rate=rate,
        seconds=seconds,
        live_events=len(push_lat),
        latency_p50_ms=round(p50, 3),
        latency_p99_ms=round(p99, 3),
        latency_max_ms=round(max(push_lat), 3),
        poll_latency_p50_ms=round(percentile(poll_lat, 50), 3) if poll_lat else None,
        poll_latency_p99_ms=round(percentile(poll_lat, 99), 3) if poll_lat else None,
        duplicates=0,  # check_exactly_once raised otherwise
        missing=0,
        target_events_per_s=TARGET_EVENTS_PER_S,
        target_p50_ms=TARGET_P50_MS,
        target_p99_ms=TARGET_P99_MS,
        pass_events_per_s=push_rate >= TARGET_EVENTS_PER_S,
        pass_latency=p50 <= TARGET_P50_MS and p99 <= TARGET_P99_MS,
        target_sqlite_ratio=TARGET_SQLITE_RATIO,
        pass_push_vs_sqlite=push_vs_sqlite >= TARGET_SQLITE_RATIO,
        pass_poll_vs_sqlite=poll_vs_sqlite >= TARGET_SQLITE_RATIO,
    )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(f: Figures) -> None:
    if f.load:
        print(
            f"load:                           {f.load} busy loop(s); load average {f.loadavg_before}"
            f" before, {f.loadavg_after} after"
        )
    print(
        f"backlog:                        {f.events:,} events (exactly once: {f.duplicates} dup, {f.missing} missing)"
    )
    print(f"server alone writes:            {f.server_events_per_s:,.0f} events/s")
    print(f"push drain over stdio:          {f.push_events_per_s:,.0f} events/s ({f.push_seconds:.3f} s)")
    print(f"poll drain over stdio:          {f.poll_events_per_s:,.0f} events/s ({f.poll_seconds:.3f} s)")
    print(
        f"client CPU per event:           push {f.push_cpu_us_per_event:.1f} us,"
        f" poll {f.poll_cpu_us_per_event:.1f} us (both threads)"
    )
    print(f"plain sqlite3, same rows:       {f.sqlite_events_per_s:,.0f} events/s (batches of 1000)")
    print(
        f"drain / plain sqlite3:          push {f.push_vs_sqlite:.3f}, poll {f.poll_vs_sqlite:.3f}"
        " (medians of the rounds' ratios)"
    )
    print(
        f"ratio push / poll:              {f.ratio:.3f} (median of {', '.join(f'{r:.3f}' for r in f.ratios)})"
    )
    print(
        f"push latency at {f.rate:g}/s:         p50 {f.latency_p50_ms:.2f} ms, p99 {f.latency_p99_ms:.2f} ms,"
        f" max {f.latency_max_ms:.2f} ms ({f.live_events} events)"
    )
    if f.poll_latency_p50_ms is not None:
        print(
            f"poll latency (baseline):        p50 {f.poll_latency_p50_ms:.1f} ms, p99 {f.poll_latency_p99_ms:.1f} ms"
        )
    print(f"target push >= {f.target_events_per_s:,.0f}/s:        {verdict(f.pass_events_per_s)}")
    print(f"target p50 <= {f.target_p50_ms:g} ms, p99 <= {f.target_p99_ms:g} ms: {verdict(f.pass_latency)}")
    print(
        f"target drains >= {f.target_sqlite_ratio:g}x plain sqlite3: push {verdict(f.pass_push_vs_sqlite)},"
        f" poll {verdict(f.pass_poll_vs_sqlite)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="backlog size (default 100000)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="live events a second (default 100)")
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="live phase length (default 5)"
    )
    parser.add_argument(
        "--repeat", type=int, default=DEFAULT_REPEAT, help="drain rounds; medians (default 3)"
    )
    parser.add_argument("--no-poll-latency", action="store_true", help="skip the poll latency baseline")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="busy-looping processes beside the whole run: a loaded machine (default 0)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if args.events < 1 or args.rate <= 0 or args.seconds <= 0 or args.repeat < 1:
        parser.error("--events, --rate, --seconds and --repeat must be positive")
    if args.load < 0:
        parser.error("--load must be 0 or more")

    def measure() -> Figures:
        with busy_loops(args.load):
            before = loadavg()
            figures = anyio.run(
                run, args.events, args.rate, args.seconds, args.repeat, not args.no_poll_latency
            )
            return replace(figures, load=args.load, loadavg_before=before, loadavg_after=loadavg())

    return finish(measure, as_json=args.json, report=report)


if __name__ == "__main__":
    sys.exit(main())
