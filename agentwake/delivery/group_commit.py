"""The webhook receiver's group commit: deliveries that arrive together share one transaction.

Each request waits on its own future until the batch holding its delivery is committed (or was not:
then it is answered 503 and the sender retries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from agentwake import metrics
from agentwake.errors import StoreError
from agentwake.store import IngestResult, Store, WebhookDelivery

logger = logging.getLogger("agentwake.delivery.receiver")


class GroupCommit:
    """Deliveries that arrive together are committed together: one transaction, one thread hop.

    Each waiting request holds an asyncio future (aiohttp runs on asyncio only); the
    committer resolves it with the delivery's result, or None when it was not stored.
    A shared future per batch would be cheaper, but cancelling one waiter would cancel it for all.
    """

    def __init__(self, store: Store, on_committed: Callable[[list[IngestResult]], None]) -> None:
        self._store = store
        self._on_committed = on_committed
        self._deliveries: list[WebhookDelivery] = []
        self._futures: list[asyncio.Future[IngestResult | None]] = []
        self._ready = anyio.Event()
        self._open = False

    @property
    def backlog(self) -> int:
        return len(self._deliveries)

    def submit(self, delivery: WebhookDelivery) -> Awaitable[IngestResult | None]:
        """Queue one delivery for the next commit; awaiting gives None if it was not stored (503)."""
        future: asyncio.Future[IngestResult | None] = asyncio.get_running_loop().create_future()
        if not self._open:
            future.set_result(None)
            return future
        if not self._deliveries:
            self._ready.set()
        self._deliveries.append(delivery)
        self._futures.append(future)
        return future

    @staticmethod
    def _answer(
        futures: list[asyncio.Future[IngestResult | None]], results: list[IngestResult] | None
    ) -> None:
        if results is None:
            for future in futures:
                if not future.done():
                    future.set_result(None)
            return
        for future, result in zip(futures, results, strict=True):
            if not future.done():  # its request was cancelled; the event is stored all the same
                future.set_result(result)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._open = True
        task_status.started()
        futures: list[asyncio.Future[IngestResult | None]] = []
        try:
            while True:
                await self._ready.wait()
                self._ready = anyio.Event()
                deliveries, futures = self._deliveries, self._futures
                self._deliveries, self._futures = [], []
                if not deliveries:
                    continue
                results: list[IngestResult] | None
                try:
                    results = await self._store.ingest_deliveries(deliveries)
                except (
                    Exception
                ) as exc:  # a failed write costs its batch a 503 (senders retry), not the receiver
                    if isinstance(exc, StoreError):
                        logger.error(
                            "webhook receiver: %d delivery(ies) not stored: %s", len(deliveries), exc
                        )
                    else:
                        logger.exception("webhook receiver: %d delivery(ies) not stored", len(deliveries))
                    results = None
                self._answer(futures, results)
                futures = []
                if results is not None:
                    observe_committed(deliveries, results)
                    self._on_committed(results)
        finally:
            # Whatever was not committed is answered 503 and retried by the sender.
            self._open = False
            self._answer(futures, None)
            self._answer(self._futures, None)
            self._deliveries, self._futures = [], []


def observe_committed(deliveries: list[WebhookDelivery], results: list[IngestResult]) -> None:
    """A committed batch in the metrics: events and duplicates per subscription, and its new gaps."""
    tallies: dict[str, list[int]] = {}
    for delivery, result in zip(deliveries, results, strict=True):
        tally = tallies.setdefault(delivery.key.name, [0, 0])
        tally[0] += result.inserted
        tally[1] += result.duplicates
        # A gap envelope answered as a duplicate was recorded before; a refused event always makes one.
        if (delivery.truncated and not result.duplicates) or delivery.rejected is not None:
            metrics.observe_gap(delivery.key.name)
    for name, (inserted, duplicates) in tallies.items():
        metrics.observe_ingest(name, "webhook", inserted, duplicates)
