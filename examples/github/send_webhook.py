"""Post a signed GitHub webhook delivery to a bridge's --listen URL, as GitHub would.

    python -m examples.github.send_webhook                          # a new issue in acme/demo
    python -m examples.github.send_webhook --kind comment --number 1 --body "Any news?"
    python -m examples.github.send_webhook --sender "dependabot[bot]" --title "Bump lodash"
    python -m examples.github.send_webhook --file tests/fixtures/github/webhooks/issues.opened.json --fresh

The delivery carries GitHub's headers: X-GitHub-Event, a fresh X-GitHub-Delivery (a UUID),
X-Hub-Signature-256 (``sha256=`` and the HMAC-SHA256 of the exact body bytes, keyed with the secret),
Content-Type application/json and a GitHub-Hookshot User-Agent. The secret is read from the
environment variable --secret-env names (GITHUB_WEBHOOK_SECRET by default), never from the command
line. The script prints the answer's status and body, and exits 0 on a 2xx, else 1.

Without --file it builds a sample with the current time, from the options below. With --file it
sends that JSON body byte for byte. The bridge refuses a delivery whose event happened more than a
day ago as stale, so --fresh first sets every timestamp in the body (the keys ending in "_at") to now.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import sys
import uuid
from datetime import UTC, datetime
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

DEFAULT_URL: Final = "http://127.0.0.1:8787/webhook"
USER_AGENT: Final = "GitHub-Hookshot/agentwake-example"
# --kind: the X-GitHub-Event header of each built-in sample.
KINDS: Final = {
    "issue": "issues",
    "comment": "issue_comment",
    "pull-request": "pull_request",
    "failed-run": "workflow_run",
}


def now() -> str:
    """GitHub's timestamp form: UTC to the second, with a trailing Z."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def signature(secret: bytes, body: bytes) -> str:
    """X-Hub-Signature-256 as GitHub computes it."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def _account(login: str) -> dict[str, Any]:
    kind = "Bot" if login.lower().endswith("[bot]") else "User"
    return {"login": login, "id": _new_id(), "type": kind}


def _new_id() -> int:
    # A fresh id every time, so each sample is a new event (the bridge deduplicates on ids).
    return 1_000_000_000 + secrets.randbelow(1_000_000_000)


def sample(args: argparse.Namespace) -> dict[str, Any]:
    """A built-in webhook body of --kind, with GitHub's fields the bridge reads."""
    repo, number, at = args.repo, args.number, now()
    html = f"https://github.com/{repo}"
    sender = _account(args.sender)
    common = {
        "repository": {"id": _new_id(), "full_name": repo, "html_url": html, "private": False},
        "sender": sender,
    }
    labels = [{"name": name} for name in args.label]
    if args.kind == "issue":
        issue = {
            "id": _new_id(),
            "number": number,
            "title": args.title,
            "user": sender,
            "body": args.body,
            "state": "open",
            "labels": labels,
            "html_url": f"{html}/issues/{number}",
            "created_at": at,
            "updated_at": at,
        }
        return {"action": "opened", "issue": issue, **common}
    if args.kind == "comment":
        comment_id = _new_id()
        issue = {
            "id": _new_id(),
            "number": number,
            "title": args.title,
            "user": _account("mona-lisa"),
            "state": "open",
            "labels": labels,
            "html_url": f"{html}/issues/{number}",
        }
        comment = {
            "id": comment_id,
            "user": sender,
            "body": args.body,
            "html_url": f"{html}/issues/{number}#issuecomment-{comment_id}",
            "created_at": at,
            "updated_at": at,
        }
        return {"action": "created", "issue": issue, "comment": comment, **common}
    if args.kind == "pull-request":
        pull = {
            "id": _new_id(),
            "number": number,
            "title": args.title,
            "user": sender,
            "body": args.body,
            "state": "open",
            "draft": False,
            "labels": labels,
            "base": {"ref": "main"},
            "head": {"ref": "feature/sample"},
            "html_url": f"{html}/pull/{number}",
            "created_at": at,
            "updated_at": at,
        }
        return {"action": "opened", "pull_request": pull, **common}
    run = {
        "id": _new_id(),
        "run_attempt": 1,
        "name": "CI",
        "status": "completed",
        "conclusion": "failure",
        "head_branch": "feature/sample",
        "head_sha": secrets.token_hex(20),
        "event": "pull_request",
        "pull_requests": [{"number": number}],
        "html_url": f"{html}/actions/runs/{_new_id()}",
        "created_at": at,
        "updated_at": at,
    }
    return {"action": "completed", "workflow_run": run, **common}


def freshen(value: Any, when: str) -> Any:
    """``value`` with every string under a key ending in ``_at`` set to ``when``."""
    if isinstance(value, dict):
        return {
            key: when if key.endswith("_at") and isinstance(item, str) else freshen(item, when)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [freshen(item, when) for item in value]
    return value


def body_and_event(args: argparse.Namespace) -> tuple[bytes, str]:
    """The exact bytes to send and their X-GitHub-Event."""
    if args.file is None:
        return json.dumps(sample(args), indent=2).encode(), args.event or KINDS[args.kind]
    path: Path = args.file
    raw = path.read_bytes()
    # The fixtures' convention: <event>.<action>[.<variant>].json.
    event = args.event or path.name.split(".", 1)[0]
    if args.fresh:
        raw = json.dumps(freshen(json.loads(raw), now()), indent=2).encode()
    return raw, event


def post(url: str, body: bytes, event: str, secret: bytes) -> tuple[int, str, str]:
    """POST one delivery; its status, answer and delivery id. Header names go out as written here."""
    delivery = str(uuid.uuid4())
    target = urlsplit(url)
    if target.scheme not in ("http", "https") or not target.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    connection_type = HTTPSConnection if target.scheme == "https" else HTTPConnection
    connection = connection_type(target.hostname, target.port, timeout=30)
    path = (target.path or "/") + (f"?{target.query}" if target.query else "")
    try:
        connection.request(
            "POST",
            path,
            body=body,
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "X-GitHub-Event": event,
                "X-GitHub-Delivery": delivery,
                "X-Hub-Signature-256": signature(secret, body),
            },
        )
        answer = connection.getresponse()
        return answer.status, answer.read().decode("utf-8", "replace"), delivery
    finally:
        connection.close()


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="python -m examples.github.send_webhook",
        description="Sign and post a GitHub webhook delivery to an `agentwake bridge github --listen` URL.",
    )
    cli.add_argument("--url", default=DEFAULT_URL, help=f"where to post (default {DEFAULT_URL})")
    cli.add_argument(
        "--secret-env",
        metavar="VAR",
        default="GITHUB_WEBHOOK_SECRET",
        help="the variable holding the webhook secret (default GITHUB_WEBHOOK_SECRET)",
    )
    cli.add_argument("--file", type=Path, help="send this JSON body instead of a built-in sample")
    cli.add_argument(
        "--event",
        help="the X-GitHub-Event header (default: from --kind, or the file name's part before the first dot)",
    )
    cli.add_argument(
        "--fresh",
        action="store_true",
        help="with --file: set the body's timestamps (keys ending in _at) to now, so it is not stale",
    )
    sample_options = cli.add_argument_group("built-in sample")
    sample_options.add_argument(
        "--kind", choices=sorted(KINDS), default="issue", help="what happened (default issue: opened)"
    )
    sample_options.add_argument("--repo", default="acme/demo", help="owner/name (default acme/demo)")
    sample_options.add_argument("--number", type=int, default=1, help="the issue or pull request number")
    sample_options.add_argument("--title", default="Crash on start", help="the issue or pull request title")
    sample_options.add_argument(
        "--body",
        default="The app exits with a traceback when the config file is empty.",
        help="the issue, comment or pull request body",
    )
    sample_options.add_argument(
        "--sender", default="mona-lisa", help="who did it; a login ending in [bot] is a bot"
    )
    sample_options.add_argument(
        "--label", action="append", default=[], help="a label the issue or pull request has (repeatable)"
    )
    return cli


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    secret = os.environ.get(args.secret_env)
    if not secret:
        print(f"send_webhook: set the webhook secret in ${args.secret_env} first", file=sys.stderr)
        return 2
    try:
        body, event = body_and_event(args)
    except (OSError, ValueError) as exc:
        print(f"send_webhook: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    try:
        status, answer, delivery = post(args.url, body, event, secret.encode())
    except (OSError, ValueError, HTTPException) as exc:
        print(f"send_webhook: cannot post to {args.url}: {exc}", file=sys.stderr)
        return 1
    print(f"{event} delivery {delivery}: HTTP {status}")
    print(answer)
    return 0 if 200 <= status < 300 else 1


if __name__ == "__main__":
    sys.exit(main())
