"""Retention: what the store forgets, and when (``[store.retention]``), for both backends.

What is kept:

- events pending, processing, held (waiting for a person) or dead (waiting for a retry), whatever
  their age; an event with a run still running, one with a run younger than ``runs_days``, or one
  answered (approved or denied) less than ``answered_days`` ago;
- other events until ``done_days`` after they ended (done, ignored, denied, batched, rejected) or
  ``failed_days`` after they failed. A pruned event goes with its runs, tool calls, answers and
  flow marks, and leaves its (server, name, eventId) key in ``seen`` for ``dedup_days``: a
  re-delivery of it is still a duplicate (both schemas skip an insert whose key is there);
- a finished event's run transcripts (prompts, messages, tool-call arguments, results and replies)
  are cleared after ``transcript_days``, the run's row kept. Failed and dead events keep theirs
  (a retry resumes from them);
- flow marks (policy flow control) until ``done_days``: a window longer than that is cut to it;
- gaps until ``gaps_days``.

How: in small batches (``batch_rows`` rows per transaction, ``batch_pause_s`` between two), so
deliveries and claims go on while a prune runs. Events are walked in id order (ids follow receipt),
one window of ``batch_rows`` ids at a time, up to the newest that may be old enough. Each window
is two transactions: the keys of the events to prune go into ``seen`` first and are committed,
then the events are deleted; so an ingest racing the delete (PostgreSQL) finds the key either
in ``events`` or in ``seen``, never in neither.

Each batch is written once, as a generator that yields its statements (``%s`` placeholders) and
is sent their rows and row count (as ``agentwake.store.postgres.views`` does for the views);
``PruneTarget`` runs it in one transaction on either backend (``sqlite.retention``,
``postgres.retention``). ``keep_pruned`` is the service's background pruner.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, TypeVar

import anyio

from agentwake.clock import iso, utc_now
from agentwake.errors import StoreError

if TYPE_CHECKING:
    from agentwake.config import RetentionConfig, StoreConfig
    from agentwake.store.interface import Store

logger = logging.getLogger(__name__)

T = TypeVar("T")

DAY_S: Final = 86_400.0
# States whose events are over (nothing more happens to them but a read).
FINAL_STATES: Final = ("done", "ignored", "denied", "batched", "rejected")
_FINAL_SQL: Final = "(" + ", ".join(f"'{s}'" for s in FINAL_STATES) + ")"
# What a report counts, in the order it is shown.
TABLES: Final = ("events", "runs", "tool_calls", "answers", "flow_marks", "transcripts", "gaps", "seen")
# The service's first pass comes this long after its start at most (then every prune_interval_s).
FIRST_PASS_S: Final = 60.0


class Reply(NamedTuple):
    """What a statement gave: its rows (none for a write) and how many rows it changed."""

    rows: list[tuple[Any, ...]]
    rowcount: int


Query = tuple[str, Sequence[Any]]
Script = Generator[Query, Reply, T]


@dataclass(frozen=True, slots=True)
class Retention:
    """``[store.retention]`` in seconds; ``batch_rows`` per transaction, ``pause_s`` between two."""

    done_s: float = 30 * DAY_S
    failed_s: float = 90 * DAY_S
    runs_s: float = 90 * DAY_S
    transcript_s: float = 30 * DAY_S
    answered_s: float = 365 * DAY_S
    gaps_s: float = 90 * DAY_S
    dedup_s: float = 365 * DAY_S
    batch_rows: int = 500
    pause_s: float = 0.05

    @classmethod
    def from_config(cls, config: RetentionConfig) -> Retention:
        return cls(
            done_s=config.done_days * DAY_S,
            failed_s=config.failed_days * DAY_S,
            runs_s=config.runs_days * DAY_S,
            transcript_s=config.transcript_days * DAY_S,
            answered_s=config.answered_days * DAY_S,
            gaps_s=config.gaps_days * DAY_S,
            dedup_s=config.dedup_days * DAY_S,
            batch_rows=config.batch_rows,
            pause_s=config.batch_pause_s,
        )

    def cutoffs(self, now: datetime | None = None) -> Cutoffs:
        moment = now or utc_now()

        def before(seconds: float) -> str:
            return iso(moment - timedelta(seconds=seconds))

        return Cutoffs(
            now=iso(moment),
            done=before(self.done_s),
            failed=before(self.failed_s),
            runs=before(self.runs_s),
            transcript=before(self.transcript_s),
            answered=before(self.answered_s),
            gaps=before(self.gaps_s),
            dedup=before(self.dedup_s),
        )


@dataclass(frozen=True, slots=True)
class Cutoffs:
    """ISO times: what ended (or was made) before each is old enough to go."""

    now: str
    done: str
    failed: str
    runs: str
    transcript: str
    answered: str
    gaps: str
    dedup: str

    @property
    def events(self) -> str:
        """No event received at or after this can be old enough (it ended after it was received)."""
        return max(self.done, self.failed)


@dataclass(slots=True)
class PruneReport:
    """What a prune deleted (or, dry, would): rows per table, transcripts cleared, dedup keys kept."""

    dry_run: bool
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    keys_kept: int = 0
    batches: int = 0
    seconds: float = 0.0
    reclaimed_bytes: int = 0
    skipped: str | None = None  # why nothing was done (another process is pruning)
    # A dry run's events counted as deleted (their runs' transcripts are not counted as cleared too).
    gone: set[int] = field(default_factory=set)

    def add(self, counts: dict[str, int]) -> None:
        for table, count in counts.items():
            self.counts[table] = self.counts.get(table, 0) + count

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "deleted": {t: n for t, n in self.counts.items() if t != "transcripts"},
            "transcripts_cleared": self.counts.get("transcripts", 0),
            "dedup_keys_kept": self.keys_kept,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "reclaimed_bytes": self.reclaimed_bytes,
            "skipped": self.skipped,
        }


Progress = Callable[[str, PruneReport], None]


class PruneTarget(Protocol):
    """One backend's side of a prune (``sqlite.retention.SqlitePruneTarget``,
    ``postgres.retention.PostgresPruneTarget``)."""

    dialect: Dialect

    async def run(self, script: Script[T], *, write: bool) -> T:
        """``script``'s statements in one transaction (a write one when ``write``); its result."""
        ...

    def exclusive(self) -> AbstractAsyncContextManager[bool]:
        """Held for a pass: False when another process is pruning the same store (skip this pass)."""
        ...

    async def reclaim(self, pause_s: float) -> int:
        """Give the space pruning freed back where the engine does it on its own terms; bytes given back."""
        ...

    async def vacuum(self) -> int:
        """Compact the whole store (``agentwake store prune --vacuum``); bytes given back."""
        ...

    async def storage(self) -> dict[str, Any]:
        """The store's size and oldest kept event (``storage_view``)."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the backends' SQL here: how a batch's rows are locked (PostgreSQL)."""

    lock_events: str = ""


# ---- the batches ------------------------------------------------------------------------------------


def _marks(values: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(values))


_WINDOW_SQL: Final = "SELECT id, {at} FROM {table} WHERE id > %s ORDER BY id LIMIT %s"

_PRUNABLE_SQL: Final = (
    "SELECT e.id FROM events e WHERE e.id >= %s AND e.id <= %s{only} AND ("
    f"(e.state IN {_FINAL_SQL} AND e.state_changed_at < %s) OR (e.state = 'failed' AND e.state_changed_at < %s))"
    " AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.event_row = e.id"
    " AND (r.status = 'running' OR r.started_at >= %s))"
    " AND NOT EXISTS (SELECT 1 FROM answers a WHERE a.event_row = e.id AND a.at >= %s)"
    " ORDER BY e.id{lock}"
)


def _prunable(low: int, high: int, cut: Cutoffs, only: Sequence[int] = (), lock: str = "") -> Query:
    restrict = f" AND e.id IN ({_marks(only)})" if only else ""
    return (
        _PRUNABLE_SQL.format(only=restrict, lock=lock),
        [low, high, *only, cut.done, cut.failed, cut.runs, cut.answered],
    )


@dataclass(frozen=True, slots=True)
class Window:
    """One window of ids walked: the last id in it, whether the walk ends with it, what to prune."""

    last: int
    final: bool
    ids: list[int]
    keys: int = 0


def remember_events(after: int, cut: Cutoffs, rows: int, *, dry: bool) -> Script[Window | None]:
    """The next window of events after id ``after``: which are old enough to go, their keys put in
    seen (committed before they are deleted: see the module docstring). None: no event after it."""
    window = (yield (_WINDOW_SQL.format(at="received_at", table="events"), [after, rows])).rows
    if not window:
        return None
    last, newest = int(window[-1][0]), str(window[-1][1])
    final = len(window) < rows or newest >= cut.events
    ids = [int(r[0]) for r in (yield _prunable(after + 1, last, cut)).rows]
    keys = len(ids)
    if ids and not dry:
        keys = (
            yield (
                "INSERT INTO seen (server, name, event_id, at) SELECT server, name, event_id, %s FROM events"
                f" WHERE id IN ({_marks(ids)}) ON CONFLICT DO NOTHING",
                [cut.now, *ids],
            )
        ).rowcount
    return Window(last, final, ids, max(keys, 0))


def delete_events(ids: Sequence[int], cut: Cutoffs, dialect: Dialect, *, dry: bool) -> Script[dict[str, int]]:
    """Delete these events (those still old enough: one may have been retried meanwhile) with their
    runs, tool calls, answers and flow marks; rows per table."""
    if not ids:
        return {}
    kept = [int(r[0]) for r in (yield _prunable(min(ids), max(ids), cut, ids, dialect.lock_events)).rows]
    if not kept:
        return {}
    marks = _marks(kept)
    runs = f"SELECT id FROM runs WHERE event_row IN ({marks})"
    statements = (
        ("tool_calls", f"tool_calls WHERE run_id IN ({runs})"),
        ("runs", f"runs WHERE event_row IN ({marks})"),
        ("answers", f"answers WHERE event_row IN ({marks})"),
        ("flow_marks", f"flow_marks WHERE event_row IN ({marks})"),
        ("events", f"events WHERE id IN ({marks})"),
    )
    counts: dict[str, int] = {}
    for table, rest in statements:
        if dry:
            counts[table] = int((yield (f"SELECT count(*) FROM {rest}", kept)).rows[0][0])
        else:
            counts[table] = max((yield (f"DELETE FROM {rest}", kept)).rowcount, 0)
    return counts


def clear_transcripts(
    after: int, cut: Cutoffs, rows: int, *, dry: bool, gone: AbstractSet[int] = frozenset()
) -> Script[tuple[Window | None, int]]:
    """The next window of runs whose transcript is still there: clear those old enough whose event is
    over (never a running run's, nor a failed or dead event's: a retry resumes from them). ``gone``:
    the events a dry run counted as deleted (their runs go with them, nothing to clear)."""
    window = (
        yield (
            "SELECT r.id, r.started_at, r.status, e.state, e.id FROM runs r JOIN events e ON e.id = r.event_row"
            " WHERE r.cleared_at IS NULL AND r.id > %s ORDER BY r.id LIMIT %s",
            [after, rows],
        )
    ).rows
    if not window:
        return None, 0
    last, newest = int(window[-1][0]), str(window[-1][1])
    ids = [
        int(r[0])
        for r in window
        if str(r[1]) < cut.transcript and r[2] != "running" and r[3] in FINAL_STATES and int(r[4]) not in gone
    ]
    final = len(window) < rows or newest >= cut.transcript
    if not ids:
        return Window(last, final, []), 0
    if dry:
        return Window(last, final, ids), len(ids)
    marks = _marks(ids)
    cleared = (
        yield (
            "UPDATE runs SET system_prompt = NULL, user_prompt = NULL, messages = '[]', cleared_at = %s"
            f" WHERE id IN ({marks}) AND cleared_at IS NULL AND status <> 'running' AND EXISTS"
            f" (SELECT 1 FROM events e WHERE e.id = runs.event_row AND e.state IN {_FINAL_SQL})",
            [cut.now, *ids],
        )
    ).rowcount
    yield (
        f"UPDATE tool_calls SET arguments = NULL, result = NULL, reply = NULL WHERE run_id IN ({marks})",
        ids,
    )
    return Window(last, final, ids), max(cleared, 0)


def delete_aged(
    table: str, at: str, after: int, cutoff: str, rows: int, *, dry: bool
) -> Script[tuple[Window | None, int]]:
    """The next window of ``table`` (flow_marks, gaps: ids follow time): delete its rows made before ``cutoff``."""
    window = (yield (_WINDOW_SQL.format(at=at, table=table), [after, rows])).rows
    if not window:
        return None, 0
    last, newest = int(window[-1][0]), str(window[-1][1])
    final = len(window) < rows or newest >= cutoff
    rest = f"{table} WHERE id > %s AND id <= %s AND {at} < %s"
    if dry:
        count = int((yield (f"SELECT count(*) FROM {rest}", [after, last, cutoff])).rows[0][0])
    else:
        count = max((yield (f"DELETE FROM {rest}", [after, last, cutoff])).rowcount, 0)
    return Window(last, final, []), count


def expire_keys(cutoff: str, rows: int, *, dry: bool) -> Script[int]:
    """Delete up to ``rows`` dedup keys pruned before ``cutoff`` (dry: count them all); how many."""
    if dry:
        return int((yield ("SELECT count(*) FROM seen WHERE at < %s", [cutoff])).rows[0][0])
    reply = yield (
        "DELETE FROM seen WHERE (server, name, event_id) IN"
        " (SELECT server, name, event_id FROM seen WHERE at < %s ORDER BY at LIMIT %s)",
        [cutoff, rows],
    )
    return max(reply.rowcount, 0)


# ---- a pass -----------------------------------------------------------------------------------------


async def prune(
    target: PruneTarget,
    retention: Retention,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
    progress: Progress | None = None,
) -> PruneReport:
    """One pass over the store: everything ``retention`` says may go, in batches. Dry: only counted."""
    started = time.monotonic()
    report = PruneReport(dry_run=dry_run)
    async with target.exclusive() as mine:
        if not mine:
            report.skipped = "another process is pruning this store"
            return report
        await _prune(target, retention, retention.cutoffs(now), report, progress)
    report.seconds = time.monotonic() - started
    return report


async def _prune(
    target: PruneTarget, retention: Retention, cut: Cutoffs, report: PruneReport, progress: Progress | None
) -> None:
    dry, rows, write = report.dry_run, retention.batch_rows, not report.dry_run

    async def step(table: str, changed: int) -> None:
        report.batches += 1
        if progress is not None:
            progress(table, report)
        # A pause after each write lets deliveries and claims in; a dry pass only reads.
        await anyio.sleep(retention.pause_s if changed and write else 0)

    after = 0
    while True:
        window = await target.run(remember_events(after, cut, rows, dry=dry), write=write)
        if window is None:
            break
        report.keys_kept += window.keys
        counts = await target.run(delete_events(window.ids, cut, target.dialect, dry=dry), write=write)
        if dry:
            report.gone.update(window.ids)
        report.add(counts)
        await step("events", sum(counts.values()))
        after = window.last
        if window.final:
            break
    after = 0
    while True:
        found, cleared = await target.run(
            clear_transcripts(after, cut, rows, dry=dry, gone=report.gone), write=write
        )
        if found is None:
            break
        report.add({"transcripts": cleared})
        await step("transcripts", cleared)
        after = found.last
        if found.final:
            break
    for table, at, cutoff in (("flow_marks", "at", cut.done), ("gaps", "detected_at", cut.gaps)):
        after = 0
        while True:
            found, count = await target.run(delete_aged(table, at, after, cutoff, rows, dry=dry), write=write)
            if found is None:
                break
            report.add({table: count})
            await step(table, count)
            after = found.last
            if found.final:
                break
    while True:
        count = await target.run(expire_keys(cut.dedup, rows, dry=dry), write=write)
        report.add({"seen": count})
        await step("seen", count)
        if dry or count < rows:
            break


# ---- opening a target, and the service's pruner ---------------------------------------------------


async def open_target(config: StoreConfig, store: Store | None = None) -> PruneTarget:
    """The configured store as a prune target. SQLite: a connection of its own (its batches run
    beside the service's store thread, not in it); PostgreSQL: ``store``'s pool if given."""
    if config.url is not None:
        from agentwake.store import open_store
        from agentwake.store.postgres import PostgresStore
        from agentwake.store.postgres.retention import PostgresPruneTarget

        if isinstance(store, PostgresStore):
            return PostgresPruneTarget(store, owned=False)
        opened = await open_store(config, create=False)
        assert isinstance(opened, PostgresStore)
        return PostgresPruneTarget(opened, owned=True)
    from agentwake.store.sqlite.retention import SqlitePruneTarget

    return await SqlitePruneTarget.open(config.path)


def summary(report: PruneReport) -> str:
    """``events 1200, runs 800, ...``: the non-zero counts of a report."""
    parts = [f"{table} {count}" for table, count in report.counts.items() if count]
    return ", ".join(parts) or "nothing"


async def keep_pruned(config: StoreConfig, store: Store, *, first_pass_s: float = FIRST_PASS_S) -> None:
    """The service's pruner: a pass within ``first_pass_s`` of the start, then every
    ``prune_interval_s``, until cancelled. A failed pass is logged and tried again at the next."""
    settings = config.retention
    retention = Retention.from_config(settings)
    target = await open_target(config, store)
    try:
        await anyio.sleep(min(first_pass_s, settings.prune_interval_s))
        while True:
            try:
                report = await prune(target, retention)
                if report.total:
                    report.reclaimed_bytes = await target.reclaim(retention.pause_s)
                    logger.info(
                        "store pruned in %.1f s: %s deleted (dedup keys kept: %d)%s",
                        report.seconds,
                        summary(report),
                        report.keys_kept,
                        f"; {report.reclaimed_bytes} bytes given back" if report.reclaimed_bytes else "",
                    )
            except StoreError as exc:
                logger.warning(
                    "pruning the store failed (tried again in %g s): %s", settings.prune_interval_s, exc
                )
            await anyio.sleep(settings.prune_interval_s)
    finally:
        with anyio.CancelScope(shield=True):
            await target.close()
