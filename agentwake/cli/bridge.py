"""``agentwake bridge NAME``: run a bridge, an MCP Events server for an upstream without one.

Options come from flags or from the environment variable each one names (AGENTWAKE_BRIDGE_*
for every bridge, AGENTWAKE_GITHUB_* for GitHub's own). With AGENTWAKE_NO_INGRESS=1 in its
environment (``agentwake check`` and the other short looks set it) a bridge serves its tools and
event types only: no --listen, no --poll, no Socket Mode. Secrets come only from the
environment, from variables the flags name (``--webhook-secret-env``, ``--token-env``,
``--mcp-token-env``), so they never show in a process listing or a config file.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from agentwake.cli.common import HELP_MARKUP, NO_INGRESS_ENV, HelpGroup, app, fail, run_async

if TYPE_CHECKING:
    from agentwake.bridges.framework import Bridge, BridgeOptions

bridge_app = typer.Typer(
    help="Run a bridge: an MCP Events server for an upstream (GitHub, PagerDuty, Slack) that has none of its own.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    cls=HelpGroup,
)
app.add_typer(bridge_app, name="bridge")

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        metavar="DIR",
        envvar="AGENTWAKE_BRIDGE_STATE_DIR",
        show_envvar=True,
        help="Folder for the bridge's event log and webhook subscriptions (SQLite). Created mode 0700;"
        " an existing one open to group or others is tightened to 0700.",
    ),
]
Http = Annotated[
    str | None,
    typer.Option(
        "--http",
        metavar="HOST:PORT",
        envvar="AGENTWAKE_BRIDGE_HTTP",
        help="Serve MCP over Streamable HTTP at http://HOST:PORT/mcp instead of stdio; needs"
        " --mcp-token-env, or --no-auth on a loopback address.",
    ),
]
McpTokenEnv = Annotated[
    str | None,
    typer.Option(
        "--mcp-token-env",
        metavar="VAR",
        help="With --http: the variable holding the bearer token MCP callers must send"
        " (webhook delivery needs an authenticated caller).",
    ),
]
NoAuth = Annotated[
    bool,
    typer.Option(
        "--no-auth",
        help="With --http on a loopback address (127.0.0.0/8, ::1, localhost) and no --mcp-token-env:"
        " serve MCP without a token, so any local process may call the tools. Refused on other addresses.",
    ),
]
Listen = Annotated[
    str | None,
    typer.Option(
        "--listen",
        metavar="HOST:PORT",
        envvar="AGENTWAKE_BRIDGE_LISTEN",
        help="Receive the upstream's webhooks here (POST on --webhook-path); port 0 picks a free one.",
    ),
]
WebhookPath = Annotated[
    str,
    typer.Option("--webhook-path", metavar="PATH", help="The path the upstream's webhooks are posted to."),
]
Poll = Annotated[
    bool,
    typer.Option("--poll", help="Poll the upstream's API instead of (or as well as) receiving webhooks."),
]
NextPollMs = Annotated[
    int,
    typer.Option(
        "--next-poll-ms",
        metavar="MS",
        min=100,
        help="The poll interval the bridge recommends to MCP clients.",
    ),
]
HeartbeatMs = Annotated[
    int,
    typer.Option("--heartbeat-ms", metavar="MS", min=1, max=30_000, help="Push stream heartbeat interval."),
]
MaxEvents = Annotated[
    int,
    typer.Option("--max-events", metavar="N", min=1, help="The event log keeps at most this many events."),
]
RetentionDays = Annotated[
    float,
    typer.Option("--retention-days", metavar="DAYS", min=0.01, help="The event log keeps events this long."),
]
KeepRaw = Annotated[
    bool,
    typer.Option(
        "--keep-raw/--no-keep-raw", help="Keep each event's raw upstream payload in the log (debugging)."
    ),
]
EventsWebhookAllow = Annotated[
    list[str],
    typer.Option(
        "--events-webhook-allow",
        metavar="CIDR",
        help="Networks MCP webhook delivery may reach despite the SSRF guard (e.g. 127.0.0.0/8 on one machine).",
    ),
]
EventsWebhookCa = Annotated[
    Path | None,
    typer.Option(
        "--events-webhook-ca", metavar="PEM", help="PEM CA bundle trusted for MCP webhook delivery's TLS."
    ),
]
EventsWebhookTtlMs = Annotated[
    int,
    typer.Option(
        "--events-webhook-ttl-ms",
        metavar="MS",
        min=1000,
        help="The longest MCP webhook subscription TTL granted.",
    ),
]
# agentwake.identity.DEFAULT_OVERLAP in hours (not imported here: --help loads no cryptography).
DEFAULT_IDENTITY_OVERLAP_HOURS: Final = 168.0
IdentityKeyFiles = Annotated[
    list[Path],
    typer.Option(
        "--identity-key",
        metavar="FILE",
        help="A server identity key (agentwake keygen): MCP webhook deliveries are signed with it as well"
        " (v1a, ed25519) and, with --http, its public key is served at /.well-known/mcp-webhook-jwks.json."
        " Repeat the flag to rotate: the newest key signs. Without the flag, the variable"
        " AGENTWAKE_IDENTITY_KEY may hold the key (one private JWK, or a JSON list of them).",
    ),
]
IdentityOverlapHours = Annotated[
    float,
    typer.Option(
        "--identity-overlap-hours",
        metavar="H",
        min=0,
        max=87_600,
        help="How long after the newest identity key was made the older ones stay published.",
    ),
]
LogLevel = Annotated[
    str,
    typer.Option(
        "--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR (the log goes to stderr)."
    ),
]


def secret_from(variable: str | None, *, flag: str) -> str | None:
    """The value of the environment variable a flag names; a named but unset variable is an error."""
    if variable is None:
        return None
    value = os.environ.get(variable)
    if not value:
        raise fail(f"{flag} names ${variable}, which is not set (or empty)", code=2)
    return value


def bridge_options(
    *,
    state_dir: Path,
    http: str | None,
    mcp_token_env: str | None,
    no_auth: bool,
    listen: str | None,
    webhook_path: str,
    poll: bool,
    next_poll_ms: int,
    heartbeat_ms: int,
    max_events: int,
    retention_days: float,
    keep_raw: bool,
    events_webhook_allow: list[str],
    events_webhook_ca: Path | None,
    events_webhook_ttl_ms: int,
    identity_key: list[Path],
    identity_overlap_hours: float,
) -> BridgeOptions:
    from agentwake.bridges.framework import BridgeOptions, host_port, http_auth_problem
    from agentwake.identity import IdentityError, ServerIdentity, keys_from_sources

    try:
        for value, flag in ((http, "--http"), (listen, "--listen")):
            if value is not None:
                host_port(value, what=flag)
    except ValueError as exc:
        raise fail(exc, code=2) from None
    if not webhook_path.startswith("/"):
        raise fail(f"--webhook-path must start with /, not {webhook_path!r}", code=2)
    if mcp_token_env and not http:
        raise fail(
            "--mcp-token-env is for --http (over stdio the caller is whoever started the bridge)", code=2
        )
    # Before anything is created or bound: an --http without a token is open to whoever reaches it.
    problem = http_auth_problem(http, has_token=mcp_token_env is not None, no_auth=no_auth)
    if problem is not None:
        raise fail(problem, code=2)
    try:
        keys = keys_from_sources(identity_key)
        identity = ServerIdentity(tuple(keys), timedelta(hours=identity_overlap_hours)) if keys else None
    except IdentityError as exc:
        raise fail(exc, code=2) from None
    return BridgeOptions(
        state_dir=state_dir,
        http=http,
        mcp_token=secret_from(mcp_token_env, flag="--mcp-token-env"),
        no_auth=no_auth,
        listen=listen,
        webhook_path=webhook_path,
        poll=poll,
        next_poll_ms=next_poll_ms,
        heartbeat_ms=heartbeat_ms,
        max_events=max_events,
        retention=timedelta(days=retention_days),
        keep_raw=keep_raw,
        events_webhook_ttl_ms=events_webhook_ttl_ms,
        events_webhook_allow=tuple(events_webhook_allow),
        events_webhook_ca=events_webhook_ca,
        identity=identity,
        ingress=not no_ingress(),
    )


def no_ingress() -> bool:
    """Whether this bridge was started for a short look (agentwake check, events, policy test, replay)."""
    return os.environ.get(NO_INGRESS_ENV, "") not in ("", "0")


def serve_bridge(make_bridge: Callable[[], Bridge], warnings: list[str]) -> None:
    """Build the bridge and its server (a setting they refuse is a usage error), log each of
    ``warnings``, then serve until stopped."""
    from agentwake.bridges.framework import BridgeServer

    try:
        server = BridgeServer(make_bridge())
    except (ValueError, OSError) as exc:
        raise fail(exc, code=2) from None
    import logging

    log = logging.getLogger("agentwake.bridge")
    for warning in warnings:
        log.warning(warning)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the bridge quietly
        run_async(server.serve)


def fake_option(title: str, first: str, example: str) -> Any:
    """The --fake flag of one bridge's command."""
    return typer.Option(
        "--fake",
        help=f"Try it offline: serve the packaged fake {title} in this process on a free loopback port,"
        f" point the bridge at it (a webhook secret is generated unless the variable is set; --listen"
        f" defaults to 127.0.0.1:0), and send one {first} event once a subscription is live. Writes"
        f" the fake makes are printed. agentwake init --example {example} configures it.",
    )


def serve_fake(upstream: str, options: BridgeOptions, settings: object, secret: str | None) -> None:
    """Serve the bridge against its fake upstream, in this process (agentwake.fakes.playground)."""
    from agentwake.fakes import playground

    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the bridge quietly
            run_async(lambda: playground.serve(upstream, options, settings, playground.secret_from(secret)))
    except (ValueError, OSError) as exc:
        raise fail(exc, code=2) from None


def _log_to_stderr(level: str) -> None:
    import logging

    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise fail(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {level!r}", code=2)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="bridge %(levelname)s %(message)s")
    logging.getLogger("agentwake.bridge").setLevel(numeric)


@bridge_app.command("github")
def github(
    state_dir: StateDir = Path(".agentwake-bridge/github"),
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
            help="The variable holding the webhook's secret (needed with --listen).",
        ),
    ] = "GITHUB_WEBHOOK_SECRET",
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
    repo: Annotated[
        list[str],
        typer.Option(
            "--repo",
            metavar="OWNER/NAME",
            envvar="AGENTWAKE_GITHUB_REPOS",
            help="A repository to poll (repeat the flag; the variable takes a space-separated list).",
        ),
    ] = [],  # noqa: B006
    poll_interval_s: Annotated[
        float,
        typer.Option(
            "--poll-interval",
            metavar="SECONDS",
            min=1,
            help="Seconds between polls of a repository; GitHub's X-Poll-Interval may ask for more.",
        ),
    ] = 60,
    token_env: Annotated[
        str,
        typer.Option(
            "--token-env", metavar="VAR", help="The variable holding the GitHub token for tools and polling."
        ),
    ] = "GITHUB_TOKEN",
    api_base: Annotated[
        str,
        typer.Option(
            "--api-base",
            metavar="URL",
            envvar="AGENTWAKE_GITHUB_API_BASE",
            help="The REST API's base URL (GitHub Enterprise: https://HOST/api/v3).",
        ),
    ] = "https://api.github.com",
    allow_tool: Annotated[
        list[str],
        typer.Option(
            "--allow-tool", metavar="TOOL", help="Offer a tool that is off by default: close_issue."
        ),
    ] = [],  # noqa: B006
    ignore_own_actions: Annotated[
        bool,
        typer.Option(
            "--ignore-own-actions/--keep-own-actions",
            help="Drop events the token's own account caused (the agent's comments), so they cannot wake it again.",
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
    fake: Annotated[bool, fake_option("GitHub", "issues.opened", "github")] = False,
) -> None:
    """Serve GitHub as MCP events (from its webhooks or by polling its API), with GitHub tools."""
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
    from agentwake.bridges.github import GitHubBridge, GitHubSettings

    repos = tuple(name for entry in repo for name in entry.split())
    secret = os.environ.get(webhook_secret_env) if listen else None
    if listen and not secret and not fake:
        raise fail(
            f"--listen needs the webhook secret in ${webhook_secret_env} (--webhook-secret-env)", code=2
        )
    token = os.environ.get(token_env) or None
    settings = GitHubSettings(
        webhook_secret=secret.encode() if secret else None,
        token=token,
        api_base=api_base,
        repos=repos,
        poll_interval_s=poll_interval_s,
        max_delivery_age=timedelta(seconds=max_delivery_age_s),
        allowed_tools=tuple(allow_tool),
        ignore_own_actions=ignore_own_actions,
    )
    if fake:
        serve_fake("github", options, settings, secret)
        return
    warnings = []
    if token is None:
        warnings.append(
            f"no GitHub token in ${token_env}: tools will fail and polling is limited to public repositories"
        )
    serve_bridge(lambda: GitHubBridge(options, settings), warnings)
