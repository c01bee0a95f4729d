"""Server identity on the sending side, over real servers on loopback: the demo server started with
``--identity-key`` signs its verification POST and its deliveries with v1a beside the v1 HMACs, and
the key that verifies them is the one its own origin publishes at /.well-known/mcp-webhook-jwks.json
(fetched with no token, though the MCP endpoint requires one). Rotation: two keys, the newest signs,
both published during the overlap, the newest alone after it (and the retired one named once in the
log); in process, the overlap ends without a restart.

The demo runs as a subprocess (``python -m agentwake.demo``) delivering over TLS to the test's HTTPS
receiver (tests/_webhook_server_support.py's aiohttp ``Receiver``, trusting a throwaway CA). The v1a
signatures are checked twice: by ``agentwake.identity.verify_identity`` and by PyNaCl (libsodium).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import anyio.abc
import httpx
import nacl.exceptions
import nacl.signing
import pytest
import trustme
from _support import serving_mcp_http
from _webhook_server_support import Caller, FakeNow, Received, Receiver, Wire, new_secret, webhook_settings
from conftest import QUIET_DEMO, REPO
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agentwake.identity import (
    IDENTITY_KEY_ENV,
    JWKS_PATH,
    IdentityKey,
    PublicKey,
    ServerIdentity,
    identity_signatures,
    parse_jwks,
    signed_content,
    verify_identity,
    write_key_file,
)
from agentwake.server import EventsExtension

pytestmark = pytest.mark.anyio

TOKEN = "identity-s3cret"
WAIT = 20.0


# ---- the demo server as a subprocess ----------------------------------------------------------------


@dataclass
class Demo:
    process: anyio.abc.Process
    port: int
    stderr: bytearray

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def until_stderr(self, text: str) -> str:
        """The demo's stderr so far, once it holds ``text``."""
        assert self.process.stderr is not None
        with anyio.fail_after(WAIT):
            while text.encode() not in self.stderr:
                self.stderr += await self.process.stderr.receive()
        return self.stderr.decode()

    async def stop(self) -> str:
        """Kill the demo; all it wrote on stderr."""
        self.process.kill()
        assert self.process.stderr is not None
        with anyio.CancelScope(shield=True):
            async for chunk in self.process.stderr:
                self.stderr += chunk
            await self.process.wait()
            await self.process.aclose()
        return self.stderr.decode()


@asynccontextmanager
async def demo_server(folder: Path, *args: str, **env: str) -> AsyncIterator[Demo]:
    environment = {**os.environ, **QUIET_DEMO, "DEMO_DB": str(folder / "demo.db"), **env}
    environment.pop(IDENTITY_KEY_ENV, None)
    process = await anyio.open_process(
        [sys.executable, "-m", "agentwake.demo", "--http", "127.0.0.1:0", *args], cwd=REPO, env=environment
    )
    demo = Demo(process, 0, bytearray())
    try:
        text = await demo.until_stderr("listening on http://")
        line = next(x for x in text.splitlines() if "listening on http://" in x)
        demo.port = int(line.rsplit(":", 1)[1].split("/")[0])
        yield demo
    finally:
        if demo.process.returncode is None:
            await demo.stop()


@pytest.fixture
def ca_file(tmp_path: Path) -> tuple[trustme.CA, Path]:
    ca = trustme.CA()
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, path


def webhook_env(ca_path: Path, **extra: str) -> dict[str, str]:
    return {
        "DEMO_WEBHOOK_TTL_MS": "60000",
        "DEMO_WEBHOOK_MIN_TTL_MS": "500",
        "DEMO_WEBHOOK_ALLOW": "127.0.0.0/8",
        "DEMO_WEBHOOK_CA": str(ca_path),
        **extra,
    }


def key_file(folder: Path, kid: str, created: datetime | None = None) -> tuple[IdentityKey, Path]:
    key = IdentityKey.generate(kid, now=created)
    path = folder / f"{kid}.jwk"
    write_key_file(path, key)
    return key, path


async def fetch_jwks(origin: str, **headers: str) -> tuple[httpx.Response, list[PublicKey]]:
    async with httpx.AsyncClient() as http:
        response = await http.get(origin + JWKS_PATH, headers=headers)
    assert response.status_code == 200, response.text
    return response, parse_jwks(response.content)


# ---- checking a delivery's signatures ----------------------------------------------------------------


def versions(received: Received) -> list[str]:
    return [entry.partition(",")[0] for entry in received.headers["webhook-signature"].split(" ")]


def signed_by(received: Received, keys: list[PublicKey]) -> PublicKey | None:
    headers = received.headers
    return verify_identity(
        keys, headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"], received.body
    )


def libsodium_verifies(received: Received, key: PublicKey) -> bool:
    """PyNaCl's verdict on the v1a signature, under the key's published x."""
    x = key.to_jwk()["x"]
    verify_key = nacl.signing.VerifyKey(base64.urlsafe_b64decode(x + "=" * (-len(x) % 4)))
    (signature,) = identity_signatures(received.headers["webhook-signature"])
    content = signed_content(
        received.headers["webhook-id"], received.headers["webhook-timestamp"], received.body
    )
    try:
        verify_key.verify(content, signature)
    except nacl.exceptions.BadSignatureError:
        return False
    return True


async def deliver_one_ticket(demo: Demo, receiver: Receiver, secret: str) -> tuple[Received, Received]:
    """Subscribe (as the demo's token holder), open a ticket: the verification POST and the delivery."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http,
        Client(streamable_http_client(demo.origin + "/mcp", http_client=http)) as client,
    ):
        wire = Wire(client, Caller())
        await wire.subscribe("ticket.created", receiver.url(), secret, {"queue": "billing"}, ttlMs=60_000)
        await client.call_tool("create_ticket", {"queue": "billing", "priority": "P2", "title": "Refund"})
        delivered = await receiver.next("event")
        await wire.unsubscribe("ticket.created", receiver.url(), {"queue": "billing"})
    (challenge,) = receiver.of("verification")
    return challenge, delivered


# ---- the demo server ----------------------------------------------------------------------------------


async def test_the_demo_signs_its_verification_and_deliveries_with_the_key_its_origin_publishes(
    tmp_path: Path, ca_file: tuple[trustme.CA, Path]
) -> None:
    ca, ca_path = ca_file
    key, path = key_file(tmp_path, "demo-2026")
    secret = new_secret()
    async with (
        Receiver(ca) as receiver,
        demo_server(tmp_path, "--identity-key", str(path), DEMO_TOKEN=TOKEN, **webhook_env(ca_path)) as demo,
    ):
        response, published = await fetch_jwks(demo.origin)
        challenge, delivered = await deliver_one_ticket(demo, receiver, secret)
        stderr = await demo.stop()

    assert response.headers["content-type"] == "application/json"
    assert response.headers["cache-control"] == "max-age=300"
    assert [k.kid for k in published] == ["demo-2026"]
    assert published[0].to_jwk() == key.public.to_jwk()
    for received in (challenge, delivered):
        # The HMACs first, then exactly one v1a; the HMAC still verifies for a receiver that ignores v1a.
        assert versions(received)[-1] == "v1a" and versions(received).count("v1a") == 1
        assert versions(received)[:-1] and set(versions(received)[:-1]) == {"v1"}
        received.verify(secret)
        assert signed_by(received, published) == published[0]
        assert libsodium_verifies(received, published[0])
    assert delivered.document["data"]["queue"] == "billing"
    private = json.loads(path.read_text())["d"]
    assert private not in stderr and "past its overlap" not in stderr


async def test_the_jwks_needs_no_token_while_the_mcp_endpoint_requires_one(
    tmp_path: Path, ca_file: tuple[trustme.CA, Path]
) -> None:
    _, ca_path = ca_file
    _, path = key_file(tmp_path, "public")
    async with demo_server(
        tmp_path, "--identity-key", str(path), DEMO_TOKEN=TOKEN, **webhook_env(ca_path)
    ) as demo:
        _, anonymous = await fetch_jwks(demo.origin)
        _, wrong_token = await fetch_jwks(demo.origin, Authorization="Bearer not-the-token")
        async with httpx.AsyncClient() as http:
            mcp = await http.post(demo.origin + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            head = await http.head(demo.origin + JWKS_PATH)
            post = await http.post(demo.origin + JWKS_PATH, content=b"{}")
    assert mcp.status_code == 401
    assert [k.kid for k in anonymous] == [k.kid for k in wrong_token] == ["public"]
    assert head.status_code == 200 and head.content == b""
    assert post.status_code == 405


async def test_during_a_rotation_the_demo_publishes_both_keys_and_signs_with_the_newest(
    tmp_path: Path, ca_file: tuple[trustme.CA, Path]
) -> None:
    ca, ca_path = ca_file
    now = datetime.now(UTC)
    old, old_path = key_file(tmp_path, "old", now - timedelta(days=30))
    new, new_path = key_file(tmp_path, "new", now - timedelta(days=1))
    secret = new_secret()
    flags = ("--identity-key", str(new_path), "--identity-key", str(old_path))
    async with (
        Receiver(ca) as receiver,
        demo_server(tmp_path, *flags, DEMO_TOKEN=TOKEN, **webhook_env(ca_path)) as demo,
    ):
        _, published = await fetch_jwks(demo.origin)
        challenge, delivered = await deliver_one_ticket(demo, receiver, secret)

    assert [k.kid for k in published] == ["new", "old"]
    by_kid = {k.kid: k for k in published}
    assert by_kid["new"].to_jwk() == new.public.to_jwk() and by_kid["old"].to_jwk() == old.public.to_jwk()
    for received in (challenge, delivered):
        assert signed_by(received, published) == by_kid["new"]
        assert signed_by(received, [by_kid["old"]]) is None
        assert libsodium_verifies(received, by_kid["new"])
        assert not libsodium_verifies(received, by_kid["old"])


async def test_after_the_overlap_the_demo_publishes_the_newest_alone_and_names_the_retired_key_once(
    tmp_path: Path, ca_file: tuple[trustme.CA, Path]
) -> None:
    _, ca_path = ca_file
    now = datetime.now(UTC)
    _, old_path = key_file(tmp_path, "old", now - timedelta(days=30))
    _, new_path = key_file(tmp_path, "new", now - timedelta(days=1))
    flags = (
        "--identity-key",
        str(old_path),
        "--identity-key",
        str(new_path),
        "--identity-overlap-hours",
        "12",
    )
    async with demo_server(tmp_path, *flags, **webhook_env(ca_path)) as demo:
        _, published = await fetch_jwks(demo.origin)
        await demo.until_stderr("past its overlap")
        stderr = await demo.stop()

    assert [k.kid for k in published] == ["new"]
    warnings = [line for line in stderr.splitlines() if "past its overlap" in line]
    assert warnings == [
        "demo_server WARNING identity key 'old' is past its overlap: it no longer signs and is no longer"
        " published; remove it from the configuration"
    ]
    for path in (old_path, new_path):
        assert json.loads(path.read_text())["d"] not in stderr


async def test_a_bridge_started_with_identity_keys_serves_their_jwks_at_its_mcp_origin(
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    old, old_path = key_file(tmp_path, "bridge-old", now - timedelta(days=3))
    new, new_path = key_file(tmp_path, "bridge-new", now - timedelta(hours=1))
    environment = {**os.environ, "GITHUB_TOKEN": ""}
    environment.pop(IDENTITY_KEY_ENV, None)
    command = [
        sys.executable,
        "-m",
        "agentwake.cli",
        "bridge",
        "github",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    command += [
        "--http",
        "127.0.0.1:0",
        "--no-auth",
        "--identity-key",
        str(old_path),
        "--identity-key",
        str(new_path),
    ]
    process = await anyio.open_process(command, cwd=tmp_path, env=environment)
    demo = Demo(process, 0, bytearray())
    try:
        text = await demo.until_stderr("MCP on http://")
        line = next(x for x in text.splitlines() if "MCP on http://" in x)
        demo.port = int(line.rsplit(":", 1)[1].split("/")[0])
        response, published = await fetch_jwks(demo.origin)
    finally:
        stderr = await demo.stop()
    assert [k.kid for k in published] == ["bridge-new", "bridge-old"]
    assert [k.to_jwk() for k in published] == [new.public.to_jwk(), old.public.to_jwk()]
    assert response.headers["cache-control"] == "max-age=300"
    for path in (old_path, new_path):
        assert json.loads(path.read_text())["d"] not in stderr


# ---- in process: the overlap ends while the server runs -----------------------------------------------


async def test_the_jwks_is_computed_per_request_so_the_overlap_ends_without_a_restart(
    ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeNow()
    old = IdentityKey.generate("old", now=clock.value - timedelta(days=2))
    new = IdentityKey.generate("new", now=clock.value - timedelta(minutes=30))
    identity = ServerIdentity((old, new), overlap=timedelta(hours=1))
    events = EventsExtension(now=clock, webhook=webhook_settings(ca, identity=identity))
    with caplog.at_level(logging.WARNING, logger="agentwake.server._webhook"):
        async with serving_mcp_http(events, "identity") as origin:
            _, during = await fetch_jwks(origin)
            clock.advance(hours=1)
            response, after = await fetch_jwks(origin)
    assert [k.kid for k in during] == ["new", "old"]
    assert [k.kid for k in after] == ["new"]
    assert response.headers["cache-control"] == "max-age=300"
    # At start-up the old key was still in its overlap: nothing to warn about.
    assert not [r for r in caplog.records if "past its overlap" in r.getMessage()]


async def test_without_an_identity_the_well_known_path_is_not_found(ca: trustme.CA) -> None:
    for events in (EventsExtension(webhook=webhook_settings(ca)), EventsExtension()):
        async with serving_mcp_http(events, "identity") as origin, httpx.AsyncClient() as http:
            response = await http.get(origin + JWKS_PATH)
        assert response.status_code == 404


async def test_a_retired_key_is_warned_about_once_at_start_up_by_kid_only(
    ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    old = IdentityKey.generate("retired-kid", now=now - timedelta(days=30))
    new = IdentityKey.generate("current", now=now - timedelta(days=10))
    events = EventsExtension(webhook=webhook_settings(ca, identity=ServerIdentity((old, new))))
    with caplog.at_level(logging.WARNING, logger="agentwake.server._webhook"):
        async with events.running():
            pass
    warned = [r.getMessage() for r in caplog.records if "past its overlap" in r.getMessage()]
    assert warned == [
        "identity key 'retired-kid' is past its overlap: it no longer signs and is no longer published;"
        " remove it from the configuration"
    ]
    assert old.to_private_jwk()["d"] not in caplog.text and old.to_private_jwk()["x"] not in caplog.text
