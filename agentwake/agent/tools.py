"""The tools an agent may use: every connected server's tools under exposed names, and the allowlist.

An exposed name says where the tool lives (``demo__add_comment``) and is a valid
function name for every provider (``[A-Za-z0-9_-]``, at most 64 characters).
Authority comes only from the allowlist of the subscription (later: the policy
rule): a tool it does not match is absent from the LLM's tool list, and a call
to it anyway is refused before anything reaches a server.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import anyio
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Tool

from agentwake.errors import ConnectionLost, DeliveryError
from agentwake.mcp import ServerConnection

logger = logging.getLogger(__name__)

SEPARATOR: Final = "__"
MAX_NAME: Final = 64
_INVALID: Final = re.compile(r"[^A-Za-z0-9_-]")
# The tools/call ``_meta`` key of a call's idempotency key, stable across reruns of one call,
# so a server that supports it can recognise a call it has already carried out.
IDEMPOTENCY_KEY_META: Final = "io.agentwake/idempotency-key"


def exposed_name(server: str, tool: str) -> str:
    name = _INVALID.sub("_", f"{server}{SEPARATOR}{tool}")
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
        name = f"{name[: MAX_NAME - 9]}_{digest}"
    return name


@dataclass(frozen=True, slots=True)
class ToolSpec:
    exposed: str
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]

    def to_llm(self) -> dict[str, Any]:
        """The OpenAI-style function declaration litellm passes on to every provider."""
        return {
            "type": "function",
            "function": {
                "name": self.exposed,
                "description": self.description or f"{self.name} on MCP server {self.server}",
                "parameters": self.input_schema or {"type": "object", "properties": {}},
            },
        }


def specs_for(server: str, tools: Iterable[Tool]) -> list[ToolSpec]:
    return [
        ToolSpec(
            exposed=exposed_name(server, tool.name),
            server=server,
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema or {}),
        )
        for tool in tools
    ]


_warned_collisions: set[str] = set()


def unique_names(specs: list[ToolSpec]) -> list[ToolSpec]:
    """Tools whose exposed names collide ('get.x' and 'get_x') each get a stable hash suffix.

    Otherwise one would silently stand for the other, and an allowlist naming one
    would call the other.
    """
    counts: dict[str, int] = {}
    for spec in specs:
        counts[spec.exposed] = counts.get(spec.exposed, 0) + 1
    if all(count == 1 for count in counts.values()):
        return specs
    renamed: list[ToolSpec] = []
    for spec in specs:
        if counts[spec.exposed] == 1:
            renamed.append(spec)
            continue
        digest = hashlib.sha256(f"{spec.server}\0{spec.name}".encode()).hexdigest()[:8]
        name = f"{spec.exposed[: MAX_NAME - 9]}_{digest}"
        if spec.exposed not in _warned_collisions:
            logger.warning(
                "tools %r from different places share the exposed name %s; each gets a suffix (%s for %s on %s)",
                spec.exposed,
                spec.exposed,
                name,
                spec.name,
                spec.server,
            )
        renamed.append(ToolSpec(name, spec.server, spec.name, spec.description, spec.input_schema))
    _warned_collisions.update(n for n, c in counts.items() if c > 1)
    return renamed


@dataclass(frozen=True, slots=True)
class Allowlist:
    """Globs over exposed names. Empty means no tools."""

    globs: tuple[str, ...] = ()

    def allows(self, exposed: str) -> bool:
        return any(fnmatch.fnmatchcase(exposed, glob) for glob in self.globs)

    def select(self, catalog: Iterable[ToolSpec]) -> list[ToolSpec]:
        return [spec for spec in catalog if self.allows(spec.exposed)]


def servers_of(globs: Iterable[str], servers: Iterable[str]) -> set[str]:
    """The servers whose tools the globs over ``<server>__<tool>`` names can match.

    The part before the first ``__`` is matched against each server's name; a glob without
    ``__`` (say ``*``) could match any server's tools, so it names them all.
    """
    servers = list(servers)
    named: set[str] = set()
    for glob in globs:
        server_glob = glob.split(SEPARATOR, 1)[0] if SEPARATOR in glob else None
        named.update(s for s in servers if server_glob is None or fnmatch.fnmatchcase(s, server_glob))
    return named


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    is_error: bool
    content: Any  # text, or the structured content when there is no text
    # The call may have reached the server, but no answer came (the connection was lost on the way).
    unknown: bool = False


def outcome_of(result: CallToolResult) -> ToolOutcome:
    texts: list[str] = []
    for block in result.content:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            texts.append(text)
        else:
            texts.append(f"[{getattr(block, 'type', 'content')} content not shown]")
    # Servers send structured content with its serialisation as text (the spec asks them to):
    # the text alone, unless there is none.
    if result.structured_content is not None and not texts:
        return ToolOutcome(result.is_error, result.structured_content)
    return ToolOutcome(result.is_error, "\n".join(texts))


class ToolHost(Protocol):
    """Where an agent run finds tools and sends calls."""

    def catalog(self) -> Sequence[ToolSpec]: ...

    async def call(
        self, spec: ToolSpec, arguments: dict[str, Any], *, idempotency_key: str | None = None
    ) -> ToolOutcome: ...


@dataclass
class ConnectionPool:
    """The live connections of a running service, and their tools; servers come and go."""

    call_timeout_s: float = 60.0
    _connections: dict[str, ServerConnection] = field(default_factory=dict)
    _tools: dict[str, list[ToolSpec]] = field(default_factory=dict)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def changed(self) -> None:
        """Wait for the next change of the catalog."""
        await self._changed.wait()

    def _note_change(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def attach(self, conn: ServerConnection) -> None:
        self._connections[conn.name] = conn
        await self.refresh(conn.name)

    def attached(self, server: str) -> bool:
        """Whether ``server`` is connected and its tools are known (none, for a server that offers none)."""
        return server in self._tools

    async def wait_for(self, server: str, timeout_s: float) -> bool:
        """Wait until ``server`` is attached (see ``attached``); False if it is not within the timeout."""
        with anyio.move_on_after(timeout_s):
            while not self.attached(server):
                await self.changed()
        return self.attached(server)

    def detach(self, server: str) -> None:
        self._connections.pop(server, None)
        if self._tools.pop(server, None) is not None:
            self._note_change()

    async def refresh(self, server: str) -> None:
        """List the server's tools again. A server that declares no tools capability is asked
        nothing and has none; one whose tools/list fails keeps what it had (none, the first time):
        either way it counts as attached, so runs that allow its tools do not wait for it.
        A lost connection is left to the reconnect (``detach``)."""
        conn = self._connections.get(server)
        if conn is None:
            return
        if not conn.offers_tools:
            first = server not in self._tools
            self._tools[server] = []
            self._note_change()
            if first:
                logger.info("server %s: offers no tools (no tools capability)", server)
            return
        try:
            tools = await conn.list_tools()
        except ConnectionLost as exc:
            logger.warning("server %s: cannot list its tools: %s", server, exc)
            return
        except DeliveryError as exc:
            kept = self._tools.setdefault(server, [])
            self._note_change()
            logger.warning(
                "server %s: cannot list its tools (%s); %s",
                server,
                exc,
                f"keeping the {len(kept)} listed before" if kept else "the agent gets none of them",
            )
            return
        specs = specs_for(server, tools)
        self._tools[server] = specs
        self._note_change()
        logger.info(
            "server %s: %d tool(s): %s", server, len(specs), ", ".join(s.exposed for s in specs) or "none"
        )

    def catalog(self) -> list[ToolSpec]:
        return unique_names([spec for specs in self._tools.values() for spec in specs])

    async def call(
        self, spec: ToolSpec, arguments: dict[str, Any], *, idempotency_key: str | None = None
    ) -> ToolOutcome:
        """tools/call; ``idempotency_key`` goes in the request's ``_meta`` (IDEMPOTENCY_KEY_META)."""
        conn = self._connections.get(spec.server)
        if conn is None:
            return ToolOutcome(True, f"server {spec.server!r} is not connected right now; try again later")
        meta = {IDEMPOTENCY_KEY_META: idempotency_key} if idempotency_key else None
        try:
            result = await conn.call_tool(spec.name, arguments, timeout_s=self.call_timeout_s, meta=meta)
            return outcome_of(result)
        except MCPError as exc:
            return ToolOutcome(True, f"the server rejected the call: {exc.message} (code {exc.code})")
        except ConnectionLost as exc:
            return ToolOutcome(True, str(exc), unknown=True)
        except DeliveryError as exc:
            return ToolOutcome(True, str(exc))


def elapsed_ms(start: float) -> int:
    return int((time.perf_counter() - start) * 1000)
