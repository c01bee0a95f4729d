"""The store: the seam every stage writes through (subscriptions and cursors, the inbox, webhook
secrets, the work queue, the action log).

``Store`` (a Protocol, in ``interface``) is what callers use; ``records`` holds the
values that cross it. ``open_store`` opens the configured backend: SQLite
(``agentwake.store.sqlite``), or PostgreSQL (``agentwake.store.postgres``) when ``[store] url``
is set.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from agentwake.errors import StoreError
from agentwake.store.interface import Store, StoreReader
from agentwake.store.records import (
    EVENT_STATES,
    Answerer,
    EventState,
    EventVerdict,
    FlowGate,
    FlowOutcome,
    HeldBatch,
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


async def open_store(config: StoreConfig, *, create: bool = True, start_wait_s: float = 0.0) -> Store:
    """The configured store, open and migrated. ``create=False`` (the CLI's readers) refuses a missing one.

    PostgreSQL when ``[store] url`` is set (psycopg is imported only then), else the SQLite file.
    ``start_wait_s``: how long a PostgreSQL server that is not accepting connections yet (starting
    up, restarting) is waited for; the service passes a minute, a command none. Its sessions'
    server-side timeouts follow ``[store] lease_s`` (``agentwake.store.postgres.SessionTimeouts``).
    """
    if config.url is not None:
        from agentwake.store.postgres import PostgresStore

        return await PostgresStore.open(
            config.url,
            password=_password(config),
            create=create,
            start_wait_s=start_wait_s,
            lease_s=config.lease_s,
        )
    from agentwake.store.sqlite import SqliteStore

    return await SqliteStore.open(config.path, synchronous=config.synchronous, create=create)


def open_reader(path: Path) -> StoreReader:
    """The store at ``path`` for reading, synchronously (no event loop, no writer thread); never created."""
    from agentwake.store.sqlite import SqliteCore

    return SqliteCore.open(path, create=False)


def open_config_reader(config: StoreConfig) -> StoreReader:
    """The configured store for reading, synchronously, whichever its backend; never created."""
    if config.url is not None:
        from agentwake.store.postgres import PostgresReader

        return PostgresReader.open(config.url, password=_password(config))
    return open_reader(config.path)


def _password(config: StoreConfig) -> str | None:
    """The PostgreSQL password from the environment variable ``[store] password_env`` names, if any."""
    if config.password_env is None:
        return None
    password = os.environ.get(config.password_env)
    if not password:
        state = "is not set" if password is None else "is empty"
        raise StoreError(
            f"the environment variable {config.password_env} ([store] password_env) {state}:"
            " it must hold the PostgreSQL password"
        )
    return password


__all__ = [
    "EVENT_STATES",
    "Answerer",
    "EventState",
    "EventVerdict",
    "FlowGate",
    "FlowOutcome",
    "HeldBatch",
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
    "open_config_reader",
    "open_reader",
    "open_store",
    "summary_line",
]
