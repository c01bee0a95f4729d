"""``agentwake bridge slack``: Slack's Events API or Socket Mode as MCP events, with Slack tools.

The signing secret and both tokens come only from environment variables the flags name
(``--signing-secret-env``, ``--bot-token-env``, ``--app-token-env``), so they never show in
a process listing or a config file. Socket Mode runs where the framework runs a poller.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from agentwake.cli.bridge import (
    EventsWebhookAllow,
    EventsWebhookCa,
    EventsWebhookTtlMs,
    HeartbeatMs,
    Http,
    KeepRaw,
    Listen,
    LogLevel,
    MaxEvents,
    McpTokenEnv,
    NextPollMs,
    RetentionDays,
    StateDir,
    WebhookPath,
    _log_to_stderr,
    bridge_app,
    bridge_options,
    serve_bridge,
)
from agentwake.cli.common import fail


@bridge_app.command("slack")
def slack(
    state_dir: StateDir = Path(".agentwake-bridge/slack"),
    http: Http = None,
    mcp_token_env: McpTokenEnv = None,
    listen: Listen = None,
    webhook_path: WebhookPath = "/slack/events",
    signing_secret_env: Annotated[
        str,
        typer.Option(
            "--signing-secret-env",
            metavar="VAR",
            help="The variable holding the app's signing secret (needed with --listen).",
        ),
    ] = "SLACK_SIGNING_SECRET",
    socket_mode: Annotated[
        bool,
        typer.Option(
            "--socket-mode",
            help="Receive events over Socket Mode (no public URL needed) instead of (or as well as) --listen.",
        ),
    ] = False,
    app_token_env: Annotated[
        str,
        typer.Option(
            "--app-token-env",
            metavar="VAR",
            help="The variable holding the app-level token, xapp-... (needed with --socket-mode).",
        ),
    ] = "SLACK_APP_TOKEN",
    bot_token_env: Annotated[
        str,
        typer.Option(
            "--bot-token-env",
            metavar="VAR",
            help="The variable holding the bot token, xoxb-..., for the tools.",
        ),
    ] = "SLACK_BOT_TOKEN",
    api_base: Annotated[
        str,
        typer.Option(
            "--api-base",
            metavar="URL",
            envvar="AGENTWAKE_SLACK_API_BASE",
            help="The Web API's base URL (a fake Slack's, to try the bridge offline).",
        ),
    ] = "https://slack.com/api/",
    ignore_other_bots: Annotated[
        bool,
        typer.Option(
            "--ignore-other-bots/--keep-other-bots",
            help="Drop messages other apps posted; the app's own messages and reactions are always dropped.",
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
    log_level: LogLevel = "INFO",
) -> None:
    """Serve Slack as MCP events (from its Events API or over Socket Mode), with Slack tools."""
    _log_to_stderr(log_level)
    options = bridge_options(
        state_dir=state_dir,
        http=http,
        mcp_token_env=mcp_token_env,
        listen=listen,
        webhook_path=webhook_path,
        poll=socket_mode,
        next_poll_ms=next_poll_ms,
        heartbeat_ms=heartbeat_ms,
        max_events=max_events,
        retention_days=retention_days,
        keep_raw=keep_raw,
        events_webhook_allow=events_webhook_allow,
        events_webhook_ca=events_webhook_ca,
        events_webhook_ttl_ms=events_webhook_ttl_ms,
    )
    secret = os.environ.get(signing_secret_env) if listen else None
    if listen and not secret:
        raise fail(
            f"--listen needs the signing secret in ${signing_secret_env} (--signing-secret-env)", code=2
        )
    app_token = os.environ.get(app_token_env) if socket_mode else None
    if socket_mode and not app_token:
        raise fail(f"--socket-mode needs the app-level token in ${app_token_env} (--app-token-env)", code=2)
    bot_token = os.environ.get(bot_token_env) or None

    from agentwake.bridges.slack import SlackBridge, SlackSettings

    settings = SlackSettings(
        signing_secret=secret.encode() if secret else None,
        bot_token=bot_token,
        app_token=app_token,
        api_base=api_base,
        ignore_other_bots=ignore_other_bots,
    )
    warnings = []
    if not listen and not socket_mode:
        warnings.append("neither --listen nor --socket-mode: no Slack event will arrive, only the tools work")
    if bot_token is None:
        warnings.append(f"no bot token in ${bot_token_env}: the tools will fail")
    serve_bridge(lambda: SlackBridge(options, settings), warnings)
