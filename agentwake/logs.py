"""Log records never carry secrets, and ``[log] format = "json"`` writes one JSON object per line.

Libraries we use log what they send at DEBUG (the MCP SDK logs every request,
events/subscribe's ``delivery.secret`` included), and an exception's text may
quote a header. Every handler `agentwake run` writes to gets the RedactSecrets filter,
so a ``whsec_`` secret, a bearer token or an API key is replaced by the same marker
that sanitizing payloads uses, whatever the level and whatever the format.

The JSON form, for a log shipper (journald, Loki, an ELK pipeline)::

    {"time": "2026-12-02T16:07:14.123Z", "level": "INFO", "logger": "agentwake.agent.runner",
     "message": "agent: event T-1 (tickets) run 7 started...", "subscription": "tickets",
     "server": "demo", "event_id": "T-1", "run_id": 7}

``subscription``, ``server``, ``event_id``, ``run_id`` and ``rule`` are there when the log call passed them
(``extra=event_fields(...)``), ``exc`` when it carried an exception. Text that reaches stderr
without going through logging (a stdio server's stderr, copied line by line; a warning; an
``error:`` line) is wrapped into the same form by ``StderrToLog``, so every line parses.
"""

from __future__ import annotations

import io
import json
import logging
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Final, TextIO

from agentwake.redaction import redact

# The structured fields a record may carry (as ``extra=``), in the order a JSON line shows them.
FIELDS: Final = ("subscription", "server", "event_id", "run_id", "rule")
# The logger stray stderr text is attributed to in the JSON form.
STDERR_LOGGER: Final = "agentwake.stderr"
PREFIX_LEVELS: Final = (("error: ", logging.ERROR), ("warning: ", logging.WARNING))
# The MCP SDK's HTTP transport, and what it warns on every close whose DELETE of the session fails.
SDK_HTTP_LOGGER: Final = "mcp.client.streamable_http"
SDK_SESSION_END_FAILED: Final = "Session termination failed: "
# The server whose connection is being opened or closed in this task (agentwake.mcp sets it).
CONNECTION_NAME: ContextVar[str | None] = ContextVar("agentwake_connection_name", default=None)


def event_fields(
    *,
    subscription: str | None = None,
    server: str | None = None,
    event_id: str | None = None,
    run_id: int | None = None,
    rule: str | None = None,
) -> dict[str, object]:
    """``extra=`` for a log call about one event or run: the fields given, Nones left out."""
    given = {
        "subscription": subscription,
        "server": server,
        "event_id": event_id,
        "run_id": run_id,
        "rule": rule,
    }
    return {key: value for key, value in given.items() if value is not None}


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message or structured fields hold a secret; others pass untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted, counts = redact(message)
        if counts:
            record.msg, record.args = redacted, None
        for name in FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, redact(value)[0])
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            # Format the traceback once here, so its text (which may quote a secret) is redacted too.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))[0]
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)[0]
        return True


def install_redaction(handler: logging.Handler) -> None:
    if not any(isinstance(f, RedactSecrets) for f in handler.filters):
        handler.addFilter(RedactSecrets())


class SessionEndNotice(logging.Filter):
    """The SDK's ``Session termination failed: <why>``, said in agentwake's words, once per server.

    On every close of a Streamable HTTP connection the SDK sends DELETE for its session; a server
    that is down ("All connection attempts failed") or restarted (404: it no longer knows the
    session) makes it warn, at each reconnect. Nothing is lost: the server drops the session on
    its own. The first time per server it is an INFO line of ``agentwake.mcp``; later ones are
    DEBUG. Every other record of the SDK's logger passes untouched.
    """

    def __init__(self) -> None:
        super().__init__()
        self._said: set[str | None] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or not record.msg.startswith(SDK_SESSION_END_FAILED):
            return True
        why = record.getMessage()[len(SDK_SESSION_END_FAILED) :]
        if why == "404":
            why = "HTTP 404: it no longer knows the session"
        elif why.isdigit():
            why = f"HTTP {why}"
        server = CONNECTION_NAME.get()
        first = server not in self._said
        self._said.add(server)
        record.name = "agentwake.mcp"
        record.msg = (
            "%s: could not end the MCP session on disconnect (%s); harmless: the server drops it itself%s"
        )
        record.args = (
            f"server {server}" if server else "an HTTP server",
            why,
            "; not said again for this server" if first else "",
        )
        level = logging.INFO if first else logging.DEBUG
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return logging.getLogger(record.name).isEnabledFor(level)


def adapt_sdk_logs() -> None:
    """Put SessionEndNotice on the SDK's HTTP transport logger (once, however often it is called)."""
    sdk = logging.getLogger(SDK_HTTP_LOGGER)
    if not any(isinstance(f, SessionEndNotice) for f in sdk.filters):
        sdk.addFilter(SessionEndNotice())


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a newline in a message is escaped, never written)."""

    def format(self, record: logging.LogRecord) -> str:
        shown: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                shown[name] = value
        if record.exc_info and record.exc_text is None:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            shown["exc"] = record.exc_text
        if record.stack_info:
            shown["stack"] = self.formatStack(record.stack_info)
        # default=str: a field passed as, say, a Path still makes a line rather than an error.
        return json.dumps(shown, ensure_ascii=False, default=str)


class StderrToLog(io.TextIOBase):
    """Stands in for ``sys.stderr`` under the JSON format: each line written becomes a record of
    STDERR_LOGGER, at INFO (ERROR or WARNING for an ``error:`` or ``warning:`` line), shown whatever
    the configured level (as the text form shows it).

    Handlers keep writing to the real stream (``original``). Should a handler itself write to
    ``sys.stderr`` (logging's own error report), that text goes to ``original`` as is, not round again.
    """

    def __init__(self, original: TextIO) -> None:
        super().__init__()
        self.original = original
        self._pending = ""
        self._inside = False
        self._logger = logging.getLogger(STDERR_LOGGER)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False  # no colour codes in a message

    def fileno(self) -> int:
        # Code that hands stderr's descriptor to a child keeps working (its output is not wrapped).
        return self.original.fileno()

    def write(self, text: str) -> int:
        if self._inside:
            return self.original.write(text)
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            if line.strip():
                self._emit(line)
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def _emit(self, line: str) -> None:
        # The CLI's own "error: ..." and "warning: ..." lines (agentwake.cli.common) keep their level.
        level = next((lvl for prefix, lvl in PREFIX_LEVELS if line.startswith(prefix)), logging.INFO)
        record = self._logger.makeRecord(STDERR_LOGGER, level, "(stderr)", 0, line, (), None)
        self._inside = True
        try:
            # handle(), not info(): the logger's level is not applied, the handlers' filters are.
            self._logger.handle(record)
        finally:
            self._inside = False


__all__ = [
    "CONNECTION_NAME",
    "FIELDS",
    "SDK_HTTP_LOGGER",
    "STDERR_LOGGER",
    "JsonFormatter",
    "RedactSecrets",
    "SessionEndNotice",
    "StderrToLog",
    "adapt_sdk_logs",
    "event_fields",
    "install_redaction",
]
