"""``agentwake bridge send-test NAME EVENT``: one signed sample delivery to a running bridge.

The sample bodies ship in the package (agentwake.fakes.deliver). The bridge's URL and secret come
from the flags and the bridge's own variable, or else from the playground file a bridge started
with --fake keeps in its state dir while it runs (agentwake.fakes.playground).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from agentwake.cli.bridge import bridge_app
from agentwake.cli.common import fail, run_async


@bridge_app.command("send-test")
def send_test(
    upstream: Annotated[
        str,
        typer.Argument(metavar="NAME", help="The bridge: github, slack or pagerduty.", show_default=False),
    ],
    event: Annotated[
        str,
        typer.Argument(
            metavar="EVENT",
            help="The event type, e.g. issues.opened, issue_comment.created, pull_request.opened (github),"
            " app_mention, message.channels (slack), incident.triggered (pagerduty).",
            show_default=False,
        ),
    ],
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            metavar="URL",
            help="The bridge's webhook URL (its --listen and webhook path, e.g. http://127.0.0.1:8787/webhook);"
            " default: the one a bridge started with --fake keeps in --state-dir.",
        ),
    ] = None,
    secret_env: Annotated[
        str | None,
        typer.Option(
            "--secret-env",
            metavar="VAR",
            help="The variable holding the secret to sign with, as the bridge reads it (default"
            " GITHUB_WEBHOOK_SECRET, SLACK_SIGNING_SECRET or PAGERDUTY_WEBHOOK_SECRET); with a --fake"
            " bridge's URL, that bridge's own secret.",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            "--state-dir",
            metavar="DIR",
            help="The bridge's state dir, where a --fake bridge keeps its URL and secret while it runs"
            " (default .agentwake-bridge/NAME, as the bridge's).",
        ),
    ] = None,
) -> None:
    """Send one signed sample delivery of an event type to a running bridge's webhook listener.

    The body is a packaged sample, shaped as the upstream sends it, with new ids and
    timestamps each time. Prints the bridge's answer; exits 1 if it refused the delivery
    or did not answer, 2 for an unknown bridge or event type.
    """
    from agentwake.fakes import deliver
    from agentwake.fakes.playground import read_playground

    known = deliver.UPSTREAMS.get(upstream)
    if known is None:
        raise fail(f"no bridge named {upstream!r}; the bridges: {', '.join(deliver.UPSTREAMS)}", code=2)
    events = deliver.sample_events(upstream)
    if event not in events:
        raise fail(f"no {upstream} sample of {event!r}; the event types: {', '.join(events)}", code=2)
    folder = state_dir if state_dir is not None else Path(".agentwake-bridge") / upstream
    playground = read_playground(folder)
    variable = secret_env or known.secret_env
    from_env = (os.environ.get(variable) or "").split()
    if url is None and playground is not None:
        url = str(playground["webhook"])
        secret = str(playground["secret"])
    elif url is None:
        raise fail(
            f"no bridge to send to: pass --url (the bridge's --listen and {known.webhook_path}); no bridge"
            f" started with --fake is running with its state in {folder}",
            code=2,
        )
    elif from_env:
        secret = from_env[0]
    elif playground is not None:
        secret = str(playground["secret"])
    else:
        raise fail(f"the secret to sign with is not in ${variable} (--secret-env names another)", code=2)

    try:
        answer = run_async(lambda: deliver.send(url, upstream, event, secret))
    except deliver.Unreachable as exc:
        raise fail(f"{exc}; is the bridge (agentwake run) running?") from None
    shown = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
    typer.echo(f"{upstream} {event} delivery to {url}: HTTP {answer.status} {shown}")
    if not 200 <= answer.status < 300:
        raise typer.Exit(1)
