"""Names and numbers of the MCP Events wire: the extension id, methods, notifications, error codes.

No pydantic here: the error tree and the CLI's quick commands use these without loading
the wire models (``agentwake.protocol``, which re-exports every name).
"""

from __future__ import annotations

from typing import Final, Literal

EXTENSION_ID: Final = "io.modelcontextprotocol/events"
SUBSCRIPTION_ID_META: Final = "io.modelcontextprotocol/subscriptionId"

# Methods and notifications.
METHOD_LIST: Final = "events/list"
METHOD_POLL: Final = "events/poll"
METHOD_STREAM: Final = "events/stream"
METHOD_SUBSCRIBE: Final = "events/subscribe"
METHOD_UNSUBSCRIBE: Final = "events/unsubscribe"
NOTIFICATION_LIST_CHANGED: Final = "notifications/events/list_changed"
NOTIFICATION_ACTIVE: Final = "notifications/events/active"
NOTIFICATION_EVENT: Final = "notifications/events/event"
NOTIFICATION_HEARTBEAT: Final = "notifications/events/heartbeat"
NOTIFICATION_ERROR: Final = "notifications/events/error"
NOTIFICATION_TERMINATED: Final = "notifications/events/terminated"

# Error codes (JSON-RPC and the extension's general-purpose codes).
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
METHOD_NOT_FOUND: Final = -32601
NOT_FOUND: Final = -32011
FORBIDDEN: Final = -32012
RESOURCE_EXHAUSTED: Final = -32013
UNSUPPORTED: Final = -32014
CALLBACK_ENDPOINT_ERROR: Final = -32015

ERROR_NAMES: Final[dict[int, str]] = {
    INVALID_PARAMS: "InvalidParams",
    INTERNAL_ERROR: "InternalError",
    METHOD_NOT_FOUND: "MethodNotFound",
    NOT_FOUND: "NotFound",
    FORBIDDEN: "Forbidden",
    RESOURCE_EXHAUSTED: "ResourceExhausted",
    UNSUPPORTED: "Unsupported",
    CALLBACK_ENDPOINT_ERROR: "CallbackEndpointError",
}

DeliveryMode = Literal["poll", "push", "webhook"]
DELIVERY_MODES: Final[tuple[DeliveryMode, ...]] = ("poll", "push", "webhook")


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"Error{code}")
