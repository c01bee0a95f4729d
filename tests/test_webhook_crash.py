"""kill -9 of the receiver around the commit: an accepted delivery is never lost and never stored twice.

The receiver runs in its own process (tests/webhook_receiver_proc.py) and SIGKILLs
itself inside the store: right after the transaction committed (before the 2xx), or
before it. The sender sees no answer and retries, as a webhook sender does, with a
fresh timestamp and signature; the receiver, started again on the same port and
database, stores the retry once.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import anyio
import anyio.abc
import pytest
import trustme
from conftest import REPO, free_port

from agentwake import signing
from agentwake.store.sqlite import SqliteCore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
HOOK_ID = "sub_0123456789abcdef"
EVENT = {
    "eventId": "T-000001",
    "name": "ticket.created",
    "timestamp": "2026-12-02T12:00:00.000Z",
    "data": {"ticketId": "T-000001", "title": "Cannot log in"},
    "cursor": "1",
}


@asynccontextmanager
async def receiver_process(
    tmp_path: Path, port: int, cert: Path, secret: str, kill: str
) -> AsyncIterator[anyio.abc.Process]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOOK_ID": HOOK_ID, "HOOK_SECRET": secret}
    process = await anyio.open_process(
        [
            sys.executable,
            str(REPO / "tests" / "webhook_receiver_proc.py"),
            str(tmp_path / "aw.db"),
            str(port),
            str(cert),
            kill,
        ],
        env=env,
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            buffered = b""
            async for chunk in process.stdout:
                buffered += chunk
                if b"listening" in buffered:
                    break
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()


async def deliver(port: int, secret: str, context: ssl.SSLContext) -> int | None:
    """One attempt, signed afresh; None when the receiver died before answering."""
    body = json.dumps(EVENT).encode()
    stamp = int(time.time())
    headers = {
        "Content-Type": "application/json",
        signing.HEADER_ID: EVENT["eventId"],
        signing.HEADER_TIMESTAMP: str(stamp),
        signing.HEADER_SIGNATURE: signing.sign(
            [signing.decode_secret(secret)], EVENT["eventId"], stamp, body
        ),
        signing.HEADER_SUBSCRIPTION: HOOK_ID,
    }
    async with aiohttp.ClientSession() as http:
        try:
            async with http.post(
                f"https://127.0.0.1:{port}/tickets", data=body, headers=headers, ssl=context
            ) as r:
                return r.status
        except (aiohttp.ClientConnectionError, aiohttp.ServerDisconnectedError):
            return None


def stored(tmp_path: Path) -> tuple[list[str], int, str | None]:
    store = SqliteCore.open(tmp_path / "aw.db")
    try:
        [row] = store.subscriptions()
        return store.event_ids("tickets"), row["duplicates"], row["cursor"]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("kill", "kept_by_the_crash", "duplicates"),
    [("after_commit", ["T-000001"], 1), ("before_commit", [], 0)],
)
async def test_sigkill_around_the_commit_then_the_senders_retry_is_stored_exactly_once(
    tmp_path: Path, kill: str, kept_by_the_crash: list[str], duplicates: int
) -> None:
    ca = trustme.CA()
    cert = tmp_path / "cert.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    secret = signing.generate_secret()
    port = free_port()

    async with receiver_process(tmp_path, port, cert, secret, kill) as process:
        assert await deliver(port, secret, context) is None  # no 2xx: the sender must retry
        with anyio.fail_after(10):
            await process.wait()
        assert process.returncode == -9
    ids, _, _ = stored(tmp_path)
    assert ids == kept_by_the_crash

    async with receiver_process(tmp_path, port, cert, secret, "none"):
        assert await deliver(port, secret, context) == 204
    ids, counted_duplicates, cursor = stored(tmp_path)
    assert ids == ["T-000001"]
    assert counted_duplicates == duplicates
    assert cursor == "1"
