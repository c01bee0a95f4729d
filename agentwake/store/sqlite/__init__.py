"""The SQLite backend of the store: one synchronous core, and its async face.

``SqliteCore`` is the core, assembled from one class per concern (subscriptions,
inbox, subscription owners, webhook secrets, work queue, action log, the service's own record,
read-only views), each in its own
module over one connection. Every public method turns a sqlite3 error into a
StoreError. ``SqliteStore`` is the async store the service uses: each method runs
the core's in one worker thread at a time (one writer), see ``agentwake.store.threaded``.
"""

from __future__ import annotations

from pathlib import Path

from agentwake.store.sqlite.base import BUSY_TIMEOUT_MS, SqliteBase, StoreErrors
from agentwake.store.sqlite.browse import Browse
from agentwake.store.sqlite.checkpointer import Checkpointer
from agentwake.store.sqlite.inbox import Inbox
from agentwake.store.sqlite.limits import LimitUse
from agentwake.store.sqlite.owners import Owners
from agentwake.store.sqlite.pauses import Pauses
from agentwake.store.sqlite.runs import ActionLog
from agentwake.store.sqlite.service import ServiceLog
from agentwake.store.sqlite.sessions import OperatorSessions
from agentwake.store.sqlite.subscriptions import Subscriptions
from agentwake.store.sqlite.views import Views
from agentwake.store.sqlite.webhooks import Webhooks
from agentwake.store.sqlite.work import WorkQueue
from agentwake.store.threaded import ThreadedStore, in_store_thread


@StoreErrors.install
class SqliteCore(
    Subscriptions,
    Inbox,
    Owners,
    Webhooks,
    WorkQueue,
    ActionLog,
    ServiceLog,
    Pauses,
    LimitUse,
    Browse,
    OperatorSessions,
    Views,
    SqliteBase,
):
    """The synchronous store over one SQLite file. ``SqliteCore.open(path)``; ``core.close()``."""

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        synchronous: str = "normal",
        create: bool = True,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> SqliteCore:
        """Open (and migrate) the store at ``path``; ``create=False`` refuses a missing file.

        ``busy_timeout_ms`` is how long a statement waits for another process's lock.
        """
        connection = cls.connect(
            path, synchronous=synchronous, create=create, busy_timeout_ms=busy_timeout_ms
        )
        return cls(connection, path)


class SqliteStore(ThreadedStore[SqliteCore]):
    """The async store over SQLite. ``await SqliteStore.open(path)``; ``await store.close()``."""

    # One process per SQLite file: its delivery loops need no leases (agentwake.ownership).
    shared = False

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        synchronous: str = "normal",
        create: bool = True,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> SqliteStore:
        import anyio

        core = await anyio.to_thread.run_sync(
            lambda: SqliteCore.open(
                path, synchronous=synchronous, create=create, busy_timeout_ms=busy_timeout_ms
            )
        )
        store = cls(core)
        store.checkpointer.start(core.conn)
        return store

    def __init__(self, core: SqliteCore) -> None:
        super().__init__(core)
        self.checkpointer = Checkpointer(core.path)

    async def close(self) -> None:
        import anyio

        await anyio.to_thread.run_sync(self.checkpointer.stop)
        await super().close()

    @property
    def path(self) -> Path:
        return self.core.path

    register = in_store_thread(SqliteCore.register)
    cursor = in_store_thread(SqliteCore.cursor)
    set_state = in_store_thread(SqliteCore.set_state)
    record_error = in_store_thread(SqliteCore.record_error)
    count_stream_error = in_store_thread(SqliteCore.count_stream_error)

    ingest = in_store_thread(SqliteCore.ingest)
    ingest_deliveries = in_store_thread(SqliteCore.ingest_deliveries)
    ingest_held = in_store_thread(SqliteCore.ingest_held)
    take_rule_slot = in_store_thread(SqliteCore.take_rule_slot)
    give_rule_slot = in_store_thread(SqliteCore.give_rule_slot)

    hold_subscriptions = in_store_thread(SqliteCore.hold_subscriptions)
    release_subscriptions = in_store_thread(SqliteCore.release_subscriptions)
    subscription_owners = in_store_thread(SqliteCore.subscription_owners)

    webhook = in_store_thread(SqliteCore.webhook)
    webhooks = in_store_thread(SqliteCore.webhooks)
    prepare_webhook = in_store_thread(SqliteCore.prepare_webhook)
    webhook_subscribed = in_store_thread(SqliteCore.webhook_subscribed)
    request_rotation = in_store_thread(SqliteCore.request_rotation)
    retire_webhook = in_store_thread(SqliteCore.retire_webhook)
    to_unsubscribe = in_store_thread(SqliteCore.to_unsubscribe)
    mark_unsubscribed = in_store_thread(SqliteCore.mark_unsubscribed)
    retired_webhook_ids = in_store_thread(SqliteCore.retired_webhook_ids)

    requeue_interrupted = in_store_thread(SqliteCore.requeue_interrupted)
    claim = in_store_thread(SqliteCore.claim)
    renew_leases = in_store_thread(SqliteCore.renew_leases)
    retry = in_store_thread(SqliteCore.retry)
    release = in_store_thread(SqliteCore.release)
    settle = in_store_thread(SqliteCore.settle)
    record_decision = in_store_thread(SqliteCore.record_decision)
    flow_gate = in_store_thread(SqliteCore.flow_gate)
    batch_members = in_store_thread(SqliteCore.batch_members)
    finish = in_store_thread(SqliteCore.finish)
    event = in_store_thread(SqliteCore.event)
    answer = in_store_thread(SqliteCore.answer)

    start_run = in_store_thread(SqliteCore.start_run)
    record_progress = in_store_thread(SqliteCore.record_progress)
    finish_run = in_store_thread(SqliteCore.finish_run)
    journal_tool_call = in_store_thread(SqliteCore.journal_tool_call)
    settle_tool_call = in_store_thread(SqliteCore.settle_tool_call)
    resume_point = in_store_thread(SqliteCore.resume_point)
    adopt_run = in_store_thread(SqliteCore.adopt_run)
    agent_usage = in_store_thread(SqliteCore.agent_usage)

    service_started = in_store_thread(SqliteCore.service_started)
    service_heartbeat = in_store_thread(SqliteCore.service_heartbeat)
    service_stopped = in_store_thread(SqliteCore.service_stopped)
    service_paused = in_store_thread(SqliteCore.service_paused)
    services = in_store_thread(SqliteCore.services)

    pause = in_store_thread(SqliteCore.pause)
    resume = in_store_thread(SqliteCore.resume)
    pauses = in_store_thread(SqliteCore.pauses)
    limit_use = in_store_thread(SqliteCore.limit_use)

    subscriptions = in_store_thread(SqliteCore.subscriptions)
    run_counts = in_store_thread(SqliteCore.run_counts)
    inbox = in_store_thread(SqliteCore.inbox)
    actions = in_store_thread(SqliteCore.actions)
    find_events = in_store_thread(SqliteCore.find_events)
    event_detail = in_store_thread(SqliteCore.event_detail)
    approvals = in_store_thread(SqliteCore.approvals)
    answers = in_store_thread(SqliteCore.answers)
    gaps = in_store_thread(SqliteCore.gaps)
    event_ids = in_store_thread(SqliteCore.event_ids)
    state_counts = in_store_thread(SqliteCore.state_counts)
    oldest_pending_at = in_store_thread(SqliteCore.oldest_pending_at)
    undecided = in_store_thread(SqliteCore.undecided)

    event_page = in_store_thread(SqliteCore.event_page)
    run_page = in_store_thread(SqliteCore.run_page)
    run_event = in_store_thread(SqliteCore.run_event)
    session_save = in_store_thread(SqliteCore.session_save)
    session_get = in_store_thread(SqliteCore.session_get)
    session_touch = in_store_thread(SqliteCore.session_touch)
    session_end = in_store_thread(SqliteCore.session_end)


__all__ = ["BUSY_TIMEOUT_MS", "SqliteCore", "SqliteStore"]
