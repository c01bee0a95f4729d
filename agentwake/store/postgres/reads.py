"""The read-only views twice over, both driving the one definition of each in ``views``: as
coroutines of the async store, and as methods of ``PostgresReader``, the synchronous reader the
CLI's quick commands use (one plain connection, no pool, no event loop)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from agentwake.store.limits import limit_use
from agentwake.store.pauses import Pause
from agentwake.store.postgres import views
from agentwake.store.postgres.base import Named, PostgresBase, StoreErrors, describe_target
from agentwake.store.postgres.schema import check_schema
from agentwake.store.postgres.views import View, run_sync

T = TypeVar("T")

# How long connecting may take (libpq's connect_timeout), unless the url says otherwise.
CONNECT_TIMEOUT_S: Final = 10


def connect_kwargs(url: str, password: str | None) -> dict[str, Any]:
    """What every connection to ``url`` is opened with besides the url: autocommit (a transaction
    is always explicit), a connect timeout, and the password, kept out of the url."""
    kwargs: dict[str, Any] = {"autocommit": True}
    if password is not None:
        kwargs["password"] = password
    try:
        given = conninfo_to_dict(url)
    except psycopg.Error:
        given = {}
    if "connect_timeout" not in given:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
    return kwargs


class Views(PostgresBase):
    async def subscriptions(self) -> list[dict[str, Any]]:
        """Every stored subscription with its counters and webhook state (never a secret)."""
        return await self._read(views.subscriptions())

    async def run_counts(self) -> dict[str, dict[str, Any]]:
        return await self._read(views.run_counts())

    async def inbox(self, limit: int, *, state: str | None = None) -> list[dict[str, Any]]:
        return await self._read(views.inbox(limit, state))

    async def actions(self, limit: int) -> list[dict[str, Any]]:
        return await self._read(views.actions(limit))

    async def find_events(self, event_id: str, server: str | None = None) -> list[dict[str, Any]]:
        return await self._read(views.find_events(event_id, server))

    async def event_detail(self, event_row: int) -> dict[str, Any] | None:
        return await self._read(views.event_detail(event_row))

    async def approvals(self) -> list[dict[str, Any]]:
        return await self._read(views.approvals())

    async def answers(self, limit: int = 50, event_row: int | None = None) -> list[dict[str, Any]]:
        return await self._read(views.answers(limit, event_row))

    async def gaps(self, subscription: str | None = None) -> list[dict[str, Any]]:
        return await self._read(views.gaps(subscription))

    async def event_ids(self, subscription: str | None = None) -> list[str]:
        return await self._read(views.event_ids(subscription))

    async def state_counts(self) -> dict[str, int]:
        return await self._read(views.state_counts())

    async def oldest_pending_at(self) -> str | None:
        return await self._read(views.oldest_pending_at())

    async def undecided(self, subscription: str, up_to: int) -> int:
        return await self._read(views.undecided(subscription, up_to))

    async def storage(self) -> dict[str, Any]:
        return await self._read(views.storage())


@StoreErrors.install_sync
class PostgresReader(Named):
    """The store's views, synchronously, over one read-only connection. ``PostgresReader.open(url)``."""

    def __init__(self, conn: psycopg.Connection[Any], target: str, password: str | None) -> None:
        self.conn = conn
        self.target = target
        self._password = password

    def __repr__(self) -> str:
        return f"<PostgresReader {self.target}>"

    @classmethod
    def open(cls, url: str, *, password: str | None = None) -> PostgresReader:
        """Connect read-only; a database without the (current) schema is refused, never created."""
        target = describe_target(url)
        try:
            conn = psycopg.connect(url, **connect_kwargs(url, password))
        except psycopg.Error as exc:
            raise Named.error_for(target, password, exc) from None
        try:
            conn.read_only = True
            check_schema(conn, target)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, psycopg.Error):
                raise Named.error_for(target, password, exc) from None
            raise
        return cls(conn, target, password)

    def _read(self, view: View[T]) -> T:
        with self.conn.transaction():
            return run_sync(self.conn, view)

    def close(self) -> None:
        self.conn.close()

    def subscriptions(self) -> list[dict[str, Any]]:
        return self._read(views.subscriptions())

    def storage(self) -> dict[str, Any]:
        return self._read(views.storage())

    def run_counts(self) -> dict[str, dict[str, Any]]:
        return self._read(views.run_counts())

    def inbox(self, limit: int, *, state: str | None = None) -> list[dict[str, Any]]:
        return self._read(views.inbox(limit, state))

    def actions(self, limit: int) -> list[dict[str, Any]]:
        return self._read(views.actions(limit))

    def find_events(self, event_id: str, server: str | None = None) -> list[dict[str, Any]]:
        return self._read(views.find_events(event_id, server))

    def event_detail(self, event_row: int) -> dict[str, Any] | None:
        return self._read(views.event_detail(event_row))

    def approvals(self) -> list[dict[str, Any]]:
        return self._read(views.approvals())

    def answers(self, limit: int = 50, event_row: int | None = None) -> list[dict[str, Any]]:
        return self._read(views.answers(limit, event_row))

    def gaps(self, subscription: str | None = None) -> list[dict[str, Any]]:
        return self._read(views.gaps(subscription))

    def event_ids(self, subscription: str | None = None) -> list[str]:
        return self._read(views.event_ids(subscription))

    def state_counts(self) -> dict[str, int]:
        return self._read(views.state_counts())

    def oldest_pending_at(self) -> str | None:
        return self._read(views.oldest_pending_at())

    def services(self, limit: int = 5) -> list[dict[str, Any]]:
        return self._read(views.services(limit))

    def pauses(self) -> list[Pause]:
        return self._read(views.pauses())

    def limit_use(self, since_hour: str, since_day: str, rate_since: Mapping[str, str]) -> dict[str, Any]:
        return self._read(limit_use(since_hour, since_day, rate_since))

    def subscription_owners(self) -> list[dict[str, Any]]:
        return self._read(views.subscription_owners())
