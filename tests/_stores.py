"""The store fixtures of the suites that run against both backends, SQLite and PostgreSQL.

``backend`` is parametrized over the two (test ids ``[sqlite]`` and ``[postgres]``): where a test's
store lives, and how to open another store there. ``store`` is a store open on it; ``second_store``
another one on the same database (another process, as far as it knows). A module imports them, under
names of their own so that test arguments named after them shadow nothing:

    from _stores import backend_fixture, store_fixture  # noqa: F401 - the fixtures backend, store

PostgreSQL databases come from ``tests/_postgres.py`` (a fresh one per test), taken only by the
tests that run on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentwake.config import StoreConfig
from agentwake.store import Store
from agentwake.store.sqlite import SqliteStore

BACKENDS = ("sqlite", "postgres")


@dataclass(frozen=True)
class Backend:
    """Where one test's store lives: a SQLite file, or a PostgreSQL database (``url``)."""

    name: str
    path: Path
    url: str | None = None

    async def open(self) -> Store:
        """Another store on this database (its own connection, as another process would have)."""
        if self.url is None:
            return await SqliteStore.open(self.path)
        from agentwake.store.postgres import PostgresStore

        return await PostgresStore.open(self.url)

    def store_table(self) -> dict[str, Any]:
        """The ``[store]`` table of a config that uses this database."""
        return {"path": str(self.path)} if self.url is None else {"url": self.url}

    def store_config(self) -> StoreConfig:
        return StoreConfig(**self.store_table())

    def store_toml(self) -> str:
        """The ``[store]`` table as config file text."""
        key, value = next(iter(self.store_table().items()))
        return f'[store]\n{key} = "{value}"\n'


@pytest.fixture(name="backend", params=BACKENDS)
def backend_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    return Backend(request.param, tmp_path / "aw.db", url)


@pytest.fixture(name="store")
async def store_fixture(backend: Backend) -> AsyncIterator[Store]:
    opened = await backend.open()
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture(name="second_store")
async def second_store_fixture(store: Store, backend: Backend) -> AsyncIterator[Store]:
    """Another store open on the same database as ``store`` (another process, as far as it knows)."""
    opened = await backend.open()
    try:
        yield opened
    finally:
        await opened.close()
