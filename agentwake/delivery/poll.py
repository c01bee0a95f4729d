"""The poll loop of one subscription, as the spec's Poll-Based Delivery describes.

Null cursor to bootstrap, then the persisted cursor; ``hasMore`` polls again at
once; otherwise wait ``nextPollMs`` but never less than ``poll_floor_ms``.
``maxAgeMs`` goes with the first poll after a (re)start. Each batch and its
cursor are stored in one transaction, in order; while a batch commits, the next
poll (after ``hasMore``) is already on its way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import anyio
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from agentwake import protocol
from agentwake.backoff import tenacity_wait
from agentwake.config import SubscriptionConfig
from agentwake.delivery.common import PROGRESS_EVERY, RETRY_INITIAL_S, RETRY_MAX_S, Sleep, subscription_key
from agentwake.errors import TransientEventsError
from agentwake.mcp import ServerConnection
from agentwake.store import IncomingEvent, Store, SubscriptionKey

logger = logging.getLogger(__name__)

DEFAULT_NEXT_POLL_MS: Final = 5_000


def next_delay_ms(result: protocol.PollPage, floor_ms: int) -> int:
    """How long to wait before the next poll. Zero when the server has more."""
    if result.has_more:
        return 0
    suggested = result.next_poll_ms if result.next_poll_ms is not None else DEFAULT_NEXT_POLL_MS
    return max(suggested, floor_ms)


@dataclass
class _Prefetch:
    result: protocol.PollPage | None = None
    error: Exception | None = None


@dataclass
class PollLoop:
    subscription: SubscriptionConfig
    connection: ServerConnection
    store: Store
    on_new_events: Callable[[int], None] = lambda count: None
    sleep: Sleep = anyio.sleep
    retry_initial_s: float = RETRY_INITIAL_S
    retry_max_s: float = RETRY_MAX_S
    polls: int = field(default=0, init=False)
    _drained: int = field(default=0, init=False)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Poll until cancelled. SubscriptionEnded and ConnectionLost propagate to the caller."""
        sub = self.subscription
        key = subscription_key(sub)
        cursor = await self.store.register(key)
        await self.store.set_state(sub.name, status="active", mode="poll")
        resuming = cursor is not None
        logger.info(
            "subscription %s: polling %s on %s from %s",
            sub.name,
            sub.event,
            sub.server,
            f"cursor {cursor}" if resuming else "now (bootstrap)",
        )
        task_status.started()
        result = await self._poll_with_retry(self._params(cursor, resuming=resuming))
        while True:
            self.polls += 1
            # With hasMore the next poll goes out now, so the server reads the next
            # batch while this one commits. Batches are still stored strictly in order,
            # and the next result (or its error) is only taken after this commit.
            prefetch = _Prefetch() if result.has_more else None
            failure: Exception | None = None
            async with anyio.create_task_group() as tg:
                if prefetch is not None:
                    tg.start_soon(self._prefetch, self._params(result.cursor, resuming=False), prefetch)
                try:
                    await self._store_batch(key, result, cursor)
                except Exception as exc:  # re-raised outside the task group, unwrapped
                    failure = exc
                    tg.cancel_scope.cancel()
            if failure is not None:
                raise failure
            # Absent or null means no replay position: poll with null next time, persist nothing.
            cursor = result.cursor
            if prefetch is not None:
                if prefetch.error is not None:
                    raise prefetch.error
                assert prefetch.result is not None
                result = prefetch.result
                continue
            delay_ms = next_delay_ms(result, sub.poll_floor_ms)
            if delay_ms:
                await self.sleep(delay_ms / 1000)
            result = await self._poll_with_retry(self._params(cursor, resuming=False))

    def _params(self, cursor: str | None, *, resuming: bool) -> protocol.PollParams:
        sub = self.subscription
        return protocol.PollParams(
            name=sub.event,
            arguments=sub.arguments or None,
            cursor=cursor,
            max_events=sub.max_events,
            max_age_ms=sub.max_age_ms if resuming else None,
        )

    async def _prefetch(self, params: protocol.PollParams, slot: _Prefetch) -> None:
        try:
            slot.result = await self._poll_with_retry(params)
        except Exception as exc:  # handed to the loop in order, after the batch before it is stored
            slot.error = exc

    async def _store_batch(self, key: SubscriptionKey, result: protocol.PollPage, cursor: str | None) -> None:
        sub = self.subscription
        batch = [
            IncomingEvent(e["eventId"], e["name"], e["timestamp"], e["data"], e.get("_meta"))
            for e in result.events
        ]
        ingest = await self.store.ingest(
            key, batch, result.cursor, truncated=result.truncated, cursor_before=cursor
        )
        if result.truncated:
            logger.warning(
                "subscription %s: gap: the server skipped events (truncated); now at cursor %s",
                sub.name,
                result.cursor,
            )
        if ingest.duplicates:
            logger.info("subscription %s: %d duplicate event(s) ignored", sub.name, ingest.duplicates)
        if ingest.inserted:
            logger.debug("subscription %s: %d new event(s)", sub.name, ingest.inserted)
            self.on_new_events(ingest.inserted)
        self._report_progress(ingest.inserted + ingest.duplicates, result.has_more)

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
                )
        elif self._drained:
            logger.info(
                "subscription %s: caught up after draining %d events",
                self.subscription.name,
                self._drained + received,
            )
            self._drained = 0

    async def _poll_with_retry(self, params: protocol.PollParams) -> protocol.PollPage:
        sub = self.subscription

        async def note_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            logger.warning("subscription %s: %s; retrying in %.1fs", sub.name, exc, delay)
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
                return await self.connection.poll(params, subscription=sub.name)
        raise AssertionError("unreachable: tenacity either returns or raises")
