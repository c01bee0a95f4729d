"""Security alerts as the GitHub bridge's MCP events: Dependabot, code scanning and secret scanning
alerts that were created or reopened. Pure: no I/O; ``github_events`` dispatches to the tables here.

Created and reopened are two event types each, as issues are (``issues.opened``,
``issues.reopened``), so a policy routes and a subscription filters them by name. An alert's number
counts within its repository only, so the id names the repository (in lower case, as GitHub
compares names) and, for a reopening, which can happen again and again, its time:

    dependabot_alert.created          dependabot_alert.created:<owner/name>:<number>
    dependabot_alert.reopened         dependabot_alert.reopened:<owner/name>:<number>:<updated_at>
    code_scanning_alert.*             likewise
    secret_scanning_alert.*           likewise

A payload without the alert's times (GitHub's older code and secret scanning payloads) is dated
by its receipt; a redelivery of it is still caught by its delivery id.

A created alert also comes by polling: ``from_alert`` maps an item of the repository's alert list
(GET /repos/{owner}/{repo}/dependabot/alerts, code-scanning/alerts, secret-scanning/alerts), whose
alert object is the webhook's ``alert`` with a code scanning alert's ``ref`` in its
``most_recent_instance``, to the webhook's event and id. GitHub's own account (``github``) sends a
created alert's webhook, so it is the polled event's actor too. A reopening is webhook only: the
list shows an alert as it is now, and an update is not told from a reopening without its history.

A secret scanning alert's ``secret`` (the leaked value itself) is never read: the event names the
secret's type only.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from agentwake.bridges._payload import bounded, integer_schema, text_schema
from agentwake.bridges.github_payload import (
    NAME_CHARS,
    TITLE_CHARS,
    URL_CHARS,
    Account,
    Mapped,
    Origin,
    Payload,
    event_schema,
    id_time,
)

KINDS: Final = ("dependabot_alert", "code_scanning_alert", "secret_scanning_alert")
_WHAT: Final = {
    "dependabot_alert": "A Dependabot alert (a vulnerable dependency)",
    "code_scanning_alert": "A code scanning alert",
    "secret_scanning_alert": "A secret scanning alert (a leaked secret, never included)",
}
# Where an alert's page is when the payload does not say (under the repository's page).
_PAGES: Final = {
    "dependabot_alert": "security/dependabot",
    "code_scanning_alert": "security/code-scanning",
    "secret_scanning_alert": "security/secret-scanning",
}

_HOW: Final = {
    "created": "By webhook, and by polling the repository's alert list.",
    "reopened": "By webhook only: the alert list cannot tell a reopening from another update.",
}
EVENT_TYPES: Final[dict[str, str]] = {
    f"{kind}.{action}": f"{_WHAT[kind]} was {action}. {_HOW[action]}"
    for kind in KINDS
    for action in ("created", "reopened")
}
# Who the polled created events are by: GitHub's account, which sends the created webhooks.
GITHUB_ACCOUNT: Final = Account("github", "Organization")
ACTIONS: Final[dict[str, tuple[str, ...]]] = dict.fromkeys(KINDS, ("created", "reopened"))


def _alert_schema() -> dict[str, dict[str, Any]]:
    return {
        "number": integer_schema("The alert's number in its repository."),
        "state": text_schema(
            'The alert\'s state now: "open", "dismissed", "fixed"..., or null.', NAME_CHARS, nullable=True
        ),
    }


_SEVERITY = 'How severe: "low", "medium", "high", "critical", or null where GitHub did not say.'

_SCHEMAS: Final[dict[str, dict[str, dict[str, Any]]]] = {
    "dependabot_alert": {
        **_alert_schema(),
        "severity": text_schema(_SEVERITY, NAME_CHARS, nullable=True),
        "package": text_schema("The vulnerable package's name.", NAME_CHARS),
        "ecosystem": text_schema('The package\'s ecosystem: "npm", "pip", "maven"...', NAME_CHARS),
        "manifestPath": text_schema(
            "The manifest that pulls the package in, or null.", URL_CHARS, nullable=True
        ),
        "ghsaId": text_schema("The GitHub Security Advisory's id (GHSA-...).", NAME_CHARS),
        "cveId": text_schema("The CVE's id, or null.", NAME_CHARS, nullable=True),
        "summary": text_schema("The advisory's one-line summary, or null.", TITLE_CHARS, nullable=True),
        "vulnerableRange": text_schema(
            'The versions affected, e.g. "< 7.5.2", or null.', NAME_CHARS, nullable=True
        ),
        "patchedVersion": text_schema("The first version with the fix, or null.", NAME_CHARS, nullable=True),
    },
    "code_scanning_alert": {
        **_alert_schema(),
        "severity": text_schema(
            'The rule\'s security severity ("low", "medium", "high", "critical") where it has one, else'
            ' its severity ("note", "warning", "error"), or null.',
            NAME_CHARS,
            nullable=True,
        ),
        "ruleId": text_schema('The rule\'s id, e.g. "java/sql-injection".', NAME_CHARS),
        "ruleSeverity": text_schema(
            'The rule\'s severity: "note", "warning", "error", or null.', NAME_CHARS, nullable=True
        ),
        "ruleDescription": text_schema("The rule's short description, or null.", TITLE_CHARS, nullable=True),
        "tool": text_schema('The scanning tool\'s name, e.g. "CodeQL".', NAME_CHARS),
        "ref": text_schema("The git ref the alert was found on, or null.", NAME_CHARS, nullable=True),
        "path": text_schema("The file of the alert's latest instance, or null.", URL_CHARS, nullable=True),
    },
    "secret_scanning_alert": {
        **_alert_schema(),
        "secretType": text_schema('The kind of secret, GitHub\'s slug, e.g. "adafruit_io_key".', NAME_CHARS),
        "secretTypeDisplayName": text_schema(
            'The kind of secret as GitHub shows it, e.g. "Adafruit IO Key", or null.',
            NAME_CHARS,
            nullable=True,
        ),
        "validity": text_schema(
            'Whether the secret still works: "active", "inactive", "unknown", or null.',
            NAME_CHARS,
            nullable=True,
        ),
        "resolution": text_schema(
            'How it was resolved before, if it was: "revoked", "false_positive"..., or null.',
            NAME_CHARS,
            nullable=True,
        ),
    },
}
PAYLOAD_SCHEMAS: Final[dict[str, dict[str, Any]]] = {
    kind: event_schema(_SCHEMAS[kind.split(".")[0]]) for kind in EVENT_TYPES
}


def _dependabot(alert: Payload) -> dict[str, Any]:
    dependency, advisory = alert.object("dependency"), alert.object("security_advisory")
    package = dependency.object("package")
    vulnerability = alert.optional_object("security_vulnerability")
    patched = vulnerability.optional_object("first_patched_version") if vulnerability is not None else None
    severity = advisory.optional_text("severity", NAME_CHARS)
    if severity is None and vulnerability is not None:
        severity = vulnerability.optional_text("severity", NAME_CHARS)
    return {
        "severity": severity,
        "package": package.text("name", NAME_CHARS),
        "ecosystem": package.text("ecosystem", NAME_CHARS),
        "manifestPath": dependency.optional_text("manifest_path", URL_CHARS),
        "ghsaId": advisory.text("ghsa_id", NAME_CHARS),
        "cveId": advisory.optional_text("cve_id", NAME_CHARS),
        "summary": advisory.optional_text("summary", TITLE_CHARS),
        "vulnerableRange": (
            vulnerability.optional_text("vulnerable_version_range", NAME_CHARS)
            if vulnerability is not None
            else None
        ),
        "patchedVersion": patched.optional_text("identifier", NAME_CHARS) if patched is not None else None,
    }


def _code_scanning(alert: Payload, ref: str | None) -> dict[str, Any]:
    rule, tool = alert.object("rule"), alert.object("tool")
    instance = alert.optional_object("most_recent_instance")
    if instance is None:
        instances = alert.objects("instances", 1)
        instance = instances[0] if instances else None
    location = instance.optional_object("location") if instance is not None else None
    rule_severity = rule.optional_text("severity", NAME_CHARS)
    return {
        "severity": rule.optional_text("security_severity_level", NAME_CHARS) or rule_severity,
        "ruleId": rule.text("id", NAME_CHARS),
        "ruleSeverity": rule_severity,
        "ruleDescription": rule.optional_text("description", TITLE_CHARS),
        "tool": tool.text("name", NAME_CHARS),
        "ref": ref,
        "path": location.optional_text("path", URL_CHARS) if location is not None else None,
    }


def _secret_scanning(alert: Payload) -> dict[str, Any]:
    # Never alert["secret"]: the leaked value stays out of the event, its log and the agent's prompt.
    return {
        "secretType": alert.text("secret_type", NAME_CHARS),
        "secretTypeDisplayName": alert.optional_text("secret_type_display_name", NAME_CHARS),
        "validity": alert.optional_text("validity", NAME_CHARS),
        "resolution": alert.optional_text("resolution", NAME_CHARS),
    }


def _when(alert: Payload, action: str) -> datetime:
    # A reopening's time is the alert's last update: its creation is long past.
    key = "updated_at" if action == "reopened" else "created_at"
    if alert.raw.get(key) is not None:
        return alert.moment(key)
    return datetime.now(UTC).replace(microsecond=0)


def _event(
    kind: str, action: str, alert: Payload, ref: str | None, origin: Origin, home: str | None
) -> Mapped:
    """The event of ``alert``; ``home`` is the repository's page, for an alert without its own."""
    number = alert.integer("number")
    if kind == "dependabot_alert":
        fields = _dependabot(alert)
    elif kind == "code_scanning_alert":
        fields = _code_scanning(alert, ref)
    else:
        fields = _secret_scanning(alert)
    when = _when(alert, action)
    key = f"{origin.repository.lower()}:{number}"
    page = alert.optional_text("html_url", URL_CHARS)
    if page is None:
        # A listed alert always has its page: without one, the item is not an alert.
        page = alert.text("html_url", URL_CHARS) if home is None else f"{home}/{_PAGES[kind]}/{number}"
    return origin.event(
        f"{kind}.{action}",
        f"{key}:{id_time(when)}" if action == "reopened" else key,
        when,
        page[:URL_CHARS],
        [],
        {"number": number, "state": alert.optional_text("state", NAME_CHARS), **fields},
    )


def _alert(kind: str, action: str) -> Callable[[Payload, Origin], Mapped]:
    def mapper(holder: Payload, origin: Origin) -> Mapped:
        alert = holder.object("alert")
        ref = holder.optional_text("ref", NAME_CHARS)
        home = None
        if alert.raw.get("html_url") is None:
            home = holder.object("repository").text("html_url", URL_CHARS)
        return _event(kind, action, alert, ref, origin, home)

    return mapper


def from_alert(kind: str, item: dict[str, Any], repository: str) -> Mapped:
    """One item of a repository's alert list (``kind`` as the webhook names it) as ``<kind>.created``."""
    if kind not in KINDS:
        raise ValueError(f"an alert kind is one of {list(KINDS)}, not {kind!r}")
    alert = Payload.of(item, "alert")
    ref = None
    if kind == "code_scanning_alert":
        instance = alert.optional_object("most_recent_instance")
        ref = instance.optional_text("ref", NAME_CHARS) if instance is not None else None
    return _event(kind, "created", alert, ref, Origin(bounded(repository, NAME_CHARS), GITHUB_ACCOUNT), None)


MAPPERS: Final[dict[str, Callable[[Payload, Origin], Mapped | None]]] = {
    f"{kind}.{action}": _alert(kind, action) for kind in KINDS for action in ("created", "reopened")
}
