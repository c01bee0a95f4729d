"""Secrets (and, on request, personal data) found in text and replaced by a marker. Pure functions.

Below every stage that writes text out: sanitizing payloads, the log filter and
the store's error columns all redact with these patterns, so a secret is caught
the same way wherever it would leave the process.
"""

from __future__ import annotations

import re
from typing import Final

REDACTED: Final = "[REDACTED]"

_SECRET_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "private key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
    ),
    ("password in URL", re.compile(r"://[^/\s:@]+:(?P<secret>[^/\s@]+)@")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=-]{16,})")),
    (
        "basic credentials",
        re.compile(r"(?i)\bauthorization[\"']?\s*[:=]\s*[\"']?basic\s+(?P<secret>[A-Za-z0-9+/]{8,}={0,2})"),
    ),
    ("JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    ("OpenAI-style key", re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    ("GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("webhook secret", re.compile(r"\bwhsec_[A-Za-z0-9+/]{16,}={0,2}")),
    (
        "credential field",
        re.compile(
            r"(?i)(?<![A-Za-z0-9])(?:[A-Za-z0-9]*[_-])?"
            r"(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|token)"
            r"[\"']?\s*[:=]\s*[\"']?(?P<secret>[^\s\"',;]{4,})"
        ),
    ),
)
_PII_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    # Not the user part of ssh://git@host style URLs.
    ("email", re.compile(r"(?<![/\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")),
    # Grouped like a phone number; dates (2026-12-01), versions and dotted quads are not.
    (
        "phone",
        re.compile(
            r"(?<![\w.+-])(?:"
            r"(?:\+|00)\d{1,3}[\s.-]?(?:\(\d{1,4}\)|\d{1,4})(?:[\s.-]?\d{2,8}){1,4}"
            r"|(?:\(\d{2,4}\)\s?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}"
            r")(?![\w.-])"
        ),
    ),
)


def redact(text: str, *, pii: bool = False) -> tuple[str, dict[str, int]]:
    """``text`` with every secret (and with ``pii``, emails and phone numbers) replaced; counts by kind."""
    counts: dict[str, int] = {}
    patterns = _SECRET_PATTERNS + (_PII_PATTERNS if pii else ())
    for label, pattern in patterns:
        text, n = pattern.subn(_redact_match, text)
        if n:
            counts[label] = counts.get(label, 0) + n
    return text, counts


def _redact_match(match: re.Match[str]) -> str:
    """The whole match, or only its ``secret`` group when the pattern has one (keeps 'password=' readable)."""
    if "secret" not in match.re.groupindex:
        return REDACTED
    start, end = match.span("secret")
    whole_start = match.start()
    text = match.group(0)
    return text[: start - whole_start] + REDACTED + text[end - whole_start :]
