"""The store: the seam every stage writes through (subscriptions and cursors, the inbox, webhook
secrets, the work queue, the action log).

``Store`` (a Protocol, in ``interface``) is what callers use; ``records`` holds the
values that cross it. ``open_store`` opens the configured backend: SQLite
(``agentwake.store.sqlite``) today.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentwake.store.interface import Store, StoreReader
from agentwake.store.records import (
    EVENT_STATES,
    EventState,
    EventVerdict,
    FlowGate,
    FlowOutcome,
    InboxEvent,
    IncomingEvent,
    IngestResult,
    JournaledCall,
    RejectedEvent,
    ResumePoint,
    RetiredWebhook,
    RunKind,
    RunProgress,
    RunStatus,
    Settlement,
    SubscriptionKey,
    ToolCallRecord,
    ToolCallStatus,
    WebhookDelivery,
    WebhookRecord,
    final_answer,
    summary_line,
)

if TYPE_CHECKING:
    from pathlib import Path

    from agentwake.config import StoreConfig


async def open_store(config: StoreConfig, *, create: bool = True) -> Store:
    """The configured store, open and migrated. ``create=False`` (the CLI's readers) refuses a missing one."""
    from agentwake.store.sqlite import SqliteStore

    return await SqliteStore.open(config.path, synchronous=config.synchronous, create=create)


def open_reader(path: Path) -> StoreReader:
    """The store at ``path`` for reading, synchronously (no event loop, no writer thread); never created."""
    from agentwake.store.sqlite import SqliteCore

    return SqliteCore.open(path, create=False)


__all__ = [
    "EVENT_STATES",
    "EventState",
    "EventVerdict",
    "FlowGate",
    "FlowOutcome",
    "InboxEvent",
    "IncomingEvent",
    "IngestResult",
    "JournaledCall",
    "RejectedEvent",
    "ResumePoint",
    "RetiredWebhook",
    "RunKind",
    "RunProgress",
    "RunStatus",
    "Settlement",
    "Store",
    "StoreReader",
    "SubscriptionKey",
    "ToolCallRecord",
    "ToolCallStatus",
    "WebhookDelivery",
    "WebhookRecord",
    "final_answer",
    "open_reader",
    "open_store",
    "summary_line",
]
