"""The PostgreSQL backend of the store: natively async over a psycopg connection pool.

``PostgresStore`` is assembled from one class per concern (subscriptions, inbox, owners, webhook secrets,
work queue, flow control, action log, the service's own record, read-only views), each in its own
module, with the same semantics as the SQLite store (``agentwake.store.sqlite``), whose code is
the specification. Each method runs in one transaction on a pooled connection, and every public
one turns a psycopg error into a StoreError naming the database (never its password).

Unlike the SQLite store, one database may be shared by several processes: claims skip the rows
another process has locked, ingest deduplicates on a unique constraint, flow control holds an
advisory lock per rule and key, each subscription's delivery loop is driven by one process under a
fenced lease (``owners``), and migrations run under an advisory lock.
``PostgresReader`` is the synchronous reader of the views, for the CLI's quick commands.

psycopg is imported only here: ``agentwake.store`` imports this package only for a configured url.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import psycopg

from agentwake.store.postgres.base import Named, PostgresBase, StoreErrors, describe_target
from agentwake.store.postgres.flow import FlowControl
from agentwake.store.postgres.inbox import Inbox
from agentwake.store.postgres.owners import Owners
from agentwake.store.postgres.reads import PostgresReader, Views, connect_kwargs
from agentwake.store.postgres.runs import ActionLog
from agentwake.store.postgres.schema import migrate
from agentwake.store.postgres.service import ServiceLog
from agentwake.store.postgres.subscriptions import Subscriptions
from agentwake.store.postgres.webhooks import Webhooks
from agentwake.store.postgres.work import WorkQueue

# How long opening waits for the pool's first connections.
POOL_OPEN_TIMEOUT_S: Final = 30.0


@StoreErrors.install
class PostgresStore(
    Subscriptions, Inbox, Owners, Webhooks, WorkQueue, FlowControl, ActionLog, ServiceLog, Views, PostgresBase
):
    """The async store over one PostgreSQL database. ``await PostgresStore.open(url)``; ``await store.close()``."""

    # Several processes may share the database: delivery loops are driven under leases (agentwake.ownership).
    shared = True

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        password: str | None = None,
        create: bool = True,
        min_size: int = 1,
        max_size: int = 10,
    ) -> PostgresStore:
        """Connect, apply pending migrations (``create=False`` refuses a database without the
        schema), and open a pool of ``min_size`` to ``max_size`` connections.

        ``url`` is a libpq url or conninfo string; the password is passed apart (never in a message).
        """
        from psycopg_pool import AsyncConnectionPool

        target = describe_target(url)
        kwargs = connect_kwargs(url, password)
        try:
            async with await psycopg.AsyncConnection.connect(url, **kwargs) as conn:
                await migrate(conn, target, create=create)
        except psycopg.Error as exc:
            raise Named.error_for(target, password, exc) from None
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            kwargs=kwargs,
            min_size=min_size,
            max_size=max_size,
            open=False,
            # A connection the server dropped (a restart) is replaced before it is handed out.
            check=AsyncConnectionPool.check_connection,
        )
        try:
            await pool.open(wait=True, timeout=POOL_OPEN_TIMEOUT_S)
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, psycopg.Error):
                raise Named.error_for(target, password, exc) from None
            raise
        return cls(pool, target, password)


if TYPE_CHECKING:
    from agentwake.store.interface import Store, StoreReader

    # mypy checks both against the protocols they implement.
    _store_check: type[Store] = PostgresStore
    _reader_check: type[StoreReader] = PostgresReader


__all__ = ["POOL_OPEN_TIMEOUT_S", "PostgresReader", "PostgresStore"]
