"""The server identity's JWKS route on the Streamable HTTP app: ``GET /.well-known/mcp-webhook-jwks.json``.

The keys listed are computed on each request (``ServerIdentity.jwks(now)``), so an old key
leaves the set when its overlap ends, without a restart. The route sits beside the MCP
endpoint, outside the SDK's bearer auth (which wraps that endpoint alone): a public key is
public, and a gateway fetches it before it has any token.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentwake.identity import JWKS_PATH, ServerIdentity

# Long enough to spare the server a fetch per delivery, short against the days of a rotation's overlap.
JWKS_MAX_AGE_S: Final = 300


def jwks_route(identity: ServerIdentity, now: Callable[[], datetime]) -> Route:
    """The GET route serving ``identity``'s JWKS as of each request."""

    async def jwks(request: Request) -> JSONResponse:
        return JSONResponse(
            identity.jwks(now()),
            headers={"Cache-Control": f"max-age={JWKS_MAX_AGE_S}"},
        )

    return Route(JWKS_PATH, jwks, methods=["GET"])
