"""``agentwake bridge slack``: Slack's Events API or Socket Mode as MCP events, with Slack tools.

The signing secret and both tokens come only from environment variables the flags name
(``--signing-secret-env``, ``--bot-token-env``, ``--app-token-env``), so they never show in
a process listing or a config file. Socket Mode runs where the framework runs a poller.
"""

from __future__ import annotations

import dataclasses
import os
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


@bridge_app.command("slack")
def slack(
    state_dir: StateDir = Path(".agentwake-bridge/slack"),
    http: Http = None,
    mcp_token_env: McpTokenEnv = None,
    no_auth: NoAuth = False,
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
    approvals_url: Annotated[
        str | None,
        typer.Option(
            "--approvals-url",
            metavar="URL",
            help="agentwake's operator endpoint ([service] listen, e.g. http://127.0.0.1:9464): post its"
            " held events to --approvals-channel with Approve and Deny buttons, answered through it.",
        ),
    ] = None,
    approvals_token_env: Annotated[
        str,
        typer.Option(
            "--approvals-token-env",
            metavar="VAR",
            help="The variable holding the operator endpoint's token ([service] token_env).",
        ),
    ] = "AGENTWAKE_TOKEN",
    approvals_channel: Annotated[
        str | None,
        typer.Option(
            "--approvals-channel",
            metavar="CHANNEL_ID",
            help="The channel held events are posted in (needed with --approvals-url).",
        ),
    ] = None,
    approver: Annotated[
        list[str],
        typer.Option(
            "--approver",
            metavar="USER_ID",
            help="A Slack user id whose clicks count (repeatable; needed with --approvals-url)."
            " Anyone else's click changes nothing.",
        ),
    ] = [],  # noqa: B006
    approvals_rule: Annotated[
        list[str],
        typer.Option(
            "--approvals-rule",
            metavar="GLOB",
            help="Post only events held by rules matching this glob (repeatable; default: every rule).",
        ),
    ] = [],  # noqa: B006
    approvals_interval: Annotated[
        float,
        typer.Option(
            "--approvals-interval",
            metavar="SECONDS",
            help="How often the operator endpoint is asked for newly held events.",
        ),
    ] = 5.0,
    interactions_path: Annotated[
        str,
        typer.Option(
            "--interactions-path",
            metavar="PATH",
            help="Where button clicks are received on --listen (the app's Interactivity request URL).",
        ),
    ] = "/slack/interactions",
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
    fake: Annotated[bool, fake_option("Slack", "app_mention", "slack")] = False,
) -> None:
    """Serve Slack as MCP events (from its Events API or over Socket Mode), with Slack tools."""
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
        poll=socket_mode,
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
    secret = os.environ.get(signing_secret_env) if listen else None
    if listen and not secret and not fake:
        raise fail(
            f"--listen needs the signing secret in ${signing_secret_env} (--signing-secret-env)", code=2
        )
    app_token = os.environ.get(app_token_env) if socket_mode else None
    if socket_mode and not app_token and not fake:
        raise fail(f"--socket-mode needs the app-level token in ${app_token_env} (--app-token-env)", code=2)
    bot_token = os.environ.get(bot_token_env) or None

    from agentwake.bridges.slack import SlackBridge, SlackSettings
    from agentwake.bridges.slack_approvals import ApprovalSettings

    approvals = None
    if approvals_url is not None:
        approvals_token = os.environ.get(approvals_token_env)
        if not approvals_token:
            raise fail(
                f"--approvals-url needs the operator endpoint's token in ${approvals_token_env}"
                " (--approvals-token-env)",
                code=2,
            )
        if not approvals_channel or not approver:
            raise fail("--approvals-url needs --approvals-channel and at least one --approver", code=2)
        try:
            approvals = ApprovalSettings(
                url=approvals_url,
                token=approvals_token,
                channel=approvals_channel,
                approvers=frozenset(approver),
                rules=tuple(approvals_rule),
                interval_s=approvals_interval,
            )
        except ValueError as exc:
            raise fail(str(exc), code=2) from None
    elif approvals_channel or approver or approvals_rule:
        raise fail("--approvals-channel, --approver and --approvals-rule need --approvals-url", code=2)

    settings = SlackSettings(
        signing_secret=secret.encode() if secret else None,
        bot_token=bot_token,
        app_token=app_token,
        api_base=api_base,
        ignore_other_bots=ignore_other_bots,
        approvals=approvals,
        interactions_path=interactions_path,
    )
    if fake:
        # The fake's own tokens replace these; Socket Mode is asked for by an app token being set.
        settings = dataclasses.replace(settings, app_token="fake" if socket_mode else None)
        serve_fake("slack", options, settings, secret)
        return
    warnings = []
    if not listen and not socket_mode:
        warnings.append("neither --listen nor --socket-mode: no Slack event will arrive, only the tools work")
    if approvals is not None and not listen and not socket_mode:
        warnings.append("--approvals-url without --listen or --socket-mode: no button click will arrive")
    if bot_token is None:
        warnings.append(f"no bot token in ${bot_token_env}: the tools will fail")
    serve_bridge(lambda: SlackBridge(options, settings), warnings)
