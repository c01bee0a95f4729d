"""The server side of MCP Events for MCP servers built on the official SDK."""

from agentwake.server._buffer import DEFAULT_BUFFER_MAX_AGE, DEFAULT_BUFFER_MAX_EVENTS, EmitBuffer
from agentwake.server._errors import (
    forbidden,
    invalid_params,
    not_found,
    resource_exhausted,
    unsupported_mode,
)
from agentwake.server._extension import DEFAULT_MAX_EVENTS, DEFAULT_NEXT_POLL_MS, EventsExtension
from agentwake.server._leases import DEFAULT_POLL_LEASE_TTL
from agentwake.server._shared import EventType
from agentwake.server._stream import DEFAULT_HEARTBEAT_MS, MAX_HEARTBEAT_MS, STREAM_NOTIFICATIONS
from agentwake.server._types import Event, EventContext, EventResult, canonical_hash, isoformat
from agentwake.server._webhook_settings import WebhookSettings, subscription_id
from agentwake.server._webhook_store import SqliteWebhookStore, StoredWebhook, WebhookStore

__all__ = [
    "DEFAULT_BUFFER_MAX_AGE",
    "DEFAULT_BUFFER_MAX_EVENTS",
    "DEFAULT_HEARTBEAT_MS",
    "DEFAULT_MAX_EVENTS",
    "DEFAULT_NEXT_POLL_MS",
    "DEFAULT_POLL_LEASE_TTL",
    "MAX_HEARTBEAT_MS",
    "STREAM_NOTIFICATIONS",
    "EmitBuffer",
    "Event",
    "EventContext",
    "EventResult",
    "EventType",
    "EventsExtension",
    "SqliteWebhookStore",
    "StoredWebhook",
    "WebhookSettings",
    "WebhookStore",
    "canonical_hash",
    "forbidden",
    "invalid_params",
    "isoformat",
    "not_found",
    "resource_exhausted",
    "subscription_id",
    "unsupported_mode",
]
