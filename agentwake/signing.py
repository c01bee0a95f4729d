"""Standard Webhooks signatures, as the MCP Events webhook profile uses them. Pure functions.

    signature = "v1," + base64(HMAC-SHA256(secret, f"{webhook-id}.{webhook-timestamp}." + body))

``body`` is the raw request body bytes; ``secret`` is the base64-decoded part of a
``whsec_`` value. A header may carry several space-separated signatures (secret
rotation); a receiver accepts if any of them verifies under any secret it holds.

The ``standardwebhooks`` package is the reference implementation and our tests check
interop against it; it is not used here because its verifier takes one secret per
call, decodes the body as text (raising on bytes that are not UTF-8) and raises
``ValueError`` or ``binascii.Error`` on a signature entry without a comma or with
bad base64, where a receiver must answer 401 and go on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence
from typing import Final

SECRET_PREFIX: Final = "whsec_"
SECRET_MIN_BYTES: Final = 24
SECRET_MAX_BYTES: Final = 64
GENERATED_SECRET_BYTES: Final = 32
# The receiver's freshness window, both ways (the spec: reject more than 5 minutes old).
TIMESTAMP_TOLERANCE_S: Final = 300

HEADER_ID: Final = "webhook-id"
HEADER_TIMESTAMP: Final = "webhook-timestamp"
HEADER_SIGNATURE: Final = "webhook-signature"
HEADER_SUBSCRIPTION: Final = "X-MCP-Subscription-Id"
SIGNATURE_VERSION: Final = "v1"
# Longest signature header we look at: a handful of signatures, not an attacker's megabyte.
MAX_SIGNATURE_HEADER: Final = 4096
# A SHA-256 digest in padded base64, as every v1 signature is.
_ENCODED_DIGEST: Final = 44


class SecretError(ValueError):
    """A value that is not a Standard Webhooks symmetric secret (whsec_ + base64 of 24 to 64 bytes)."""


def generate_secret(size: int = GENERATED_SECRET_BYTES) -> str:
    """A fresh ``whsec_`` secret from the operating system's CSPRNG."""
    if not SECRET_MIN_BYTES <= size <= SECRET_MAX_BYTES:
        raise ValueError(f"a secret has {SECRET_MIN_BYTES} to {SECRET_MAX_BYTES} bytes, not {size}")
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(size)).decode("ascii")


def decode_secret(value: str) -> bytes:
    """The key bytes of a ``whsec_`` secret; SecretError if it is not one. The message never holds the value."""
    if not isinstance(value, str) or not value.startswith(SECRET_PREFIX):
        raise SecretError(f"the secret must start with {SECRET_PREFIX!r}")
    encoded = value[len(SECRET_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise SecretError(f"the part after {SECRET_PREFIX!r} is not valid base64") from None
    if not SECRET_MIN_BYTES <= len(key) <= SECRET_MAX_BYTES:
        raise SecretError(
            f"the secret decodes to {len(key)} bytes; Standard Webhooks secrets have"
            f" {SECRET_MIN_BYTES} to {SECRET_MAX_BYTES}"
        )
    return key


class SigningKey:
    """A secret's key bytes with HMAC-SHA256 keyed once: each signature then only hashes its message."""

    __slots__ = ("_keyed", "key")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def __repr__(self) -> str:
        return "SigningKey(<redacted>)"

    def encoded_digest(self, msg_id: str, timestamp: str, body: bytes) -> bytes:
        """The signature of a message under this key, in base64 (as ASCII bytes)."""
        mac = self._keyed.copy()
        mac.update(f"{msg_id}.{timestamp}.".encode())
        mac.update(body)
        return binascii.b2a_base64(mac.digest(), newline=False)


def sign(keys: Sequence[bytes], msg_id: str, timestamp: int | str, body: bytes) -> str:
    """The ``webhook-signature`` header value: one ``v1,`` signature per key, space-separated."""
    if not keys:
        raise ValueError("sign needs at least one key")
    stamp = str(timestamp)
    return " ".join(
        f"{SIGNATURE_VERSION},{SigningKey(key).encoded_digest(msg_id, stamp, body).decode('ascii')}"
        for key in keys
    )


def entries(header: str, version: str, length: int) -> list[str]:
    """The encoded signatures of one ``version`` in a ``webhook-signature`` header, those of exactly
    ``length`` characters; other versions, malformed entries and an oversized header are skipped."""
    if len(header) > MAX_SIGNATURE_HEADER or not header.isascii():
        return []
    found: list[str] = []
    for entry in header.split(" "):
        named, comma, encoded = entry.partition(",")
        if comma and named == version and len(encoded) == length:
            found.append(encoded)
    return found


def signatures(header: str) -> list[bytes]:
    """The ``v1`` signatures of a header, still base64 (as ASCII bytes). Compared as encodings, so
    no candidate is ever decoded."""
    return [encoded.encode("ascii") for encoded in entries(header, SIGNATURE_VERSION, _ENCODED_DIGEST)]


def verify(
    keys: Iterable[bytes | SigningKey], msg_id: str, timestamp: str, header: str, body: bytes
) -> bytes | None:
    """The key under which one of the header's signatures verifies, or None. Constant-time compares."""
    candidates = signatures(header)
    if not candidates:
        return None
    for key in keys:
        signer = key if isinstance(key, SigningKey) else SigningKey(key)
        expected = signer.encoded_digest(msg_id, timestamp, body)
        # Every candidate is compared, so timing does not tell which one matched.
        matched = False
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
        if matched:
            return signer.key
    return None


def timestamp_error(value: str, now: float, tolerance_s: int = TIMESTAMP_TOLERANCE_S) -> str | None:
    """Why a ``webhook-timestamp`` is unacceptable (malformed, too old, in the future), or None."""
    if not (value.isascii() and value.isdigit()) or len(value) > 12:
        return "malformed"
    stamp = int(value)
    if stamp < now - tolerance_s:
        return "too old"
    if stamp > now + tolerance_s:
        return "in the future"
    return None
