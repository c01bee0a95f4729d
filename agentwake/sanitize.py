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
from typing import TYPE_CHECKING, Any, Final

from agentwake.redaction import REDACTED, redact

if TYPE_CHECKING:
    from agentwake.config import SanitizeConfig

__all__ = [
    "REDACTED",
    "Limits",
    "Sanitized",
    "clean_text",
    "datamark",
    "hidden_text",
    "injection_score",
    "redact",
    "sanitize",
    "sanitize_with",
]

DEFAULT_MAX_DEPTH: Final = 8
DEFAULT_MAX_STRING: Final = 4_000
DEFAULT_MAX_LIST: Final = 100
DEFAULT_MAX_BYTES: Final = 32_000
# A string is cut to this many times max_string before it is cleaned at all (bounds the work).
PRECUT_FACTOR: Final = 4

# Bidi embeddings/overrides/isolates, zero-width characters, the BOM, and Unicode tag characters
# (invisible ASCII look-alikes used to smuggle instructions).
_INVISIBLE: Final = re.compile(
    "[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\u061c\ufeff\u180e\U000e0000-\U000e007f]"
)
_CONTROL: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")

# Phrasing common in prompt-injection corpora (AgentDojo, garak's PromptInject). Weights add up; the
# score is capped at 1. Tuned against tests/fixtures/injections.json and ordinary help-desk text.
_INJECTION_SIGNALS: Final[tuple[tuple[str, float, re.Pattern[str]], ...]] = (
    (
        "ignore previous instructions",
        0.6,
        re.compile(
            r"(?i)\b(ignore|disregard|forget|override|bypass|skip)\b[^.\n]{0,40}"
            r"\b(previous|prior|above|earlier|preceding|all|any|your|the rest of|this|these|other)\b[^.\n]{0,40}"
            r"\b(\w*struct\w*|prompts?|rules|directions|guidelines|context)\b"
            r"|\b(ignore|disregard)\s+(all\s+|the\s+|any\s+)?instructions\b"
            r"|\b(ignore|disregard)\s+(the rest of (this|the) (data|text|input)|this data)\b|\bdisregard all info\b"
        ),
    ),
    (
        "new instructions",
        0.4,
        re.compile(
            r"(?i)\b(new|real|actual|true|secret)\s+(instructions|orders|directives)\b"
            r"|\bimportant (message|instructions?) (from me|for you)\b"
        ),
    ),
    (
        "task hijack",
        0.5,
        re.compile(
            r"(?i)\bthe task (that )?I gave you\b|\bbefore you (can )?(solve|do|complete|finish) the task\b"
            r"|\binstead of (doing )?(the|your) task\b|\bstop what you('re| are) doing\b"
            r"|\bstop everything\b(?=\W*(now\b|!))"
        ),
    ),
    (
        "role reassignment",
        0.4,
        re.compile(
            r"(?i)\byou are now (a|an|in|my|the|free|DAN)\b|\bpretend (to be|you are)\b"
            r"|\bfrom now on,? you (are|will (act|respond|answer|reply))\b"
            r"|\bact as (if you were|an? (AI|assistant|unrestricted|jailbroken|uncensored))\b"
            r"|\byou are (no longer|not) (an? )?(AI|assistant|bound)\b"
        ),
    ),
    (
        "system prompt talk",
        0.4,
        re.compile(
            r"(?i)\bsystem[_-](prompt|message)\b|\bsystem prompt\b|###\s*\(system|\bdeveloper mode\b|\bjailbr(eak|oken)\b"
            r"|\bdo anything now\b|(?-i:\bDAN\b(?= |:|,|\.|$)(?! from))"
        ),
    ),
    (
        "fake role marker",
        0.5,
        re.compile(
            r"(?im)^\s*(system|assistant)\s*:|<\|?(im_start|im_end|system|endoftext)\|?>|\[/?INST\]"
            r"|\[(system|assistant)\]\(#|^\s*#+\s*\(?(system|assistant)\b"
        ),
    ),
    ("fence forgery", 0.5, re.compile(r"(?i)</?\s*(event-data|tool-result)\b")),
    ("instruction tags", 0.4, re.compile(r"(?i)</?(INFORMATION|instructions?|system|admin)>")),
    ("tool coercion", 0.3, re.compile(r"(?i)\b(call|invoke|execute)\s+(the\s+)?(\w+\s+)?(tool|function)\b")),
    (
        "exfiltration",
        0.4,
        re.compile(
            r"(?i)\b(send|forward|email|post|upload|leak|exfiltrate)\s+(the|all|your|their|every|admin|my)\s+"
            r"[^.\n]{0,30}\b(passwords?|secrets?|tokens?|api keys?|credentials|private keys?)\b(?!\s+reset)"
            r"|!\[[^\]]*\]\(https?://[^)\s]*[?&][^)\s]*=[^)\s]*\)"
        ),
    ),
    (
        "send content to an address",
        0.3,
        re.compile(
            r"(?i)\b(email|send|forward)\s+(the\s+)?(text|following|contents?|data|file|summary)\b"
            r"[^\n]{0,80}\bto\s+['\"]?[\w.+-]+@"
        ),
    ),
    (
        "output override",
        0.4,
        re.compile(
            r"(?i)\b(just|only)\s+(print|say|output|write)\b\s*(the following\b|[\"'\u201c:]|\w+ pwned)"
            r"|\breply with only\b|\brespond only with\b"
        ),
    ),
    (
        "safety override",
        0.4,
        re.compile(
            r"(?i)\b(override|bypass|disable|ignore)\s+(your\s+|all\s+|any\s+)(\w+\s+)?"
            r"(safety|guard\w*|content filters?|restrictions?|scoring|moderation|negative indicators)\b"
            r"|\boverride (manual|the) scoring\b"
        ),
    ),
    (
        "verdict steering",
        0.2,
        re.compile(
            r"(?i)\b(report|say|respond|answer|classify|label|treat)\b[^.\n]{0,30}\bnot malicious\b"
            r"|\b(clearly|definitely|completely) not malicious\b|\ball content here is not malicious\b"
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
_TAG_CHARACTERS: Final = re.compile("[\U000e0020-\U000e007e]+")


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


def hidden_text(text: str) -> str:
    """ASCII smuggled in Unicode tag characters, decoded, so the scorer reads what the model would not see."""
    return " ".join(
        "".join(chr(ord(c) - 0xE0000) for c in run.group(0)) for run in _TAG_CHARACTERS.finditer(text)
    )


def clean_text(text: str) -> tuple[str, int]:
    """NFKC-normalised, without control, bidi-override, zero-width or tag characters; returns the count removed.

    Carriage returns become newlines: a bare CR lets text overwrite a line on a terminal.
    """
    normalised = unicodedata.normalize("NFKC", text.replace("\r\n", "\n").replace("\r", "\n"))
    without_invisible, invisible = _INVISIBLE.subn("", normalised)
    cleaned, control = _CONTROL.subn("", without_invisible)
    return cleaned, invisible + control


def injection_score(texts: Iterable[str]) -> tuple[float, list[str]]:
    """A 0..1 score of known injection phrasing, and the signals that fired."""
    joined = "\n".join(texts)
    signals = [name for name, _, pattern in _INJECTION_SIGNALS if pattern.search(joined)]
    weights = {name: weight for name, weight, _ in _INJECTION_SIGNALS}
    return float(min(1.0, round(sum(weights[s] for s in signals), 3))), signals


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
    hidden_found = False

    # Work is bounded by what is kept: a string is cut to a margin over max_string before it is
    # normalised, scanned and redacted (cleaning can shorten it, so some margin is kept).
    precut = limits.max_string * PRECUT_FACTOR

    def text(raw: str, path: str) -> str:
        nonlocal removed, hidden_found
        original = len(raw)
        if original > precut:
            raw = raw[:precut]
        hidden = hidden_text(raw)
        if hidden:
            hidden_found = True
            strings.append(hidden)
        cleaned, n = clean_text(raw)
        removed += n
        strings.append(cleaned)
        cleaned, found = redact(cleaned, pii=pii)
        for label, count in found.items():
            redactions[label] = redactions.get(label, 0) + count
        if len(cleaned) > limits.max_string or original > precut:
            length = max(len(cleaned), original)
            cuts.append(f"{path}: string of {length} characters cut to {limits.max_string}")
            cleaned = cleaned[: limits.max_string] + f"[… {length - limits.max_string} more characters]"
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
            for index, (key, item) in enumerate(items[: limits.max_list]):
                # Keys are untrusted too; paths in cut messages use the cleaned key, never the raw one.
                clean_key = text(str(key), f"{path}.<key {index}>")
                if clean_key in out:
                    cuts.append(
                        f"{path}.{clean_key}: a second key that reads the same after cleaning was removed"
                    )
                    continue
                out[clean_key] = walk(item, f"{path}.{clean_key}", depth + 1)
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
    if hidden_found and "hidden characters" not in signals:
        signals.append("hidden characters")
        score = min(1.0, round(score + 0.3, 3))
    return Sanitized(value, cuts, redactions, removed, score, signals)


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _cut_string(value: str, max_bytes: int) -> str:
    """The longest prefix (plus a note) whose JSON encoding fits ``max_bytes``."""
    note = "[… cut]"
    low, high = 0, len(value)
    while low < high:
        middle = (low + high + 1) // 2
        if _size(value[:middle] + note) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return value[:low] + note


def _trim_once(root: dict[str, Any] | list[Any], excess: int) -> str:
    """Make the JSON of ``root`` smaller by one step, where it is biggest; returns the path trimmed.

    Descends into the largest child while that is a non-empty container; there it cuts
    the largest string if that is big, else drops the container's last entry.
    """
    node: dict[str, Any] | list[Any] = root
    path = "$"
    while True:
        keys: list[Any] = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return path
        sizes = {key: _size(node[key]) for key in keys}
        biggest = max(keys, key=lambda k: sizes[k])
        child = node[biggest]
        child_path = f"{path}.{biggest}" if isinstance(node, dict) else f"{path}[{biggest}]"
        if isinstance(child, dict | list) and child:
            node, path = child, child_path
            continue
        if isinstance(child, str) and sizes[biggest] > 256:
            node[biggest] = _cut_string(child, max(64, sizes[biggest] - excess - 16))
            return child_path
        if isinstance(node, dict):
            # The biggest entry goes (ties: the last), so small siblings such as ids stay.
            top = max(sizes.values())
            node.pop(next(k for k in reversed(keys) if sizes[k] == top))
        else:
            node.pop()
        return path


def _bound_bytes(value: Any, max_bytes: int, cuts: list[str]) -> Any:
    """Trim the largest parts (last entries of the biggest container, or the biggest string) until it fits."""
    original = _size(value)
    if original <= max_bytes:
        return value
    if isinstance(value, str):
        value = _cut_string(value, max_bytes)
        cuts.append(f"$: {original} bytes cut to {_size(value)} to fit {max_bytes}")
        return value
    if not isinstance(value, dict | list):
        return value
    trimmed: dict[str, int] = {}
    while value and (excess := _size(value) - max_bytes) > 0:
        path = _trim_once(value, excess)
        trimmed[path] = trimmed.get(path, 0) + 1
    where = ", ".join(f"{path} ({count}x)" for path, count in trimmed.items())
    cuts.append(f"$: {original} bytes cut to {_size(value)} to fit {max_bytes}: trimmed {where}")
    return value


def sanitize_with(options: SanitizeConfig, value: Any, *, pii: bool = False) -> Sanitized:
    """``sanitize`` with the configured limits; ``pii`` (a rule's redact_pii) adds to ``options.redact_pii``."""
    return sanitize(
        value,
        limits=Limits(options.max_depth, options.max_string, options.max_list, options.max_bytes),
        pii=options.redact_pii or pii,
    )
