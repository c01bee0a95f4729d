"""Server identity on the receiving side: v1a (ed25519) checked against the keys the server's own origin
publishes, fetched with its configured headers, cached, refreshed once for a key rotated in.

The signing side here is PyNaCl (libsodium), an ed25519 independent of the ``cryptography`` the
receiver verifies with; the JWKS is written by hand from PyNaCl's key bytes. The server's origin is
a real aiohttp app on loopback; deliveries go through the real Receiver over TLS.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import nacl.signing
import pytest
from _webhook_support import KEY, SUB_ID, TLS, Hook, event, make_tls, running_hook, std_sign
from aiohttp import web

from agentwake import metrics, signing
from agentwake.config import ServerConfig, parse_config
from agentwake.delivery.identity import MIN_REFRESH_S, IdentityChecks, ServerKeys, jwks_url
from agentwake.errors import ConfigError
from agentwake.identity import JWKS_PATH
from agentwake.store import Store

pytestmark = pytest.mark.anyio

TOKEN = "Bearer identity-test-token"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLS:
    return make_tls(tmp_path_factory.mktemp("tls"))


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def jwk(kid: str, key: nacl.signing.SigningKey) -> dict[str, str]:
    return {"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64url(bytes(key.verify_key))}


def v1a(key: nacl.signing.SigningKey, msg_id: str, stamp: int, body: bytes) -> str:
    signature = key.sign(f"{msg_id}.{stamp}.".encode() + body).signature
    return "v1a," + base64.b64encode(signature).decode()


@dataclass
class Origin:
    """The server's origin: it serves the JWKS (only with the configured Authorization) and counts fetches."""

    keys: list[dict[str, str]]
    url: str = ""
    fetches: int = 0
    authorizations: list[str | None] = field(default_factory=list)
    redirect_to: str | None = None

    async def jwks(self, request: web.Request) -> web.StreamResponse:
        self.fetches += 1
        self.authorizations.append(request.headers.get("Authorization"))
        if self.redirect_to is not None:
            raise web.HTTPFound(self.redirect_to + JWKS_PATH)
        if request.headers.get("Authorization") != TOKEN:
            return web.Response(status=401)
        return web.json_response({"keys": self.keys}, headers={"Cache-Control": "max-age=300"})


@asynccontextmanager
async def serving(origin: Origin) -> AsyncIterator[Origin]:
    app = web.Application()
    app.router.add_get(JWKS_PATH, origin.jwks)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    origin.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield origin
    finally:
        await runner.cleanup()


def server_config(origin: Origin, mode: str) -> ServerConfig:
    return ServerConfig(url=f"{origin.url}/mcp", headers={"Authorization": TOKEN}, webhook_identity=mode)  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def checks(origin: Origin, mode: str, clock: Clock | None = None) -> IdentityChecks:
    keys = ServerKeys(KEY.server, server_config(origin, mode), mode, clock=clock or Clock())  # type: ignore[arg-type]
    return IdentityChecks({KEY.server: keys})


async def deliver(
    hook: Hook, event_id: str, *signers: nacl.signing.SigningKey, hmac_secret: str | None = None
) -> int:
    """POST one delivery signed with v1 (the subscription's secret) and a v1a per signer."""
    body = json.dumps(event(event_id, cursor=event_id))
    v1 = std_sign(hmac_secret or hook.secret, event_id, hook.now, body)
    header = " ".join([v1, *(v1a(key, event_id, hook.now, body.encode()) for key in signers)])
    reply = await hook.post(
        body.encode(),
        {
            "Content-Type": "application/json",
            signing.HEADER_ID: event_id,
            signing.HEADER_TIMESTAMP: str(hook.now),
            signing.HEADER_SIGNATURE: header,
            signing.HEADER_SUBSCRIPTION: SUB_ID,
        },
    )
    return reply.status


def stored(hook: Hook) -> list[str]:
    return hook.store.core.event_ids(KEY.name)


def refused(reason: str) -> float:
    return (
        metrics.REGISTRY.get_sample_value(
            "agentwake_webhook_identity_refused_total", {"server": KEY.server, "reason": reason}
        )
        or 0.0
    )


async def test_verify_accepts_a_v1a_from_a_published_key_and_refuses_a_forged_one(
    tls: TLS, store: Store
) -> None:
    server_key, forger = nacl.signing.SigningKey.generate(), nacl.signing.SigningKey.generate()
    before = refused("invalid")
    async with (
        serving(Origin([jwk("k1", server_key)])) as origin,
        running_hook(tls, store, identities=checks(origin, "verify")) as hook,
    ):
        assert await deliver(hook, "evt_good", server_key) == 204
        # The HMAC is right, the v1a is not the server's: a leaked secret is not enough.
        assert await deliver(hook, "evt_forged", forger) == 401
        # verify (not require): a delivery with no v1a at all is accepted on its HMAC.
        assert await deliver(hook, "evt_plain") == 204
        assert sorted(stored(hook)) == ["evt_good", "evt_plain"]
        assert hook.receiver.counts["identity_invalid"] == 1
        [row] = [r for r in store.core.subscriptions() if r["subscription"] == KEY.name]  # type: ignore[attr-defined]
        assert "webhook identity" in json.dumps(row["recent_errors"])
        # Fetched from the configured origin with the configured credentials: once for the first
        # delivery (then cached), and once more for the forged one (perhaps a key rotated in).
        assert origin.fetches == 2 and origin.authorizations == [TOKEN, TOKEN]
    assert refused("invalid") - before == 1


async def test_require_refuses_a_delivery_without_a_v1a_and_one_with_a_forged_v1a(
    tls: TLS, store: Store
) -> None:
    server_key, forger = nacl.signing.SigningKey.generate(), nacl.signing.SigningKey.generate()
    async with (
        serving(Origin([jwk("k1", server_key)])) as origin,
        running_hook(tls, store, identities=checks(origin, "require")) as hook,
    ):
        assert await deliver(hook, "evt_plain") == 401
        assert await deliver(hook, "evt_forged", forger) == 401
        assert await deliver(hook, "evt_good", server_key) == 204
        # Several signatures: one from the published key is enough.
        assert await deliver(hook, "evt_both", forger, server_key) == 204
        assert sorted(stored(hook)) == ["evt_both", "evt_good"]
        assert hook.receiver.counts["identity_missing"] == 1


async def test_a_key_rotated_in_is_fetched_once_and_unknown_keys_refetch_at_most_every_min_refresh(
    tls: TLS, store: Store
) -> None:
    old, new, unknown = (nacl.signing.SigningKey.generate() for _ in range(3))
    clock = Clock()
    async with (
        serving(Origin([jwk("old", old)])) as origin,
        running_hook(tls, store, identities=checks(origin, "require", clock)) as hook,
    ):
        assert await deliver(hook, "evt_1", old) == 204
        assert origin.fetches == 1
        # The server rotates: the new key is published beside the old, and signs from now on.
        origin.keys = [jwk("new", new), jwk("old", old)]
        assert await deliver(hook, "evt_2", new) == 204
        assert origin.fetches == 2
        # A key nobody publishes: one more look is rate-limited, so this costs no fetch yet.
        clock.now += 1
        assert await deliver(hook, "evt_3", unknown) == 401
        assert origin.fetches == 2
        clock.now += MIN_REFRESH_S
        assert await deliver(hook, "evt_4", unknown) == 401
        assert origin.fetches == 3
        assert sorted(stored(hook)) == ["evt_1", "evt_2"]


async def test_keys_served_through_a_redirect_to_another_origin_are_never_fetched(
    tls: TLS, store: Store
) -> None:
    server_key = nacl.signing.SigningKey.generate()
    async with serving(Origin([jwk("k1", server_key)])) as elsewhere:
        async with serving(Origin([], redirect_to=elsewhere.url)) as origin:
            async with running_hook(tls, store, identities=checks(origin, "verify")) as hook:
                assert await deliver(hook, "evt_1", server_key) == 401
                assert hook.receiver.counts["identity_no_keys"] == 1
            assert origin.fetches == 2  # the first look, then one more for a key perhaps rotated in
        assert elsewhere.fetches == 0
    assert stored(hook) == []


async def test_a_verification_during_subscribe_is_identity_checked_too(tls: TLS, store: Store) -> None:
    server_key, forger = nacl.signing.SigningKey.generate(), nacl.signing.SigningKey.generate()
    async with (
        serving(Origin([jwk("k1", server_key)])) as origin,
        running_hook(tls, store, identities=checks(origin, "verify")) as hook,
    ):
        other = KEY.__class__("alerts", KEY.server, "alert.fired", {})
        secret = signing.generate_secret()
        hook.routes.begin_subscribe(other, [secret])
        for signer, expected in ((forger, 401), (server_key, 200)):
            body = json.dumps({"type": "verification", "challenge": "c-123"})
            v1 = std_sign(secret, "msg_v", hook.now, body)
            reply = await hook.post(
                body.encode(),
                {
                    "Content-Type": "application/json",
                    signing.HEADER_ID: "msg_v",
                    signing.HEADER_TIMESTAMP: str(hook.now),
                    signing.HEADER_SIGNATURE: f"{v1} {v1a(signer, 'msg_v', hook.now, body.encode())}",
                    signing.HEADER_SUBSCRIPTION: "sub_new",
                },
            )
            assert reply.status == expected
        assert reply.json() == {"challenge": "c-123"}


def test_the_jwks_is_on_the_origin_of_the_servers_url() -> None:
    assert jwks_url("https://mcp.example.com:8443/v1/mcp?x=1") == (
        "https://mcp.example.com:8443/.well-known/mcp-webhook-jwks.json"
    )
    assert jwks_url("http://127.0.0.1:9000/mcp") == "http://127.0.0.1:9000/.well-known/mcp-webhook-jwks.json"


def test_a_stdio_server_cannot_have_its_identity_checked() -> None:
    with pytest.raises(ConfigError, match="webhook_identity needs a Streamable HTTP server"):
        parse_config(
            {"servers": {"demo": {"command": "agentwake-demo", "webhook_identity": "verify"}}}, env={}
        )
    config = parse_config(
        {"servers": {"demo": {"url": "https://mcp.example.com/mcp", "webhook_identity": "require"}}}, env={}
    )
    assert config.servers["demo"].webhook_identity == "require"
    assert set(IdentityChecks.from_config(config.servers).servers) == {"demo"}


def test_a_reload_keeps_the_keys_of_an_unchanged_server_and_follows_a_changed_one() -> None:
    servers = {
        "a": ServerConfig(url="https://a.example/mcp", webhook_identity="verify"),
        "b": ServerConfig(url="https://b.example/mcp", webhook_identity="require"),
    }
    before = IdentityChecks.from_config(servers)
    after = before.reloaded(
        {
            "a": servers["a"],
            "b": ServerConfig(url="https://b.example/mcp", webhook_identity="off"),
            "c": ServerConfig(url="https://c.example/mcp", webhook_identity="verify"),
        }
    )
    assert set(after.servers) == {"a", "c"}
    assert after.servers["a"] is before.servers["a"]  # its cached keys stay
    again = after.reloaded({"a": ServerConfig(url="https://a.example/mcp", webhook_identity="require")})
    assert again.servers["a"] is not after.servers["a"] and again.servers["a"].mode == "require"
