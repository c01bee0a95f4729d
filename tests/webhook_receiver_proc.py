"""The real webhook receiver in a process of its own, that SIGKILLs itself at a chosen point of the commit.

    python tests/webhook_receiver_proc.py DB PORT CERT_PEM KILL

KILL is ``before_commit`` (die inside the store thread before the transaction),
``after_commit`` (die right after the transaction committed, before any 2xx), or
``none``. The subscription routed is ``tickets`` as id ``$HOOK_ID`` with secret
``$HOOK_SECRET``. Prints ``listening`` on stdout once it accepts connections.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from agentwake.config import WebhookConfig
from agentwake.delivery.receiver import Receiver, WebhookRoutes
from agentwake.store import IngestResult, SubscriptionKey, WebhookDelivery
from agentwake.store.sqlite import SqliteCore, SqliteStore

KEY = SubscriptionKey("tickets", "demo", "ticket.created", {})
KILL = sys.argv[4] if len(sys.argv) > 4 else "none"


class KillingCore(SqliteCore):
    def ingest_deliveries(self, deliveries: Sequence[WebhookDelivery]) -> list[IngestResult]:
        if KILL == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        results = super().ingest_deliveries(deliveries)
        if KILL == "after_commit":
            os.kill(os.getpid(), signal.SIGKILL)
        return results


async def main() -> None:
    db, port, cert = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    store = SqliteStore(await anyio.to_thread.run_sync(KillingCore.open, db))
    await store.register(KEY)
    routes = WebhookRoutes()
    routes.bind(os.environ["HOOK_ID"], KEY, [(os.environ["HOOK_SECRET"], None)])
    config = WebhookConfig(
        listen=f"127.0.0.1:{port}", public_url=f"https://127.0.0.1:{port}", tls_cert=cert, tls_key=cert
    )
    receiver = Receiver(config, store, routes)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(receiver.serve)
            sys.stdout.write("listening\n")
            sys.stdout.flush()
    finally:
        await store.close()


if __name__ == "__main__":
    anyio.run(main)
