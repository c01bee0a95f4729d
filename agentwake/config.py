"""agentwake.toml: pydantic models of every section, and ``load_config``.

Reading the file, ``${ENV}`` interpolation and path resolution are in
``agentwake.configfile`` (no pydantic), which the CLI's quick readers use alone. Its nearly 800
lines are one model per section, each field with its description: one place to read the whole
schema, which splitting would scatter.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agentwake.configfile import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_STORE_PATH,
    Location,
    config_base,
    interpolate,
    key_lines,
    line_of,
    read_config_source,
    table_label,
    under,
    with_default_name,
)
from agentwake.errors import ConfigError

DEFAULT_MAX_EVENTS: Final = 100
MAX_EVENTS_LIMIT: Final = 10_000
DEFAULT_POLL_FLOOR_MS: Final = 1000
DEFAULT_CONNECT_TIMEOUT_S: Final = 30.0
DEFAULT_REQUEST_TIMEOUT_S: Final = 60.0
DEFAULT_PING_INTERVAL_S: Final = 30.0
DEFAULT_WEBHOOK_LISTEN: Final = "127.0.0.1:8787"
DEFAULT_WEBHOOK_TTL_MS: Final = 3_600_000
DEFAULT_HEALTH_REFRESH_S: Final = 3_600.0
DEFAULT_WEBHOOK_MAX_REFRESH_S: Final = 300.0
DEFAULT_ROTATION_GRACE_S: Final = 600.0
# The spec's delivery profile: receivers may refuse bodies over 256 KiB with 413.
DEFAULT_WEBHOOK_MAX_BODY: Final = 256 * 1024
# More would let one delivery hold that much memory per connection.
MAX_WEBHOOK_MAX_BODY: Final = 16 * 1024 * 1024
# Connections one client (an address; an IPv6 /64) may hold: room for a busy sender. Behind a reverse
# proxy every connection is the proxy's: raise it to max_connections there.
DEFAULT_WEBHOOK_MAX_CONNECTIONS_PER_CLIENT: Final = 256
# [limits]: what an untrusted peer may send.
DEFAULT_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024
DEFAULT_MAX_EVENT_BYTES: Final = 1024 * 1024
DEFAULT_MAX_EVENT_ID_CHARS: Final = 1024
DEFAULT_MAX_LIST_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_NEXT_POLL_MS: Final = 3_600_000
DEFAULT_RELIST_DEBOUNCE_S: Final = 1.0
DEFAULT_MAX_PEER_TEXT_CHARS: Final = 500
# Events of one subscription stored but not yet decided; past it delivery waits for the agent.
DEFAULT_MAX_UNDECIDED_EVENTS: Final = 10_000
# Requests (not notifications) a server may send the client per second, and in one burst.
DEFAULT_MAX_SERVER_REQUESTS_PER_S: Final = 20.0
OFFLINE_MODEL: Final = "agentwake/offline"
OFFLINE_NOTICE: Final = f"{OFFLINE_MODEL} is a deterministic stand-in for a real model; no LLM is called"

DeliveryChoice = Literal["auto", "poll", "push", "webhook"]
_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _networks(value: list[str]) -> list[str]:
    for entry in value:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ValueError(f"trusted_proxy entry {entry!r} is not an IP address or CIDR") from None
    return value


# A reverse proxy's addresses or CIDRs ([service] and [webhook] trusted_proxy): one, or a list.
ProxyList = Annotated[list[str], BeforeValidator(_as_list), AfterValidator(_networks)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetentionConfig(_Model):
    """[store.retention]: how long what the store keeps is kept, and the background pruner that
    enforces it (agentwake.store.retention). Every duration is in days (a fraction is allowed)."""

    enabled: bool = Field(
        default=True,
        description="prune in the background while the service runs ('agentwake store prune' works either way)",
    )
    done_days: float = Field(
        default=30.0,
        gt=0,
        description="events done, ignored, denied, batched or rejected: deleted this long after they ended",
    )
    failed_days: float = Field(
        default=90.0, gt=0, description="failed events: deleted this long after they failed"
    )
    runs_days: float = Field(
        default=90.0,
        gt=0,
        description="runs and their tool-call journal; an event is kept as long as one of its runs is",
    )
    transcript_days: float = Field(
        default=30.0,
        gt=0,
        description="a finished event's run transcripts (prompts, messages, tool results) are cleared after"
        " this; the run's row (status, cost, tools) stays for runs_days",
    )
    answered_days: float = Field(
        default=365.0,
        gt=0,
        description="the approvals' audit trail: an answered event is kept this long after its answer",
    )
    gaps_days: float = Field(default=90.0, gt=0, description="recorded gaps")
    dedup_days: float = Field(
        default=365.0,
        gt=0,
        description="a pruned event's (server, name, eventId) key is kept this long after its row was pruned,"
        " so a re-delivery is still a duplicate",
    )
    prune_interval_s: float = Field(
        default=3600.0, ge=1, description="how often the service prunes (the first pass is within a minute)"
    )
    batch_rows: int = Field(
        default=500,
        gt=0,
        le=10_000,
        description="rows deleted per transaction, so no write lock is held long",
    )
    batch_pause_s: float = Field(
        default=0.05, ge=0, le=10, description="pause between two batches, for deliveries and claims"
    )


class StoreConfig(_Model):
    """[store]: a SQLite file (``path``, the default), or a PostgreSQL database (``url``) that several
    processes may share."""

    # A rejected url may hold a password: never echo the input in an error.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    path: Path = Field(default=Path(DEFAULT_STORE_PATH), description="SQLite file for cursors and the inbox")
    synchronous: Literal["normal", "full"] = Field(
        default="normal",
        description="SQLite synchronous mode; 'normal' already survives a crashed process, 'full' also power loss",
    )
    url: str | None = Field(
        default=None,
        description="postgresql://user@host:port/dbname: store in PostgreSQL instead of the SQLite file 'path'",
    )
    password_env: str | None = Field(
        default=None,
        description="environment variable holding the PostgreSQL password (never put it in 'url')",
    )
    lease_s: float = Field(
        default=10.0,
        gt=0,
        description="PostgreSQL: how long a process's hold on a subscription's delivery lasts unrenewed;"
        " another process takes over a dead one's subscriptions within it",
    )
    drive: list[str] | None = Field(
        default=None,
        description="PostgreSQL: pin this process to these subscriptions (names or globs), all it can get;"
        " unset: it drives its share of them all",
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig, description="how long events, runs and transcripts are kept"
    )

    @model_validator(mode="after")
    def _one_backend(self, info: ValidationInfo) -> StoreConfig:
        if self.url is None:
            if self.password_env is not None:
                raise ValueError("'password_env' only applies to a PostgreSQL store: set 'url' too")
            return self
        if "path" in self.model_fields_set:
            raise ValueError("set either 'url' (a PostgreSQL store) or 'path' (a SQLite file), not both")
        # Loaded without secrets (a read-only command): an unset ${VAR} in the url stays as written.
        unresolved = bool(info.context and info.context.get("keep_unset")) and "${" in self.url
        if not unresolved:
            _check_postgres_url(self.url)
        if self.password_env is not None and not self.password_env.strip():
            raise ValueError("'password_env' must name an environment variable")
        return self


def _check_postgres_url(url: str) -> None:
    """A PostgreSQL url without a password; the url itself is never quoted (it may hold one)."""
    from urllib.parse import parse_qs, urlsplit

    scheme, _, rest = url.partition("://")
    if not rest or scheme.lower() not in ("postgresql", "postgres"):
        shown = f"{scheme!r}" if rest else "none"
        raise ValueError(
            f"url must be a postgresql:// URL (postgresql://user@host:port/dbname), its scheme is {shown}"
        )
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    if ":" in userinfo or "password" in parse_qs(parts.query):
        raise ValueError(
            "url must not hold a password: put it in an environment variable and name that variable in"
            " 'password_env'"
        )


class LogConfig(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = Field(
        default="text", description="'json': one JSON object per line (time, level, logger, message, fields)"
    )


SERVICE_SCOPES: Final = ("read", "approve", "metrics")
TOKEN_NAME_PATTERN: Final = r"^[a-z][a-z0-9_-]{0,31}$"


class ServiceTokenConfig(_Model):
    """[service.tokens.NAME]: one named access token of the endpoint and what it may do."""

    env: str = Field(description="environment variable holding the token")
    scopes: list[Literal["read", "approve", "metrics"]] = Field(
        min_length=1,
        description="'read' (the page, GET /approvals), 'approve' (approve and deny), 'metrics' (/metrics)",
    )


class ServiceConfig(_Model):
    """[service]: the operator's HTTP endpoint (health, metrics, approvals page) and how the service stops."""

    listen: str | None = Field(
        default=None,
        description="HOST:PORT of /healthz, /readyz, /metrics and the approvals page; absent: no endpoint",
    )
    token_env: str | None = Field(
        default=None,
        description="environment variable holding the endpoint's full-scope access token (named 'operator')",
    )
    tokens: dict[str, ServiceTokenConfig] = Field(
        default_factory=dict,
        description="[service.tokens.NAME]: more access tokens, each with its own scopes; the name is who acts",
    )
    tls_cert: Path | None = Field(
        default=None, description="PEM certificate chain: serve the endpoint over https"
    )
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert")
    trusted_proxy: ProxyList = Field(
        default_factory=list,
        description="addresses or CIDRs of the reverse proxy whose X-Forwarded-For and X-Forwarded-Proto count",
    )
    session_ttl_s: float = Field(
        default=12 * 3600.0, gt=0, description="a browser session ends this long after the login"
    )
    session_idle_s: float = Field(
        default=3600.0, gt=0, description="a browser session unused this long ends (before session_ttl_s)"
    )
    stop_timeout_s: float = Field(
        default=30.0, gt=0, description="after a stop signal, how long running agent runs may finish"
    )
    watchdog: bool = Field(
        default=True, description="under systemd with WatchdogSec=, send WATCHDOG=1 while the loops run"
    )

    @field_validator("tokens")
    @classmethod
    def _token_names(cls, value: dict[str, ServiceTokenConfig]) -> dict[str, ServiceTokenConfig]:
        for name in value:
            if not re.match(TOKEN_NAME_PATTERN, name):
                raise ValueError(
                    f"token name {name!r} must be lower-case letters, digits, '-' or '_' (at most 32),"
                    " starting with a letter: it names who approved"
                )
        return value

    @model_validator(mode="after")
    def _service_consistent(self) -> ServiceConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set both tls_cert and tls_key to serve the endpoint over https, or neither")
        if self.token_env is not None and "operator" in self.tokens:
            raise ValueError(
                "token_env is the token named 'operator': remove it or rename [service.tokens.operator]"
            )
        if self.session_idle_s > self.session_ttl_s:
            raise ValueError("session_idle_s must not be longer than session_ttl_s")
        return self


class ServerConfig(_Model):
    """One MCP server: a command to spawn (stdio) or a Streamable HTTP URL."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: Path | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    protocol: Literal["auto", "legacy"] = Field(
        default="auto",
        description="'auto' tries server/discover then falls back to initialize; 'legacy' forces initialize",
    )
    connect_timeout_s: float = Field(default=DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    request_timeout_s: float = Field(default=DEFAULT_REQUEST_TIMEOUT_S, gt=0)
    ping_interval_s: float = Field(
        default=DEFAULT_PING_INTERVAL_S,
        gt=0,
        description="how often an otherwise quiet connection is checked; a stdio server's exit is seen at once",
    )
    max_concurrent_runs: int | None = Field(
        default=None, ge=1, description="agent runs on this server's events at the same time, at most"
    )
    webhook_identity: Literal["off", "verify", "require"] = Field(
        default="off",
        description="check the v1a (ed25519) signature of its webhook deliveries against the keys its own"
        " origin publishes: 'verify' refuses a bad one, 'require' also a delivery without one",
    )

    @model_validator(mode="after")
    def _one_transport(self, info: ValidationInfo) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of 'command' (stdio) or 'url' (Streamable HTTP)")
        if self.url is not None:
            # Loaded without secrets (a read-only command): an unset ${VAR} in the url stays as written.
            unresolved = bool(info.context and info.context.get("keep_unset")) and "${" in self.url
            if not unresolved and not re.match(r"^https?://[^/\s]+", self.url):
                raise ValueError(f"url must be an http:// or https:// URL, got {self.url!r}")
            if self.args or self.env or self.cwd:
                raise ValueError("'args', 'env' and 'cwd' only apply to a stdio server ('command')")
        elif self.headers:
            raise ValueError("'headers' only apply to a Streamable HTTP server ('url')")
        if self.webhook_identity != "off" and self.url is None:
            raise ValueError(
                "webhook_identity needs a Streamable HTTP server ('url'): its keys are published on the"
                " server's own origin, and a stdio server has none"
            )
        return self

    @property
    def transport(self) -> Literal["stdio", "http"]:
        return "stdio" if self.command is not None else "http"


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) into its parts; ValueError with the reason."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"listen must be HOST:PORT (e.g. {DEFAULT_WEBHOOK_LISTEN!r}), got {value!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class WebhookConfig(_Model):
    """[webhook]: the receiver inside `agentwake run`, and how webhook subscriptions are kept alive."""

    listen: str = Field(
        default=DEFAULT_WEBHOOK_LISTEN, description="HOST:PORT the receiver listens on (aiohttp)"
    )
    public_url: str = Field(
        description="https URL under which servers reach the receiver; each subscription gets <public_url>/<name>"
    )
    tls_cert: Path | None = Field(default=None, description="PEM certificate chain to terminate TLS here")
    tls_key: Path | None = Field(default=None, description="PEM private key of tls_cert")
    ttl_ms: int | None = Field(
        default=DEFAULT_WEBHOOK_TTL_MS, ge=1, description="suggested subscription lifetime (ttlMs)"
    )
    no_expiry: bool = Field(default=False, description="ask for a subscription with no expiry (ttlMs: null)")
    health_refresh_s: float = Field(
        default=DEFAULT_HEALTH_REFRESH_S,
        ge=1,
        description="refresh cadence when the server grants no expiry (cursor and deliveryStatus)",
    )
    max_refresh_s: float = Field(
        default=DEFAULT_WEBHOOK_MAX_REFRESH_S,
        ge=1,
        description="refresh at least this often whatever the grant: a server that lost the subscription"
        " (a restart with a fresh store) is found out and subscribed again within it",
    )
    rotation_grace_s: float = Field(
        default=DEFAULT_ROTATION_GRACE_S,
        ge=0,
        description="how long the old secret is still accepted after a rotation",
    )
    max_body_bytes: int = Field(
        default=DEFAULT_WEBHOOK_MAX_BODY,
        ge=1024,
        le=MAX_WEBHOOK_MAX_BODY,
        description="larger deliveries are refused with 413 (the spec asks servers for at most 256 KiB)",
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description="open connections at most (more are closed unread); default min(4096, the descriptor limit - 128)",
    )
    max_connections_per_client: int = Field(
        default=DEFAULT_WEBHOOK_MAX_CONNECTIONS_PER_CLIENT,
        ge=1,
        description="open connections from one address (IPv6: one /64) at most; more are closed unread",
    )
    trusted_proxy: ProxyList = Field(
        default_factory=list,
        description="addresses or CIDRs of the reverse proxy in front: its connections are not held to"
        " max_connections_per_client; the client its X-Forwarded-For names is, by requests in progress",
    )

    @field_validator("listen")
    @classmethod
    def _valid_listen(cls, value: str) -> str:
        parse_listen(value)
        return value

    @field_validator("public_url")
    @classmethod
    def _https_public_url(cls, value: str) -> str:
        if re.match(r"^[^:/]*://[^/?#]*@", value):
            # It would travel to every server as delivery.url, and show in logs and status; nor is
            # the value repeated here.
            raise ValueError("public_url must not hold a user name or password")
        if not re.match(r"^https://[^/\s?#]+(/[^\s?#]*)?$", value):
            raise ValueError(
                f"public_url must be an https:// URL without query or fragment (the spec requires https"
                f" for callbacks), got {value!r}"
            )
        try:
            from yarl import URL  # only here: loading it costs every quick CLI command

            url = URL(value)
            port = url.explicit_port
        except ValueError as exc:
            raise ValueError(f"public_url is not a valid URL ({exc})") from None
        if not url.host or port == 0:
            raise ValueError(f"public_url needs a host and a port from 1 to 65535, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _tls_pair(self) -> WebhookConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("set both tls_cert and tls_key to terminate TLS here, or neither")
        return self

    def callback_url(self, subscription: str) -> str:
        """The delivery.url of one subscription: distinct per subscription, so each is its own server key."""
        return f"{self.public_url}/{subscription}"

    @property
    def address(self) -> tuple[str, int]:
        return parse_listen(self.listen)


class SubscriptionConfig(_Model):
    name: str = Field(default="", description='unique; defaults to "<server>.<event>"')
    server: str
    event: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    delivery: DeliveryChoice = "auto"
    max_age_ms: int | None = Field(default=None, ge=0)
    max_events: int = Field(default=DEFAULT_MAX_EVENTS, ge=1, le=MAX_EVENTS_LIMIT)
    poll_floor_ms: int = Field(default=DEFAULT_POLL_FLOOR_MS, ge=1)
    heartbeat_s: float = Field(
        default=30.0,
        gt=0,
        description="push: the server's heartbeat interval; silence for twice this is a dead stream",
    )
    ttl_ms: int | None = Field(
        default=None,
        ge=1,
        description="webhook: suggested lifetime for this subscription; default [webhook] ttl_ms",
    )
    agent: bool = Field(default=True, description="wake the agent for this subscription's events")
    tools: list[str] = Field(
        default_factory=list,
        description='globs of the tools the agent may use for these events, e.g. "demo__get_*"; default none',
    )
    args: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="per tool of `tools`, its arguments pinned or checked, as a policy rule's args",
    )
    model: str | None = Field(
        default=None, description="litellm model for these events; default [agent] model"
    )
    prompt: str | None = Field(
        default=None, description="prompt template in the prompts folder for these events"
    )

    @model_validator(mode="after")
    def _args_of_its_tools(self) -> SubscriptionConfig:
        import fnmatch

        from agentwake.authority import parse_args

        parse_args(self.args)
        stray = [tool for tool in self.args if not any(fnmatch.fnmatchcase(tool, g) for g in self.tools)]
        if stray:
            raise ValueError(f"args names {', '.join(map(repr, stray))}, which 'tools' does not allow")
        return self

    @field_validator("tools")
    @classmethod
    def _valid_tool_globs(cls, value: list[str]) -> list[str]:
        for glob in value:
            if not glob.strip():
                raise ValueError("a tool glob must not be empty")
            if "__" not in glob and glob != "*":
                raise ValueError(
                    f"tool glob {glob!r} has no server part; tools are named '<server>__<tool>', e.g. 'demo__get_*'"
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        return with_default_name(data)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not re.match(_NAME_PATTERN, value):
            raise ValueError(f"{value!r} is not a valid name (letters, digits, '.', '_', '-')")
        return value


class AgentConfig(_Model):
    """[agent]: the LLM woken for each event, and the bounds of one run."""

    model: str = Field(
        description='any litellm model string, e.g. "openai/gpt-4o-mini", or "agentwake/offline"'
    )
    api_base: str | None = Field(
        default=None, description="base URL of the model's API (Ollama, a proxy, ...)"
    )
    api_key_env: str | None = Field(
        default=None,
        description="name of the environment variable that holds the API key (default: litellm's per"
        ' provider); "" with api_base: the endpoint needs no key (a local OpenAI-compatible server)',
    )
    max_steps: int = Field(default=8, ge=1, le=100, description="LLM calls per event, at most")
    timeout_s: float = Field(default=120.0, gt=0, description="wall-clock bound of one agent run")
    max_tokens: int = Field(default=1024, ge=1, description="completion tokens per LLM call")
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_attempts: int = Field(default=3, ge=1, description="runs of one event before it is marked failed")
    attempt_backoff_s: float = Field(
        default=5.0,
        ge=0,
        description="wait before an event's next attempt; doubles per attempt, at most 300 s",
    )
    concurrency: int = Field(default=4, ge=1, le=256, description="agent runs at the same time")
    lease_s: float = Field(
        default=300.0,
        gt=0,
        description="a claimed event's lease; renewed while its run goes on, a lapsed lease is reclaimed",
    )
    max_cost_per_day_usd: float | None = Field(
        default=None, gt=0, description="past this LLM spend in the last 24 h, events wait in pending"
    )
    max_runs_per_hour: int | None = Field(
        default=None, ge=1, description="past this many agent runs in the last hour, events wait in pending"
    )
    llm_retries: int = Field(default=4, ge=0, description="retries of a transient LLM error within one run")
    retry_initial_s: float = Field(default=1.0, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)
    request_timeout_s: float = Field(
        default=60.0, gt=0, description="bound of one LLM call, its whole answer (not per read)"
    )
    circuit_breaker_failures: int = Field(
        default=5,
        ge=0,
        description="LLM calls in a row that fail transiently (after their retries) before the worker"
        " stops claiming events and probes the model with backoff until it answers; 0: never stop",
    )
    prompts: Path = Field(default=Path("prompts"), description="folder of prompt templates")
    system_prompt: str = Field(
        default="system.md.j2", description="system prompt template in the prompts folder"
    )
    event_data_max_chars: int = Field(default=16_000, ge=256, description="event data in the prompt, at most")
    tool_result_max_chars: int = Field(
        default=8_000, ge=256, description="one tool result in the prompt, at most"
    )
    prompt_cache: Literal["auto", "off"] = Field(
        default="auto",
        description='"auto": mark the shared prefix (tools and system prompt) for providers with explicit'
        " prompt caching (anthropic/, Claude and Nova on bedrock/) and rely on the automatic prefix"
        ' caching of the others (OpenAI, Gemini, DeepSeek); "off": no cache markers',
    )

    @field_validator("model")
    @classmethod
    def _model_has_provider(cls, value: str) -> str:
        if "/" not in value.strip("/"):
            raise ValueError(
                f"model {value!r} names no provider; write it as litellm does, e.g. 'openai/gpt-4o-mini',"
                f" 'anthropic/claude-3-5-haiku-latest', 'ollama/llama3.1' or '{OFFLINE_MODEL}'"
            )
        return value

    @model_validator(mode="after")
    def _no_key_needs_api_base(self) -> AgentConfig:
        if self.api_key_env == "" and not self.api_base:
            raise ValueError(
                'api_key_env = "" (no API key) is only for a model at api_base, e.g. a local'
                " OpenAI-compatible server; set api_base, or name the variable that holds the key"
            )
        return self

    @property
    def offline(self) -> bool:
        return self.model == OFFLINE_MODEL


class SanitizeConfig(_Model):
    """[sanitize]: how event data and tool results are bounded and cleaned before any prompt."""

    max_depth: int = Field(default=8, ge=1, le=64, description="nesting levels kept")
    max_string: int = Field(default=4_000, ge=16, description="characters kept per string")
    max_list: int = Field(default=100, ge=1, description="items kept per list or object")
    max_bytes: int = Field(default=32_000, ge=256, description="JSON bytes kept per payload")
    redact_pii: bool = Field(default=False, description="also redact email addresses and phone numbers")
    datamark: bool = Field(
        default=False, description="spotlighting by datamarking: whitespace in data becomes U+02C6"
    )


class LimitsConfig(_Model):
    """[limits]: what a server may send before agentwake refuses it. Peers are untrusted: every bound is here.

    An event over a bound is not stored as sent: it becomes a ``rejected`` record (with a
    short preview and the reason), is counted and logged once, and the subscription moves on.
    """

    max_message_bytes: int = Field(
        default=DEFAULT_MAX_MESSAGE_BYTES,
        ge=64 * 1024,
        le=1024 * 1024 * 1024,
        description="one JSON-RPC message from a stdio server, at most; a longer line is dropped",
    )
    max_event_bytes: int = Field(
        default=DEFAULT_MAX_EVENT_BYTES,
        ge=1024,
        description="one event's data as JSON, at most",
    )
    max_event_id_chars: int = Field(
        default=DEFAULT_MAX_EVENT_ID_CHARS, ge=16, le=65_536, description="an eventId's length, at most"
    )
    max_list_bytes: int = Field(
        default=DEFAULT_MAX_LIST_BYTES,
        ge=64 * 1024,
        description="all pages of one events/list or tools/list answer together, at most",
    )
    max_next_poll_ms: int = Field(
        default=DEFAULT_MAX_NEXT_POLL_MS,
        ge=1000,
        description="the longest wait between polls a server may ask for (nextPollMs is clamped to it)",
    )
    relist_debounce_s: float = Field(
        default=DEFAULT_RELIST_DEBOUNCE_S,
        ge=0,
        description="events/list_changed notifications within this long cause one relist",
    )
    max_peer_text_chars: int = Field(
        default=DEFAULT_MAX_PEER_TEXT_CHARS,
        ge=80,
        description="a server-supplied string (an error message, an id) in a log line or last_error, at most",
    )
    max_undecided_events: int = Field(
        default=DEFAULT_MAX_UNDECIDED_EVENTS,
        ge=1,
        description=(
            "events of one subscription stored and not yet decided, at most; past it the subscription is held"
            " back (no poll, stream closed, webhook deliveries answered 503) until the agent catches up"
        ),
    )
    max_server_requests_per_s: float = Field(
        default=DEFAULT_MAX_SERVER_REQUESTS_PER_S,
        gt=0,
        description="requests a server may send the client per second (a burst of twice as many); more wait",
    )


class PolicyConfig(_Model):
    """[policy]: where the rule files are, and what happens when no rule matches."""

    dir: Path = Field(
        default=Path("policies"), description="folder of policy files (*.toml), read in name order"
    )
    default: Literal["ignore", "log", "agent", "approve"] = Field(
        default="agent", description="the action when no rule matches"
    )


class AgentwakeConfig(_Model):
    store: StoreConfig = Field(default_factory=StoreConfig)
    log: LogConfig = Field(default_factory=LogConfig)
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    agent: AgentConfig | None = None
    sanitize: SanitizeConfig = Field(default_factory=SanitizeConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    webhook: WebhookConfig | None = None
    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    subscriptions: list[SubscriptionConfig] = Field(default_factory=list)

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("servers")
    @classmethod
    def _server_names(cls, value: dict[str, ServerConfig]) -> dict[str, ServerConfig]:
        for name in value:
            if not re.match(_NAME_PATTERN, name):
                raise ValueError(f"server name {name!r} is not valid (letters, digits, '.', '_', '-')")
            if "__" in name:
                # Tools are exposed as <server>__<tool>: the separator must not occur in the server part.
                raise ValueError(f"server name {name!r} must not contain '__'")
        return value

    @model_validator(mode="after")
    def _references(self) -> AgentwakeConfig:
        seen: set[str] = set()
        for index, sub in enumerate(self.subscriptions):
            if sub.server not in self.servers:
                known = ", ".join(sorted(self.servers)) or "none are configured"
                raise ValueError(
                    f"subscriptions[{index}] ({sub.name!r}) names server {sub.server!r}, "
                    f"which is not in [servers] ({known})"
                )
            if sub.name in seen:
                raise ValueError(f"subscription name {sub.name!r} is used twice; give each a unique 'name'")
            seen.add(sub.name)
            if sub.delivery == "webhook" and self.webhook is None:
                raise ValueError(
                    f'subscriptions[{index}] ({sub.name!r}) sets delivery = "webhook", but there is no'
                    " [webhook] section; add one with at least 'public_url'"
                )
            if self.agent is None and (sub.tools or sub.model or sub.prompt):
                raise ValueError(
                    f"subscriptions[{index}] ({sub.name!r}) sets tools, model or prompt, but there is no"
                    " [agent] section; add one with at least 'model'"
                )
        return self

    @property
    def source(self) -> Path | None:
        return self._source

    def subscription(self, name: str) -> SubscriptionConfig:
        for sub in self.subscriptions:
            if sub.name == name:
                return sub
        raise ConfigError(f"no subscription named {name!r}")


def _location(loc: Location) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _unwrap(annotation: Any) -> Any:
    """``X | None`` as ``X``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def known_keys(loc: Location) -> list[str]:
    """The keys the table at ``loc`` may hold (``("servers", "x")``: ServerConfig's), or none."""
    annotation: Any = AgentwakeConfig
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return []
            annotation = field.annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        elif typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        else:
            return []
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []


def describe_error(error: Mapping[str, Any], lines: Mapping[Location, int] | None = None) -> str:
    """One pydantic error as one line: where (dotted key, table, line), what, and for an unknown
    key the nearest known one: "unknown key 'tool' in [[subscriptions]] #1 at line 31; did you
    mean 'tools'?"."""
    loc: Location = tuple(error["loc"])
    line = line_of(lines, loc) if lines is not None and loc else None
    at = f" at line {line}" if line is not None else ""
    prefix = f"{_location(loc)}: " if len(loc) > 1 else ""
    if error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
        key, table = loc[-1], loc[:-1]
        where = f"in {table_label(table)}" if table else "at the top level"
        message = f"{prefix}unknown key {key!r} {where}{at}"
        close = difflib.get_close_matches(key, known_keys(table), n=1, cutoff=0.6)
        if close:
            return f"{message}; did you mean {close[0]!r}?"
        return f"{message} (check the spelling; see the README for every key)"
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] not in ("value_error", "assertion_error") and isinstance(
        error.get("input"), str | int | float | bool
    ):
        given = repr(error["input"])
        message += f", got {given if len(given) <= 60 else given[:59] + '…'}"
    if not loc:
        return message
    if len(loc) == 1 and not at:
        return f"{loc[0]}: {message}"
    # The error is about a table itself ([servers.x]), or about a key in one.
    table = loc if isinstance(loc[-1], int) or known_keys(loc) else loc[:-1]
    where = f" (in {table_label(table)}{at})" if table else f" ({at.strip()})" if at else ""
    return f"{_location(loc)}: {message}{where}"


def parse_config(
    data: dict[str, Any],
    *,
    source: Path | None = None,
    env: Mapping[str, str] | None = None,
    text: str | None = None,
    secrets: bool = True,
) -> AgentwakeConfig:
    """Validate already-parsed TOML data; paths resolve against ``source``'s folder.

    ``text`` (the file's source) lets every error name its line. ``secrets=False`` is for the
    commands that never talk to a server (``status``, ``policy check``, ...): a ``${VAR}`` in
    ``[servers.*]`` whose variable is not set stays as written instead of failing the load, so
    those commands need no secrets. Everything else is interpolated as usual.
    """
    label = str(source) if source else "config"
    environ = os.environ if env is None else env
    if secrets:
        data = interpolate(data, environ)
    else:
        data = {
            key: interpolate(value, environ, key, keep_unset=key == "servers") for key, value in data.items()
        }
    try:
        config = AgentwakeConfig.model_validate(data, context={"keep_unset": not secrets})
    except ValidationError as exc:
        lines = key_lines(text) if text is not None else None
        errors = exc.errors()
        if lines is not None:  # in the file's order
            errors.sort(key=lambda e: line_of(lines, tuple(e["loc"])) or len(text or ""))
        problems = [f"  {describe_error(error, lines)}" for error in errors]
        raise ConfigError(f"{label} is invalid:\n" + "\n".join(problems)) from None
    config = _resolve_paths(config, config_base(source))
    config._source = source
    return config


def _resolve_paths(config: AgentwakeConfig, base: Path) -> AgentwakeConfig:
    store = config.store.model_copy(update={"path": under(base, config.store.path)})
    servers = {
        name: server.model_copy(update={"cwd": under(base, server.cwd) if server.cwd else base})
        if server.transport == "stdio"
        else server
        for name, server in config.servers.items()
    }
    agent = config.agent
    if agent is not None:
        agent = agent.model_copy(update={"prompts": under(base, agent.prompts)})
    policy = config.policy.model_copy(update={"dir": under(base, config.policy.dir)})
    webhook = config.webhook
    if webhook is not None and webhook.tls_cert is not None and webhook.tls_key is not None:
        webhook = webhook.model_copy(
            update={"tls_cert": under(base, webhook.tls_cert), "tls_key": under(base, webhook.tls_key)}
        )
    service = config.service
    if service.tls_cert is not None and service.tls_key is not None:
        service = service.model_copy(
            update={"tls_cert": under(base, service.tls_cert), "tls_key": under(base, service.tls_key)}
        )
    return config.model_copy(
        update={
            "store": store,
            "servers": servers,
            "agent": agent,
            "policy": policy,
            "webhook": webhook,
            "service": service,
        }
    )


def load_config(
    path: Path | str = DEFAULT_CONFIG_PATH, *, env: Mapping[str, str] | None = None, secrets: bool = True
) -> AgentwakeConfig:
    """Read, interpolate and validate a config file. Every failure is a ConfigError.

    ``secrets=False``: unset variables in ``[servers.*]`` values are left as written (see ``parse_config``).
    """
    path = Path(path)
    text, data = read_config_source(path)
    return parse_config(data, source=path, env=env, text=text, secrets=secrets)
