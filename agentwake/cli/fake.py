"""``agentwake fake NAME``: serve a packaged fake upstream (agentwake/fakes) on loopback.

Each command hands its options to the fake module's own program (``python -m
agentwake.fakes.NAME``), so both take the same flags; this one only makes them reachable from an
installed agentwake, with no checkout.
"""

from __future__ import annotations

from typing import Annotated

import typer

from agentwake.cli.common import HELP_MARKUP, HelpGroup, app

fake_app = typer.Typer(
    help="Serve a fake GitHub, Slack or PagerDuty on 127.0.0.1, to try the bridges offline.",
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    cls=HelpGroup,
)
app.add_typer(fake_app, name="fake")

Port = Annotated[
    int,
    typer.Option("--port", metavar="PORT", min=0, max=65535, help="Port on 127.0.0.1; 0 picks a free one."),
]


@fake_app.command("github")
def github(
    port: Port = 8765,
    repo: Annotated[
        list[str],
        typer.Option("--repo", metavar="OWNER/NAME", help="A repository to create (repeatable)."),
    ] = ["acme/demo"],  # noqa: B006
    token: Annotated[
        str, typer.Option("--token", metavar="TOKEN", help="The token clients must send (not a secret).")
    ] = "test-token",
) -> None:
    """Serve a fake GitHub REST API until Ctrl-C, printing its URL (the bridge's --api-base).

    POST /repos/OWNER/NAME/issues opens an issue, as on GitHub; the bridge's tools
    (comment, add_labels, ...) change its state.
    """
    from agentwake.fakes.github import main

    main(["--port", str(port), "--token", token, *(f"--repo={name}" for name in repo)])


@fake_app.command("slack")
def slack(
    port: Port = 8791,
    channel: Annotated[
        list[str],
        typer.Option(
            "--channel", metavar="CHANNEL_ID", help="A channel to create (repeatable); C0GENERAL always is."
        ),
    ] = [],  # noqa: B006
    events_url: Annotated[
        str | None,
        typer.Option(
            "--events-url",
            metavar="URL",
            help="The bridge's Request URL (its --listen and webhook path), for events when no Socket Mode"
            " client is connected.",
        ),
    ] = None,
) -> None:
    """Serve a fake Slack (Web API, Socket Mode, Events API) until Ctrl-C, printing its API base.

    Its tokens and signing secret are fixed, fake values (python -m agentwake.fakes.slack
    --help names them). POST /_fake/say with {"channel", "text"} has a person speak;
    every write the bot makes is printed.
    """
    from agentwake.fakes.slack import main

    argv = ["--port", str(port), *(f"--channel={name}" for name in channel)]
    if events_url is not None:
        argv.append(f"--events-url={events_url}")
    main(argv)


@fake_app.command("pagerduty")
def pagerduty(
    port: Port = 8790,
    service: Annotated[
        list[str],
        typer.Option(
            "--service", metavar="NAME", help="A service to create (repeatable; default Checkout API)."
        ),
    ] = [],  # noqa: B006
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            metavar="URL",
            help="Deliver every change there as a signed V3 webhook, with the secret in"
            " $PAGERDUTY_WEBHOOK_SECRET (the bridge's --listen and webhook path).",
        ),
    ] = None,
) -> None:
    """Serve a fake PagerDuty REST API until Ctrl-C, printing its URL (the bridge's --api-base).

    Its API key is test-key. It prints a curl command that triggers an incident.
    """
    from agentwake.fakes.pagerduty import main

    argv = ["--port", str(port), *(f"--service={name}" for name in service)]
    if webhook is not None:
        argv.append(f"--webhook={webhook}")
    main(argv)
