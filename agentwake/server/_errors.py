"""The JSON-RPC errors the extension answers with, one constructor per family (spec: Error Codes)."""

from __future__ import annotations

from typing import Any

from mcp.shared.exceptions import MCPError

from agentwake import protocol


def _error(code: int, message: str, data: Any = None) -> MCPError:
    return MCPError(code=code, message=message, data=data)


def invalid_params(message: str, data: Any = None) -> MCPError:
    return _error(protocol.INVALID_PARAMS, message, data)


def not_found(name: str) -> MCPError:
    return _error(protocol.NOT_FOUND, "NotFound", {"kind": "event", "name": name})


def subscription_not_found() -> MCPError:
    """events/unsubscribe: no subscription of this caller has that (name, arguments, delivery.url)."""
    return _error(protocol.NOT_FOUND, "NotFound", {"kind": "subscription"})


def forbidden(reason: str) -> MCPError:
    return _error(protocol.FORBIDDEN, "Forbidden", {"reason": reason})


def resource_exhausted(limit: str, maximum: int | None = None) -> MCPError:
    data: dict[str, Any] = {"limit": limit}
    if maximum is not None:
        data["max"] = maximum
    return _error(protocol.RESOURCE_EXHAUSTED, "ResourceExhausted", data)


def unsupported_mode(mode: str) -> MCPError:
    return _error(protocol.UNSUPPORTED, "Unsupported", {"feature": "deliveryMode", "value": mode})


def callback_endpoint_error(reason: str) -> MCPError:
    """-32015: the callback failed verification or could not be reached; ``reason`` is a category."""
    return _error(protocol.CALLBACK_ENDPOINT_ERROR, "CallbackEndpointError", {"reason": reason})


def internal_error(message: str, reason: str) -> MCPError:
    return _error(protocol.INTERNAL_ERROR, message, {"reason": reason})
