"""The real webhook receiver in a process of its own, that SIGKILLs itself at a chosen point of the commit.

    python tests/webhook_receiver_proc.py DB PORT CERT_PEM KILL

KILL is ``before_commit`` (die inside the store thread before the transaction),
``after_commit`` (die right after the transaction committed, before any 2xx), or
``none``. The subscription routed is ``tickets`` as id ``$HOOK_ID`` with secret
``$HOOK_SECRET``. Prints ``listening`` on stdout once it accepts connections.

Optional: ``$HOOK_NOFILE`` (``SOFT`` or ``SOFT:HARD``) is the open-file limit the process
sets before the receiver starts; ``$HOOK_CONFIG`` a JSON object of extra ``[webhook]`` keys;
``$HOOK_LOG`` a log level for the receiver's log on stderr. On SIGTERM it stops and prints
``{"counts": ...}`` (the receiver's counters) on stdout.
"""

from __future__ import annotations

import json
import logging
import os
import resource
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


def set_open_files_limit(value: str) -> None:
    soft, _, hard = value.partition(":")
    current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(soft), int(hard) if hard else current_hard))


async def main() -> None:
    if os.environ.get("HOOK_NOFILE"):
        set_open_files_limit(os.environ["HOOK_NOFILE"])
    if os.environ.get("HOOK_LOG"):
        logging.basicConfig(
            level=os.environ["HOOK_LOG"], stream=sys.stderr, format="%(levelname)s %(message)s"
        )
    db, port, cert = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    store = SqliteStore(await anyio.to_thread.run_sync(KillingCore.open, db))
    await store.register(KEY)
    routes = WebhookRoutes()
    routes.bind(os.environ["HOOK_ID"], KEY, [(os.environ["HOOK_SECRET"], None)])
    config = WebhookConfig(
        listen=f"127.0.0.1:{port}",
        public_url=f"https://127.0.0.1:{port}",
        tls_cert=cert,
        tls_key=cert,
        **json.loads(os.environ.get("HOOK_CONFIG") or "{}"),
    )
    receiver = Receiver(config, store, routes)
    try:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                await tg.start(receiver.serve)
                sys.stdout.write("listening\n")
                sys.stdout.flush()
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break
    finally:
        await store.close()
    sys.stdout.write(json.dumps({"counts": dict(receiver.counts)}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    anyio.run(main)
