"""The params of each events/* request, as the SDK validates them, and events/list's page cursor."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from mcp_types import RequestParams
from pydantic import ConfigDict, Field

from agentwake.server._errors import invalid_params


class Params(RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ListParams(Params):
    cursor: str | None = None


class PollParams(Params):
    name: str
    arguments: dict[str, Any] | None = None
    cursor: str | None = None
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs", ge=0)
    max_events: int | None = Field(default=None, alias="maxEvents", ge=1)


class StreamParams(Params):
    name: str
    arguments: dict[str, Any] | None = None
    cursor: str | None = None
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs", ge=0)


class SubscribeParams(Params):
    name: str
    arguments: dict[str, Any] | None = None
    # Checked by hand, so no error message ever quotes delivery.secret.
    delivery: Any = None
    cursor: str | None = None
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs", ge=0)
    # Absent = the server's default; an explicit null asks for no expiry (see model_fields_set).
    ttl_ms: int | None = Field(default=None, alias="ttlMs")


class UnsubscribeParams(Params):
    name: str
    arguments: dict[str, Any] | None = None
    delivery: Any = None


def encode_page_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"events:{offset}".encode()).decode()


def decode_page_cursor(cursor: str | None) -> int:
    """The offset an events/list cursor stands for; InvalidParams for one we did not hand out."""
    if cursor is None:
        return 0
    try:
        text = base64.urlsafe_b64decode(cursor.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid_params("events/list: unknown pagination cursor") from None
    prefix, _, number = text.partition(":")
    if prefix != "events" or not (number.isascii() and number.isdigit()):
        raise invalid_params("events/list: unknown pagination cursor")
    return int(number)
