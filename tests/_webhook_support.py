"""Helpers for the webhook receiver tests: a real Receiver over real TLS on loopback, and a signing sender.

Deliveries are signed with the ``standardwebhooks`` reference library (interop), or with a
raw HMAC where a test needs a malformed header or a body that is not text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import trustme
from aiohttp import web
from standardwebhooks import Webhook

from agentwake import signing
from agentwake.config import WebhookConfig
from agentwake.delivery.identity import IdentityChecks
from agentwake.delivery.receiver import OnTerminated, Receiver, WebhookRoutes
from agentwake.errors import StoreError
from agentwake.store import Store, SubscriptionKey, WebhookDelivery
from agentwake.store.sqlite import SqliteStore

SUB_ID = "sub_abc"
KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})


@dataclass(frozen=True)
class TLS:
    """A throwaway CA, a certificate for 127.0.0.1 (key and chain in one PEM file), a client trusting the CA."""

    ca: trustme.CA
    pem: Path
    client_context: ssl.SSLContext


def make_tls(directory: Path) -> TLS:
    ca = trustme.CA()
    pem = directory / "receiver.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    context = ssl.create_default_context()  # hostname checked, certificate required
    ca.configure_trust(context)
    return TLS(ca, pem, context)


def webhook_config(tls: TLS, *, listen: str = "127.0.0.1:0", **overrides: Any) -> WebhookConfig:
    return WebhookConfig(
        listen=listen,
        public_url="https://127.0.0.1:8787",
        tls_cert=tls.pem,
        tls_key=tls.pem,
        **overrides,
    )


def event(event_id: str = "evt_1", cursor: str | None = "c1", **extra: Any) -> dict[str, Any]:
    """An EventOccurrence body, as a server delivers it."""
    return {
        "eventId": event_id,
        "name": "ticket.created",
        "timestamp": "2026-02-19T16:00:00Z",
        "data": {"ticket": event_id},
        "cursor": cursor,
        **extra,
    }


def std_sign(secret: str, msg_id: str, stamp: int, body: str) -> str:
    """The webhook-signature header as the standardwebhooks reference library writes it."""
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, UTC), body)


def raw_signature(secret: str, msg_id: str, stamp: int | str, body: bytes) -> str:
    """The base64 HMAC alone (no ``v1,``), computed by hand over raw bytes."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


@dataclass(frozen=True)
class Reply:
    status: int
    reason: str
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class MeteredReceiver(Receiver):
    """A Receiver that records, for each body it reads, how many bytes it took from the request stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.consumed: list[int] = []

    async def _read_body(self, request: web.BaseRequest) -> bytes | None:
        meter = _Meter(request.content)
        try:
            return await super()._read_body(_MeteredRequest(meter, request.content_length))  # type: ignore[arg-type]
        finally:
            self.consumed.append(meter.taken)


class _Meter:
    def __init__(self, stream: aiohttp.StreamReader) -> None:
        self._stream = stream
        self.taken = 0

    async def read(self, n: int = -1) -> bytes:
        chunk = await self._stream.read(n)
        self.taken += len(chunk)
        return chunk

    async def readexactly(self, n: int) -> bytes:
        chunk = await self._stream.readexactly(n)
        self.taken += len(chunk)
        return chunk

    def is_eof(self) -> bool:
        return self._stream.is_eof()

    def read_nowait(self, n: int = -1) -> bytes:
        chunk = self._stream.read_nowait(n)
        self.taken += len(chunk)
        return chunk


@dataclass(frozen=True)
class _MeteredRequest:
    content: _Meter
    content_length: int | None


class FailingStore(SqliteStore):
    """A Store whose inbox writes fail the way a full disk or a broken database does."""

    async def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[Any]:
        raise StoreError(f"store {self.path}: database or disk is full")


class GatedStore(SqliteStore):
    """A Store that records each group commit's size and holds the first one until ``gate`` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []
        self.gate = anyio.Event()

    async def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[Any]:
        self.batches.append(len(deliveries))
        if len(self.batches) == 1:
            await self.gate.wait()
        return await super().ingest_deliveries(deliveries)


class ArrivalCounter(MeteredReceiver):
    """A Receiver that sets ``all_arrived`` once ``expected`` requests have reached its handler."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expected = 1
        self.arrived = 0
        self.all_arrived = anyio.Event()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self.arrived += 1
        if self.arrived >= self.expected:
            self.all_arrived.set()
        return await super().handle(request)


@dataclass
class Hook:
    """A running receiver, its store and routes, and an HTTPS client that trusts its certificate."""

    receiver: MeteredReceiver
    store: Store
    routes: WebhookRoutes
    session: aiohttp.ClientSession
    secret: str
    now: int
    terminated: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.receiver.port}/{KEY.name}"

    def headers(
        self,
        body: str,
        *,
        msg_id: str = "evt_1",
        secret: str | None = None,
        stamp: int | None = None,
        sub_id: str = SUB_ID,
    ) -> dict[str, str]:
        """The four delivery headers, signed by the standardwebhooks library."""
        stamp = self.now if stamp is None else stamp
        return {
            "Content-Type": "application/json",
            signing.HEADER_ID: msg_id,
            signing.HEADER_TIMESTAMP: str(stamp),
            signing.HEADER_SIGNATURE: std_sign(secret or self.secret, msg_id, stamp, body),
            signing.HEADER_SUBSCRIPTION: sub_id,
        }

    async def post(self, data: Any, headers: Mapping[str, str], *, method: str = "POST") -> Reply:
        async with self.session.request(method, self.url, data=data, headers=dict(headers)) as response:
            body = await response.read()
            return Reply(response.status, response.reason or "", body, dict(response.headers))

    async def deliver(
        self,
        document: Any,
        *,
        msg_id: str | None = None,
        secret: str | None = None,
        stamp: int | None = None,
        sub_id: str = SUB_ID,
    ) -> Reply:
        """POST one signed delivery; ``msg_id`` defaults to the body's eventId (or a control message id)."""
        body = json.dumps(document)
        if msg_id is None:
            if isinstance(document, dict) and "eventId" in document:
                msg_id = str(document["eventId"])
            else:
                msg_id = f"msg_{document.get('type', 'x')}_1" if isinstance(document, dict) else "msg_1"
        headers = self.headers(body, msg_id=msg_id, secret=secret, stamp=stamp, sub_id=sub_id)
        return await self.post(body.encode(), headers)


@asynccontextmanager
async def running_hook(
    tls: TLS,
    store: Store,
    *,
    receiver_class: type[MeteredReceiver] = MeteredReceiver,
    on_terminated: OnTerminated | None = None,
    connections: int = 100,
    identities: IdentityChecks | None = None,
    **config: Any,
) -> AsyncIterator[Hook]:
    """Start a Receiver on a free loopback port with real TLS, route SUB_ID to KEY, and yield a Hook."""
    await store.register(KEY)
    routes = WebhookRoutes()
    secret = signing.generate_secret()
    routes.bind(SUB_ID, KEY, [(secret, None)])
    terminated: list[tuple[str, dict[str, Any]]] = []

    async def record_termination(name: str, error: dict[str, Any]) -> None:
        terminated.append((name, error))

    receiver = receiver_class(
        webhook_config(tls, **config),
        store,
        routes,
        on_terminated=on_terminated or record_termination,
        identities=identities,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(receiver.serve)
        connector = aiohttp.TCPConnector(ssl=tls.client_context, limit=connections)
        async with aiohttp.ClientSession(connector=connector) as session:
            hook = Hook(
                receiver, store, routes, session, secret, int(datetime.now(UTC).timestamp()), terminated
            )
            # The receiver's clock follows hook.now, so a test can move time without sleeping.
            receiver.clock = lambda: float(hook.now)
            yield hook
        tg.cancel_scope.cancel()


async def gather(*calls: Awaitable[Reply]) -> list[Reply]:
    """Run the calls concurrently; their replies in call order."""
    replies: list[Reply | None] = [None] * len(calls)

    async def one(index: int, call: Awaitable[Reply]) -> None:
        replies[index] = await call

    async with anyio.create_task_group() as tg:
        for index, call in enumerate(calls):
            tg.start_soon(one, index, call)
    return [reply for reply in replies if reply is not None]
