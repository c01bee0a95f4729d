"""The server identity's JWKS on the Streamable HTTP app: ``GET /.well-known/mcp-webhook-jwks.json``.

The keys listed are computed on each request (``ServerIdentity.jwks(now)``), so an old key
leaves the set when its overlap ends, without a restart. The route sits beside the MCP
endpoint, outside the SDK's bearer auth (which wraps that endpoint alone): a public key is
public, and a gateway fetches it before it has any token. A plain ASGI app, which the
Starlette router runs as a route's endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import datetime
from typing import Any, Final

from agentwake.identity import JWKS_PATH, ServerIdentity

# Long enough to spare the server a fetch per delivery, short against the days of a rotation's overlap.
JWKS_MAX_AGE_S: Final = 300

Message = MutableMapping[str, Any]


class JwksEndpoint:
    """The ASGI endpoint answering GET (and HEAD) with ``identity``'s JWKS as of the request."""

    def __init__(self, identity: ServerIdentity, now: Callable[[], datetime]) -> None:
        self.identity = identity
        self.now = now

    async def __call__(
        self,
        scope: Message,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        body = json.dumps(self.identity.jwks(self.now()), separators=(",", ":")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"cache-control", f"max-age={JWKS_MAX_AGE_S}".encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope.get("method") == "HEAD" else body})


def add_jwks_route(app: Any, identity: ServerIdentity, now: Callable[[], datetime]) -> None:
    """Serve ``identity``'s JWKS on the Starlette ``app`` (GET and HEAD; other methods get 405)."""
    app.router.add_route(JWKS_PATH, JwksEndpoint(identity, now), methods=["GET"])
