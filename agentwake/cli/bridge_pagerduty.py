"""``agentwake bridge pagerduty``: PagerDuty's incidents as MCP events, its incident actions as tools.

The common bridge options are agentwake.cli.bridge's; the PagerDuty ones take their defaults
from AGENTWAKE_PAGERDUTY_* variables. The webhook secret and the API key come only from the
environment, from the variables ``--webhook-secret-env`` and ``--api-key-env`` name.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer

from agentwake.cli.bridge import (
    DEFAULT_IDENTITY_OVERLAP_HOURS,
    EventsWebhookAllow,
    EventsWebhookCa,
    EventsWebhookTtlMs,
    HeartbeatMs,
    Http,
    IdentityKeyFiles,
    IdentityOverlapHours,
    KeepRaw,
    Listen,
    LogLevel,
    MaxEvents,
    McpTokenEnv,
    NextPollMs,
    NoAuth,
    Poll,
    RetentionDays,
    StateDir,
    WebhookPath,
    _log_to_stderr,
    bridge_app,
    bridge_options,
    fake_option,
    serve_bridge,
    serve_fake,
)
from agentwake.cli.common import fail


@bridge_app.command("pagerduty")
def pagerduty(
    state_dir: StateDir = Path(".agentwake-bridge/pagerduty"),
    http: Http = None,
    mcp_token_env: McpTokenEnv = None,
    no_auth: NoAuth = False,
    listen: Listen = None,
    webhook_path: WebhookPath = "/webhook",
    webhook_secret_env: Annotated[
        str,
        typer.Option(
            "--webhook-secret-env",
            metavar="VAR",
            help="The variable holding the webhook subscription's secret (needed with --listen); while"
            " rotating, the new and the old one, space-separated.",
        ),
    ] = "PAGERDUTY_WEBHOOK_SECRET",
    max_delivery_age_s: Annotated[
        float,
        typer.Option(
            "--max-delivery-age",
            metavar="SECONDS",
            min=60,
            help="A delivery whose event happened longer ago is refused as stale.",
        ),
    ] = 86_400,
    poll: Poll = False,
    poll_interval_s: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            metavar="SECONDS",
            min=1,
            help="Seconds between polls of the incidents and log entries; a rate limit may ask for more.",
        ),
    ] = 30,
    api_key_env: Annotated[
        str,
        typer.Option(
            "--api-key-env",
            metavar="VAR",
            help="The variable holding the PagerDuty REST API key for tools and polling.",
        ),
    ] = "PAGERDUTY_API_KEY",
    from_email: Annotated[
        str | None,
        typer.Option(
            "--from-email",
            metavar="EMAIL",
            envvar="AGENTWAKE_PAGERDUTY_FROM",
            help="The email of the PagerDuty user the tools act as (the From header; writes need it).",
        ),
    ] = None,
    api_base: Annotated[
        str,
        typer.Option(
            "--api-base",
            metavar="URL",
            envvar="AGENTWAKE_PAGERDUTY_API_BASE",
            help="The REST API's base URL (the EU service region: https://api.eu.pagerduty.com).",
        ),
    ] = "https://api.pagerduty.com",
    allow_tool: Annotated[
        list[str],
        typer.Option("--allow-tool", metavar="TOOL", help="Offer a tool that is off by default: resolve."),
    ] = [],  # noqa: B006
    ignore_own_actions: Annotated[
        bool,
        typer.Option(
            "--ignore-own-actions/--keep-own-actions",
            help="Drop events the bridge's own PagerDuty user caused (the agent's acknowledgements), so"
            " they cannot wake it again.",
        ),
    ] = True,
    next_poll_ms: NextPollMs = 2_000,
    heartbeat_ms: HeartbeatMs = 30_000,
    max_events: MaxEvents = 50_000,
    retention_days: RetentionDays = 7.0,
    keep_raw: KeepRaw = True,
    events_webhook_allow: EventsWebhookAllow = [],  # noqa: B006
    events_webhook_ca: EventsWebhookCa = None,
    events_webhook_ttl_ms: EventsWebhookTtlMs = 86_400_000,
    identity_key: IdentityKeyFiles = [],  # noqa: B006
    identity_overlap_hours: IdentityOverlapHours = DEFAULT_IDENTITY_OVERLAP_HOURS,
    log_level: LogLevel = "INFO",
    fake: Annotated[bool, fake_option("PagerDuty", "incident.triggered", "pagerduty")] = False,
) -> None:
    """Serve PagerDuty incidents as MCP events (from its V3 webhooks or by polling its API), with incident tools."""
    _log_to_stderr(log_level)
    if fake and listen is None:
        listen = "127.0.0.1:0"
    options = bridge_options(
        state_dir=state_dir,
        http=http,
        mcp_token_env=mcp_token_env,
        no_auth=no_auth,
        listen=listen,
        webhook_path=webhook_path,
        poll=poll,
        next_poll_ms=next_poll_ms,
        heartbeat_ms=heartbeat_ms,
        max_events=max_events,
        retention_days=retention_days,
        keep_raw=keep_raw,
        events_webhook_allow=events_webhook_allow,
        events_webhook_ca=events_webhook_ca,
        events_webhook_ttl_ms=events_webhook_ttl_ms,
        identity_key=identity_key,
        identity_overlap_hours=identity_overlap_hours,
    )
    from agentwake.bridges.pagerduty import PagerDutyBridge, PagerDutySettings

    secrets = (os.environ.get(webhook_secret_env) or "").split() if listen else []
    if listen and not secrets and not fake:
        raise fail(
            f"--listen needs the webhook secret in ${webhook_secret_env} (--webhook-secret-env)", code=2
        )
    api_key = os.environ.get(api_key_env) or None
    settings = PagerDutySettings(
        webhook_secrets=tuple(secret.encode() for secret in secrets),
        api_key=api_key,
        from_email=from_email or None,
        api_base=api_base,
        poll_interval_s=poll_interval_s,
        max_delivery_age=timedelta(seconds=max_delivery_age_s),
        allowed_tools=tuple(allow_tool),
        ignore_own_actions=ignore_own_actions,
    )
    if fake:
        serve_fake("pagerduty", options, settings, secrets[0] if secrets else None)
        return
    warnings = []
    if api_key is None:
        warnings.append(f"no PagerDuty API key in ${api_key_env}: the tools will fail")
    if not from_email:
        warnings.append("no --from-email: acknowledge, add_note, escalate and resolve will fail")
    serve_bridge(lambda: PagerDutyBridge(options, settings), warnings)
