"""Untrusted payloads made safe to show an LLM: bounded, cleaned, redacted and scored. Pure functions.

Every event payload and tool result passes through ``sanitize`` before it is
fenced into a prompt. Nothing here decides anything: the injection score is a
signal recorded with the event for policy rules, not a filter.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

DEFAULT_MAX_DEPTH: Final = 8
DEFAULT_MAX_STRING: Final = 4_000
DEFAULT_MAX_LIST: Final = 100
DEFAULT_MAX_BYTES: Final = 32_000
REDACTED: Final = "[REDACTED]"

# Bidi embeddings/overrides/isolates, zero-width characters, the BOM, and Unicode tag characters
# (invisible ASCII look-alikes used to smuggle instructions).
_INVISIBLE: Final = re.compile(
    "[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\u061c\ufeff\u180e\U000e0000-\U000e007f]"
)
_CONTROL: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")

_SECRET_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "private key",
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.S),
    ),
    ("password in URL", re.compile(r"://[^/\s:@]+:(?P<secret>[^/\s@]+)@")),
    ("bearer token", re.compile(r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=-]{16,})")),
    ("JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b")),
    ("OpenAI-style key", re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}\b")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})\b")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b")),
    ("AWS access key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("GitLab token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b")),
    ("webhook secret", re.compile(r"\bwhsec_[A-Za-z0-9+/=]{16,}\b")),
    (
        "password field",
        re.compile(r"(?i)\b(?:password|passwd|pwd|secret)[\"']?\s*[:=]\s*[\"']?(?P<secret>[^\s\"',;]{4,})"),
    ),
)
_PII_PATTERNS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("email", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")),
    ("phone", re.compile(r"(?<![\w+])\+?\d[\d ().-]{7,}\d(?!\w)")),
)

# Phrasing common in prompt-injection corpora. Weights add up; the score is capped at 1.
_INJECTION_SIGNALS: Final[tuple[tuple[str, float, re.Pattern[str]], ...]] = (
    (
        "ignore previous instructions",
        0.6,
        re.compile(
            r"(?i)\b(ignore|disregard|forget|override|bypass)\b.{0,40}\b(previous|prior|above|earlier|all|any|your)\b"
            r".{0,40}\b(instructions?|prompts?|rules|directions|guidelines|context|messages?)\b"
        ),
    ),
    (
        "new instructions",
        0.4,
        re.compile(r"(?i)\b(new|updated|real|actual|important|urgent)\s+(instructions?|task|orders?)\b"),
    ),
    (
        "role reassignment",
        0.4,
        re.compile(r"(?i)\b(you are now|act as|pretend to be|from now on,? you|you must now)\b"),
    ),
    (
        "system prompt talk",
        0.4,
        re.compile(r"(?i)\b(system prompt|system message|developer mode|jailbreak|DAN)\b"),
    ),
    (
        "fake role marker",
        0.5,
        re.compile(
            r"(?im)^\s*(system|assistant|user)\s*:|<\|?(im_start|im_end|system|endoftext)\|?>|\[/?INST\]"
        ),
    ),
    ("fence forgery", 0.5, re.compile(r"(?i)</?\s*(event-data|tool-result)\b")),
    ("tool coercion", 0.3, re.compile(r"(?i)\b(call|use|invoke|run|execute)\s+(the\s+)?(tool|function)\b")),
    (
        "exfiltration",
        0.4,
        re.compile(
            r"(?i)\b(send|forward|email|post|upload|leak)\b.{0,40}\b(password|secret|token|api key|credentials?|private key)s?\b"
        ),
    ),
    (
        "secrecy",
        0.2,
        re.compile(
            r"(?i)\b(do not|don't|never)\s+(tell|inform|mention|reveal)\b.{0,30}\b(user|anyone|human)\b"
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int = DEFAULT_MAX_DEPTH
    max_string: int = DEFAULT_MAX_STRING
    max_list: int = DEFAULT_MAX_LIST
    max_bytes: int = DEFAULT_MAX_BYTES


@dataclass(frozen=True, slots=True)
class Sanitized:
    value: Any
    cuts: list[str] = field(default_factory=list)
    redactions: dict[str, int] = field(default_factory=dict)
    removed_characters: int = 0
    injection_score: float = 0.0
    injection_signals: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "cuts": self.cuts,
            "redactions": self.redactions,
            "removed_characters": self.removed_characters,
            "injection_score": self.injection_score,
            "injection_signals": self.injection_signals,
        }


def clean_text(text: str) -> tuple[str, int]:
    """NFKC-normalised, without control, bidi-override, zero-width or tag characters; returns the count removed."""
    normalised = unicodedata.normalize("NFKC", text)
    without_invisible, invisible = _INVISIBLE.subn("", normalised)
    cleaned, control = _CONTROL.subn("", without_invisible)
    return cleaned, invisible + control


def redact(text: str, *, pii: bool = False) -> tuple[str, dict[str, int]]:
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


def injection_score(texts: Iterable[str]) -> tuple[float, list[str]]:
    """A 0..1 score of known injection phrasing, and the signals that fired."""
    joined = "\n".join(texts)
    signals = [name for name, _, pattern in _INJECTION_SIGNALS if pattern.search(joined)]
    weights = {name: weight for name, weight, _ in _INJECTION_SIGNALS}
    return min(1.0, round(sum(weights[s] for s in signals), 3)), signals


def datamark(text: str, marker: str = "\u02c6") -> str:
    """Spotlighting by datamarking: every run of whitespace becomes the marker, so data reads as data."""
    return re.sub(r"\s+", marker, text)


def sanitize(value: Any, *, limits: Limits | None = None, pii: bool = False) -> Sanitized:
    """Bound, clean, redact and score a JSON value. The input is not modified."""
    limits = limits or Limits()
    cuts: list[str] = []
    redactions: dict[str, int] = {}
    removed = 0
    strings: list[str] = []

    def text(raw: str, path: str) -> str:
        nonlocal removed
        cleaned, n = clean_text(raw)
        removed += n
        strings.append(cleaned)
        cleaned, found = redact(cleaned, pii=pii)
        for label, count in found.items():
            redactions[label] = redactions.get(label, 0) + count
        if len(cleaned) > limits.max_string:
            cuts.append(f"{path}: string of {len(cleaned)} characters cut to {limits.max_string}")
            cleaned = cleaned[: limits.max_string] + f"[… {len(cleaned) - limits.max_string} more characters]"
        return cleaned

    def walk(node: Any, path: str, depth: int) -> Any:
        if isinstance(node, str):
            return text(node, path)
        if isinstance(node, bool) or node is None or isinstance(node, int | float):
            return node
        if depth >= limits.max_depth:
            cuts.append(f"{path}: nesting deeper than {limits.max_depth} levels removed")
            return "[… deeper levels removed]"
        if isinstance(node, dict):
            items = list(node.items())
            out: dict[str, Any] = {}
            for key, item in items[: limits.max_list]:
                out[text(str(key), f"{path}.key")] = walk(item, f"{path}.{key}", depth + 1)
            if len(items) > limits.max_list:
                cuts.append(f"{path}: {len(items) - limits.max_list} of {len(items)} keys removed")
            return out
        if isinstance(node, list | tuple):
            kept = [walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(node[: limits.max_list])]
            if len(node) > limits.max_list:
                cuts.append(f"{path}: {len(node) - limits.max_list} of {len(node)} items removed")
            return kept
        return text(str(node), path)

    value = walk(value, "$", 0)
    value = _bound_bytes(value, limits.max_bytes, cuts)
    score, signals = injection_score(strings)
    return Sanitized(value, cuts, redactions, removed, score, signals)


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _bound_bytes(value: Any, max_bytes: int, cuts: list[str]) -> Any:
    """Drop trailing entries of the largest containers until the JSON fits ``max_bytes``."""
    size = _size(value)
    if size <= max_bytes:
        return value
    if isinstance(value, str):
        cuts.append(f"$: {size} bytes cut to {max_bytes}")
        return value.encode()[: max_bytes - 64].decode(errors="ignore") + "[… cut]"
    if not isinstance(value, dict | list):
        return value
    original = size
    container: Any = value
    while _size(container) > max_bytes and container:
        if isinstance(container, dict):
            container.pop(next(reversed(container)))
        else:
            container.pop()
    cuts.append(
        f"$: {original} bytes cut to {_size(container)} (trailing entries removed to fit {max_bytes})"
    )
    return container
