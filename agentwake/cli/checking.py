"""What ``agentwake check`` reports (its findings), and its checks of the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agentwake.config import AgentwakeConfig


Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``check`` found: ``kind`` (config, store, api_key, prompt, policy, server,
    subscription, tool, service), ``what`` (the file, variable, server, subscription or rule) and why."""

    kind: str
    what: str
    message: str
    severity: Severity = "error"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "what": self.what,
            "message": self.message,
            "severity": self.severity,
            **self.extra,
        }


@dataclass
class CheckReport:
    findings: list[Finding] = field(default_factory=list)
    subscriptions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def add(self, kind: str, what: str, message: str, severity: Severity = "error", **extra: Any) -> None:
        self.findings.append(Finding(kind, what, message, severity, extra))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "findings": [f.to_json() for f in self.findings],
            "subscriptions": self.subscriptions,
        }


def check_store(cfg: AgentwakeConfig, report: CheckReport) -> None:
    """The store can be opened and written; a missing one can be created. An existing store is
    opened and a write transaction begun and rolled back; for a new one, its folder is made and a
    scratch file written next to where it will be, then removed."""
    import os
    import sqlite3
    import tempfile

    if cfg.store.url is not None:
        check_postgres_store(cfg, report)
        return
    path = cfg.store.path
    what = str(path)
    if path.exists():
        if path.is_dir():
            report.add("store", what, f"store path {path} is a folder; set [store] path to a file")
            return
        from agentwake.errors import StoreError
        from agentwake.store.sqlite import SqliteCore

        try:
            core = SqliteCore.open(path, create=False)
        except StoreError as exc:
            report.add("store", what, f"store {path} cannot be opened: {exc}")
            return
        try:
            core.conn.execute("BEGIN IMMEDIATE")
            core.conn.rollback()
        except sqlite3.Error as exc:
            report.add("store", what, f"store {path} cannot be written: {exc}")
        finally:
            core.close()
        if not os.access(path.parent, os.W_OK):
            report.add(
                "store",
                what,
                f"store {path}: its folder is not writable (SQLite keeps its -wal and -shm files there)",
            )
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".check", dir=path.parent)
        try:
            os.write(fd, b"agentwake check\n")
        finally:
            os.close(fd)
            os.unlink(scratch)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        report.add("store", what, f"store {path} cannot be created: {reason} ({exc.filename or path.parent})")


def check_postgres_store(cfg: AgentwakeConfig, report: CheckReport) -> None:
    """A PostgreSQL store ([store] url): its password is set, the server answers and lets the user in,
    and an existing store's tables may be written (one without the schema yet: 'run' creates it)."""
    import psycopg

    from agentwake.configfile import postgres_name
    from agentwake.errors import StoreError
    from agentwake.store import open_config_reader
    from agentwake.store.postgres import PostgresReader
    from agentwake.store.postgres.base import describe_target
    from agentwake.store.postgres.schema import missing_schema, outdated_schema

    assert cfg.store.url is not None
    what = postgres_name(cfg.store.url)
    target = describe_target(cfg.store.url)
    try:
        reader = open_config_reader(cfg.store)
    except StoreError as exc:
        # Connected, but no (current) schema yet: `run` creates or migrates it.
        if str(exc) not in (str(missing_schema(target)), str(outdated_schema(target))):
            report.add("store", what, str(exc))
        return
    assert isinstance(reader, PostgresReader)
    try:
        row = reader.conn.execute(
            "SELECT has_table_privilege('events', 'INSERT, UPDATE, DELETE')"
            " AND has_table_privilege('subscriptions', 'INSERT, UPDATE, DELETE')"
        ).fetchone()
        if not (row and row[0]):
            report.add("store", what, f"store {what} cannot be written: the user may not change its tables")
    except psycopg.Error as exc:
        report.add("store", what, reader.store_error(exc).args[0])
    finally:
        reader.close()
