"""The poll loop of one subscription, as the spec's Poll-Based Delivery describes.

Null cursor to bootstrap, then the persisted cursor; ``hasMore`` polls again at
once; otherwise wait ``nextPollMs`` (clamped to ``[poll_floor_ms, max_next_poll_ms]``).
``maxAgeMs`` goes with the first poll after a (re)start. Each batch and its
cursor are stored in one transaction, in order; while a batch commits, the next
poll (after ``hasMore``) is already on its way.

A server is untrusted (see ``admit``): its events are admitted one by one (a refused one
is stored as a 'rejected' summary with a gap, and the loop moves on), and ``hasMore``
on a page that brought nothing waits the floor like any quiet page, so a server cannot
make agentwake spin. Gaps are logged once, then summarised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from agentwake import metrics, protocol
from agentwake.backoff import tenacity_wait
from agentwake.config import LimitsConfig, SubscriptionConfig
from agentwake.delivery.admit import Admitted, MalformedPage, Page, admit_all, read_page
from agentwake.delivery.backlog import Backlog
from agentwake.delivery.common import (
    CURSOR_SHOWN,
    PROGRESS_EVERY,
    QUIET_WRITE_S,
    RETRY_INITIAL_S,
    RETRY_MAX_S,
    STALLED_AFTER_FAILURES,
    DeferredWrites,
    KnownEvents,
    QuietFlusher,
    Sleep,
    Summary,
    shown_cursor,
    subscription_key,
)
from agentwake.errors import TransientEventsError
from agentwake.logs import event_fields
from agentwake.mcp import ServerConnection
from agentwake.store import Store, SubscriptionKey
from agentwake.text import peer

logger = logging.getLogger(__name__)

DEFAULT_NEXT_POLL_MS: Final = 5_000


def next_delay_ms(page: Page, floor_ms: int, *, progressed: bool = True) -> int:
    """How long to wait before the next poll: none when the server has more and this page brought
    something; else its (clamped) nextPollMs, never less than the floor."""
    if page.has_more and progressed:
        return 0
    suggested = page.next_poll_ms if page.next_poll_ms is not None else DEFAULT_NEXT_POLL_MS
    return max(suggested, floor_ms)


@dataclass
class _Polled:
    page: Page
    admitted: Admitted

    @property
    def progressed(self) -> bool:
        return bool(self.admitted.events or self.admitted.rejected)

    @property
    def goes_on(self) -> bool:
        """The server has more and this page brought some of it: poll again at once."""
        return self.page.has_more and self.progressed


@dataclass
class _Prefetch:
    result: _Polled | None = None
    error: Exception | None = None


@dataclass(slots=True)
class PollLoop:
    subscription: SubscriptionConfig
    connection: ServerConnection
    store: Store
    on_new_events: Callable[[int], None] = lambda count: None
    sleep: Sleep = anyio.sleep
    # The wait between polls (None: ``sleep``); the supervisor's wakes quiet loops together (PollTicks).
    idle_sleep: Sleep | None = None
    retry_initial_s: float = RETRY_INITIAL_S
    retry_max_s: float = RETRY_MAX_S
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    # The lease this process drives the subscription under (agentwake.ownership); None: unfenced.
    fence: int | None = None
    # Shared by the loops of one store (the supervisor's); a loop alone knows what it stored itself.
    known: KnownEvents = field(default_factory=KnownEvents)
    # Writes what the loops of one store held back (the supervisor's); a loop alone runs its own,
    # every quiet_write_s (0: nothing is held back).
    flusher: QuietFlusher | None = None
    quiet_write_s: float = QUIET_WRITE_S
    # The bound on undecided events (the supervisor's, shared by its loops); None: unbounded.
    backlog: Backlog | None = None
    polls: int = field(default=0, init=False)
    _drained: int = field(default=0, init=False)
    _gaps: Summary = field(default_factory=Summary, init=False)
    _writes: DeferredWrites = field(init=False)

    def __post_init__(self) -> None:
        flusher = self.flusher or QuietFlusher(self.store, self.quiet_write_s)
        self._writes = DeferredWrites(self.known, flusher)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll until cancelled. SubscriptionEnded and ConnectionLost propagate to the caller."""
        sub = self.subscription
        key = subscription_key(sub)
        cursor = await self.store.register(key, fence=self.fence)
        await self.store.set_state(sub.name, status="active", mode="poll")
        resuming = cursor is not None
        logger.info(
            "subscription %s: polling %s on %s from %s",
            sub.name,
            sub.event,
            sub.server,
            f"cursor {peer(cursor, CURSOR_SHOWN)}" if resuming else "now (bootstrap)",
            extra=event_fields(subscription=sub.name, server=sub.server),
        )
        task_status.started()
        self._writes.reset()
        try:
            if self.flusher is None:
                await self._writes.flusher.alongside(
                    partial(self._poll_forever, key, cursor, resuming=resuming)
                )
            else:
                await self._poll_forever(key, cursor, resuming=resuming)
        finally:
            await self._writes.save(self.store, key, logger, fence=self.fence)

    async def _poll_forever(self, key: SubscriptionKey, cursor: str | None, *, resuming: bool) -> None:
        sub = self.subscription
        await self._room()
        result = await self._poll_with_retry(self._params(cursor, resuming=resuming))
        while True:
            self.polls += 1
            # With hasMore the next poll goes out now, so the server reads the next
            # batch while this one commits. Batches are still stored strictly in order,
            # and the next result (or its error) is only taken after this commit.
            prefetch: _Prefetch | None = None
            if result.goes_on and not await self._held_back():
                prefetch = await self._store_while_prefetching(key, result, cursor)
            else:
                # Nothing to overlap with the commit, so no task group: the quiet poll, every poll interval.
                await self._store_batch(key, result, cursor)
            # Absent or null means no replay position: poll with null next time, persist nothing.
            cursor = result.page.cursor
            if prefetch is not None:
                if prefetch.error is not None:
                    raise prefetch.error
                if prefetch.result is not None:
                    result = prefetch.result
                    continue
                # The prefetch was cut short (the service is stopping): poll again, which sees the stop.
            delay_ms = next_delay_ms(result.page, sub.poll_floor_ms, progressed=result.progressed)
            if delay_ms:
                await (self.idle_sleep or self.sleep)(delay_ms / 1000)
            await self._room()
            result = await self._poll_with_retry(self._params(cursor, resuming=False))

    async def _held_back(self) -> bool:
        return self.backlog is not None and await self.backlog.over(self.subscription.name)

    async def _room(self) -> None:
        """Poll only while the subscription holds fewer undecided events than its bound."""
        if self.backlog is not None:
            await self.backlog.wait_for_room(self.subscription.name)

    async def _store_while_prefetching(
        self, key: SubscriptionKey, result: _Polled, cursor: str | None
    ) -> _Prefetch:
        """Store ``result`` while the poll after it is on its way; its outcome is in the slot returned."""
        prefetch = _Prefetch()
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._prefetch, self._params(result.page.cursor, resuming=False), prefetch)
            try:
                await self._store_batch(key, result, cursor)
            except Exception as exc:  # re-raised outside the task group, unwrapped
                failure = exc
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return prefetch

    def _params(self, cursor: str | None, *, resuming: bool) -> dict[str, Any]:
        """events/poll's params as sent (``protocol.PollParams``'s wire form): a null cursor and the
        bounds not set are left out. Built as a dict: a quiet poll's model would cost more than it."""
        sub = self.subscription
        params: dict[str, Any] = {"name": sub.event, "arguments": dict(sub.arguments)}
        if cursor is not None:
            params["cursor"] = cursor
        if resuming and sub.max_age_ms is not None:
            params["maxAgeMs"] = sub.max_age_ms
        if sub.max_events is not None:
            params["maxEvents"] = sub.max_events
        return params

    async def _prefetch(self, params: dict[str, Any], slot: _Prefetch) -> None:
        try:
            slot.result = await self._poll_with_retry(params)
        except Exception as exc:  # handed to the loop in order, after the batch before it is stored
            slot.error = exc

    async def _store_batch(self, key: SubscriptionKey, result: _Polled, cursor: str | None) -> None:
        sub = self.subscription
        page, admitted = result.page, result.admitted
        gap = page.truncated or bool(admitted.rejected)
        writes = self._writes
        if writes.can_wait(key, admitted.events, page.cursor, gap=gap, fence=self.fence):
            metrics.observe_ingest(sub.name, "poll", 0, len(admitted.events), gap=False)
            return
        events, held_cursor, held = await writes.take(admitted.events)
        ingest = await self.store.ingest(
            key,
            events,
            page.cursor if page.cursor is not None else held_cursor,
            truncated=page.truncated,
            cursor_before=cursor,
            rejected=admitted.rejected,
            fence=self.fence,
        )
        writes.written(sub.server, events)
        metrics.observe_ingest(sub.name, "poll", ingest.inserted, ingest.duplicates - held, gap=gap)
        if self.backlog is not None:
            self.backlog.stored(sub.name, ingest.inserted)
        if page.truncated:
            self._gaps.note(
                logger,
                f"subscription {sub.name}: gap: the server kept no history back to cursor"
                f" {peer(cursor, self.limits.max_peer_text_chars)} (it restarted without a durable log,"
                " or the events aged out), so events in between may be missing; resumed at"
                f" {shown_cursor(page.cursor, self.limits.max_peer_text_chars)}",
            )
        for refused in admitted.rejected:
            self._gaps.note(
                logger,
                f"subscription {sub.name}: event {peer(refused.event_id, 80)} rejected ({refused.reason});"
                " stored as a 'rejected' summary, with a gap",
            )
        if ingest.duplicates:
            logger.info(
                "subscription %s: %d duplicate event(s) ignored",
                sub.name,
                ingest.duplicates,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
        if ingest.inserted:
            logger.debug(
                "subscription %s: %d new event(s)",
                sub.name,
                ingest.inserted,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
            self.on_new_events(ingest.inserted)
        self._report_progress(ingest.inserted + ingest.duplicates, page.has_more)

    def _report_progress(self, received: int, has_more: bool) -> None:
        """Log a long backlog drain as it goes, and once when it has caught up."""
        if has_more:
            before = self._drained
            self._drained += received
            if self._drained // PROGRESS_EVERY > before // PROGRESS_EVERY:
                logger.info(
                    "subscription %s: draining backlog, %d events so far",
                    self.subscription.name,
                    self._drained,
                    extra=event_fields(subscription=self.subscription.name, server=self.subscription.server),
                )
        elif self._drained:
            logger.info(
                "subscription %s: caught up after draining %d events",
                self.subscription.name,
                self._drained + received,
                extra=event_fields(subscription=self.subscription.name, server=self.subscription.server),
            )
            self._drained = 0

    async def _poll(self, params: dict[str, Any]) -> _Polled:
        sub = self.subscription
        raw = await self.connection.poll(params, subscription=sub.name)
        try:
            page = read_page(raw, floor_ms=sub.poll_floor_ms, ceiling_ms=self.limits.max_next_poll_ms)
        except MalformedPage as exc:
            raise TransientEventsError(
                protocol.METHOD_POLL,
                protocol.INTERNAL_ERROR,
                f"malformed result: {exc}",
                server=sub.server,
                subscription=sub.name,
            ) from None
        return _Polled(page, admit_all(page.events, sub.event, self.limits))

    async def _poll_with_retry(self, params: dict[str, Any]) -> _Polled:
        try:
            # Most polls succeed: tenacity's set-up (some 60 calls, 5% of a quiet poll) only after a failure.
            return await self._poll(params)
        except TransientEventsError as exc:
            first_failure: TransientEventsError | None = exc
        sub = self.subscription
        failures = 0

        async def note_retry(state: RetryCallState) -> None:
            nonlocal failures
            failures += 1
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            logger.warning(
                "subscription %s: %s; retrying in %.1fs",
                sub.name,
                exc,
                delay,
                extra=event_fields(subscription=sub.name, server=sub.server),
            )
            self._writes.quiet.failed()
            if failures >= STALLED_AFTER_FAILURES:
                await self.store.set_state(sub.name, status="stalled", error=str(exc))
            else:
                await self.store.record_error(sub.name, str(exc))

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientEventsError),
            wait=tenacity_wait(initial_s=self.retry_initial_s, max_s=self.retry_max_s),
            stop=stop_never,
            sleep=self.sleep,
            before_sleep=note_retry,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if first_failure is not None:  # the failure above, as tenacity's first attempt
                    failed, first_failure = first_failure, None
                    raise failed
                return await self._poll(params)
        raise AssertionError("unreachable: tenacity either returns or raises")
