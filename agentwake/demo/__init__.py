"""A demo MCP Events server: a small help desk with tickets, alerts and a load gauge.

    agentwake-demo                                  # stdio (also: python -m agentwake.demo)
    agentwake-demo --http 127.0.0.1:8765            # Streamable HTTP at /mcp

It ships in the wheel, as the ``agentwake-demo`` program, so a config made by ``agentwake init``
works in any folder; ``python -m examples.demo_server`` runs the same code from a checkout.

    store       the durable ticket store (TicketStore) and random tickets
    server      the MCP server, its events, tools, generators and command line

Event types (each offers poll and push delivery, and webhook when DEMO_WEBHOOK_TTL_MS is set):
  ticket.created  replayable; backed by a durable SQLite file, cursor = ticket sequence number
                  (push streams and webhook subscriptions check the store every nextPollMs, and
                  at once when this server creates a ticket)
  alert.fired     emit-only; generated on a timer, served from the ring buffer
  system.load     emit-only with no replay (cursor is always null)

Tools let an agent act: list_tickets, get_ticket, create_ticket, add_comment,
close_ticket, get_alert, acknowledge_alert.

Settings come from flags or the environment (flags win):
  DEMO_DB              SQLite file for tickets (default demo.db)
  DEMO_RATE            new tickets per second, 0 = none (default 0.5)
  DEMO_BACKLOG         tickets the store holds at least, created at start-up (default 0)
  DEMO_ALERT_INTERVAL  seconds between alerts, 0 = none (default 5)
  DEMO_LOAD_INTERVAL   seconds between load samples, 0 = none (default 3)
  DEMO_NEXT_POLL_MS    nextPollMs the server recommends (default 1000)
  DEMO_HEARTBEAT_MS    how long a push stream (events/stream) stays silent before a heartbeat,
                       in ms (default 30000, at most 30000; larger values are capped)
  DEMO_CURSOR_LOG      when set, a file to append one JSON line to per cursor a client asks
                       ticket.created from: each events/poll, each events/stream's opening read,
                       each new webhook subscription's (at, server_pid, client_pid: over stdio the
                       process that started this server, mode, arguments, cursor); off by default
  DEMO_TOKEN           when set, HTTP requests need "Authorization: Bearer <token>" (401 otherwise),
                       checked by the SDK's bearer auth; the caller is then the principal "demo-user"

Webhook delivery (events/subscribe) needs an authenticated principal, so it is only usable over
HTTP with DEMO_TOKEN set (stdio has no principal: subscribe answers Forbidden there):
  DEMO_WEBHOOK_TTL_MS      the longest TTL granted, in ms; setting it turns webhook delivery on
                           (unset: no webhook)
  DEMO_WEBHOOK_MIN_TTL_MS  the shortest TTL granted, in ms (default 1000)
  DEMO_WEBHOOK_ALLOW       comma-separated CIDR blocks the SSRF guard lets callbacks reach
                           (e.g. 127.0.0.0/8 for a receiver on this machine; default none)
  DEMO_WEBHOOK_CA          a PEM CA bundle trusted for callback TLS, besides the system store
  DEMO_WEBHOOK_RETRY_S     the first retry backoff of a failed delivery, in seconds (default 1)
  DEMO_WEBHOOK_STORE       SQLite file for webhook subscriptions; with it, subscriptions survive a
                           restart and ttlMs: null is granted as no expiry

Server identity (optional, with webhook delivery): --identity-key FILE (a key from ``agentwake
keygen``; repeat the flag to rotate, the newest key signs) or AGENTWAKE_IDENTITY_KEY (one private
JWK, or a JSON list of them) signs every delivery and verification POST with ed25519 as well
(``v1a,`` beside the HMAC's ``v1,``), and over HTTP the public keys are served at
/.well-known/mcp-webhook-jwks.json (no token needed). An older key stays published for
--identity-overlap-hours (default 168) after the newest was made.
"""

from agentwake.demo.server import (
    ALERT_INPUT_SCHEMA,
    DEFAULT_WEBHOOK_MIN_TTL_MS,
    DEFAULT_WEBHOOK_RETRY_S,
    DEMO_CLIENT_ID,
    DEMO_ISSUER_URL,
    DEMO_PRINCIPAL,
    TICKET_INPUT_SCHEMA,
    TICKET_PAYLOAD_SCHEMA,
    DemoServer,
    DemoSettings,
    DemoTokenVerifier,
    cidr_list,
    heartbeat_ms,
    main,
    parse_args,
    webhook_settings,
)
from agentwake.demo.store import PRIORITIES, QUEUES, SERVICES, TITLES, TicketStore, random_ticket

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
