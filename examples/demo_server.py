"""The demo help desk, run from a checkout: ``python -m examples.demo_server [--http HOST:PORT]``.

The code lives in the package (``agentwake.demo``) and ships in the wheel as the
``agentwake-demo`` program; this module re-exports it so the tests, the benchmarks and
``examples/webhook_demo.py`` keep importing and running it from here.
"""

from __future__ import annotations

from agentwake.demo import (
    ALERT_INPUT_SCHEMA,
    DEFAULT_WEBHOOK_MIN_TTL_MS,
    DEFAULT_WEBHOOK_RETRY_S,
    DEMO_CLIENT_ID,
    DEMO_ISSUER_URL,
    DEMO_PRINCIPAL,
    PRIORITIES,
    QUEUES,
    SERVICES,
    TICKET_INPUT_SCHEMA,
    TICKET_PAYLOAD_SCHEMA,
    TITLES,
    DemoServer,
    DemoSettings,
    DemoTokenVerifier,
    TicketStore,
    cidr_list,
    heartbeat_ms,
    main,
    parse_args,
    random_ticket,
    webhook_settings,
)

__all__ = [
    "ALERT_INPUT_SCHEMA",
    "DEFAULT_WEBHOOK_MIN_TTL_MS",
    "DEFAULT_WEBHOOK_RETRY_S",
    "DEMO_CLIENT_ID",
    "DEMO_ISSUER_URL",
    "DEMO_PRINCIPAL",
    "PRIORITIES",
    "QUEUES",
    "SERVICES",
    "TICKET_INPUT_SCHEMA",
    "TICKET_PAYLOAD_SCHEMA",
    "TITLES",
    "DemoServer",
    "DemoSettings",
    "DemoTokenVerifier",
    "TicketStore",
    "cidr_list",
    "heartbeat_ms",
    "main",
    "parse_args",
    "random_ticket",
    "webhook_settings",
]

if __name__ == "__main__":
    main()
