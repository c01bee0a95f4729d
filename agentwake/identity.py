"""Server identity: Standard Webhooks ``v1a`` (ed25519) signatures and the JWKS that publishes their keys.

    signature = "v1a," + base64(ed25519_sign(private_key, f"{webhook-id}.{webhook-timestamp}." + body))

The same content as ``v1`` (agentwake.signing), so a server appends ``v1a`` to the HMAC signatures
of every delivery and verification POST. Its public keys are a JWK set (RFC 7517, RFC 8037's
``OKP``/``Ed25519`` keys, each with a ``kid``) served at JWKS_PATH on the server's MCP origin: a
client fetches them from the origin it already connects to, never from a delivery.

A key file is one private JWK as JSON (``d`` the 32-byte seed, ``x`` the public key, both
base64url without padding) with ``kid`` and ``created`` (RFC 3339), written 0600 by ``agentwake
keygen``. Pure functions and small classes; nothing here touches the network.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agentwake.signing import entries

JWKS_PATH: Final = "/.well-known/mcp-webhook-jwks.json"
SIGNATURE_VERSION: Final = "v1a"
# An ed25519 signature (64 bytes) in padded base64.
_ENCODED_SIGNATURE: Final = 88
# A JWKS larger than this is not a list of a few keys: refused unread.
MAX_JWKS_BYTES: Final = 64 * 1024
MAX_JWKS_KEYS: Final = 16
MAX_KID_LENGTH: Final = 128
DEFAULT_OVERLAP: Final = timedelta(days=7)
# base64url without padding (RFC 7515 section 2): urlsafe_b64decode alone would skip other characters.
_BASE64URL: Final = re.compile(r"[A-Za-z0-9_-]*")
IDENTITY_KEY_ENV: Final = "AGENTWAKE_IDENTITY_KEY"


class IdentityError(ValueError):
    """A key file, key or JWKS that is not what it must be. The message never holds key material."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64url(value: object, what: str, size: int) -> bytes:
    if not isinstance(value, str) or not _BASE64URL.fullmatch(value):
        raise IdentityError(f"{what} must be a base64url string (A-Z a-z 0-9 - _, no padding)")
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise IdentityError(f"{what} is not valid base64url") from None
    if len(raw) != size:
        raise IdentityError(f"{what} decodes to {len(raw)} bytes, not {size}")
    return raw


def _kid(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KID_LENGTH or not value.isprintable():
        raise IdentityError(f"kid must be a printable string of 1 to {MAX_KID_LENGTH} characters")
    return value


def signed_content(msg_id: str, timestamp: int | str, body: bytes) -> bytes:
    return f"{msg_id}.{timestamp}.".encode() + body


@dataclass(frozen=True, slots=True)
class PublicKey:
    """One published key: its ``kid`` and the ed25519 public key."""

    kid: str
    key: Ed25519PublicKey

    def to_jwk(self) -> dict[str, str]:
        raw = self.key.public_bytes_raw()
        return {
            "kty": "OKP",
            "crv": "Ed25519",
            "x": _b64url(raw),
            "kid": self.kid,
            "use": "sig",
            "alg": "EdDSA",
        }

    def verifies(self, signature: bytes, content: bytes) -> bool:
        try:
            self.key.verify(signature, content)
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True, slots=True)
class IdentityKey:
    """A server's private signing key, with its ``kid`` and when it was made (rotation picks the newest)."""

    kid: str
    created: datetime
    private: Ed25519PrivateKey

    def __repr__(self) -> str:
        return f"IdentityKey(kid={self.kid!r}, created={self.created.isoformat()}, <private>)"

    @classmethod
    def generate(cls, kid: str | None = None, now: datetime | None = None) -> IdentityKey:
        return cls(_kid(kid or secrets.token_hex(8)), now or datetime.now(UTC), Ed25519PrivateKey.generate())

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.kid, self.private.public_key())

    def sign(self, msg_id: str, timestamp: int | str, body: bytes) -> str:
        """One ``v1a,`` signature entry for a message."""
        raw = self.private.sign(signed_content(msg_id, timestamp, body))
        return f"{SIGNATURE_VERSION},{base64.b64encode(raw).decode('ascii')}"

    def to_private_jwk(self) -> dict[str, str]:
        return {
            **self.public.to_jwk(),
            "d": _b64url(self.private.private_bytes_raw()),
            "created": self.created.isoformat().replace("+00:00", "Z"),
        }

    @classmethod
    def from_private_jwk(cls, jwk: object) -> IdentityKey:
        if not isinstance(jwk, dict):
            raise IdentityError("an identity key is a JSON object (a private JWK)")
        if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            raise IdentityError('an identity key must have "kty": "OKP" and "crv": "Ed25519"')
        private = Ed25519PrivateKey.from_private_bytes(_unb64url(jwk.get("d"), "d", 32))
        if "x" in jwk and _unb64url(jwk["x"], "x", 32) != private.public_key().public_bytes_raw():
            raise IdentityError("x is not the public key of d")
        created_text = jwk.get("created")
        try:
            created = datetime.fromisoformat(str(created_text).replace("Z", "+00:00"))
        except ValueError:
            raise IdentityError("created must be an RFC 3339 time") from None
        if created.tzinfo is None:
            raise IdentityError("created must carry its offset (Z or +HH:MM)")
        return cls(_kid(jwk.get("kid")), created.astimezone(UTC), private)


def load_key_file(path: Path) -> IdentityKey:
    """The key in ``path``; IdentityError naming the file (never its content) if it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise IdentityError(f"cannot read the identity key {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise IdentityError(f"the identity key {path} is not UTF-8 text (a private JWK is JSON)") from None
    if os.name == "posix" and path.stat().st_mode & 0o077:
        raise IdentityError(f"the identity key {path} is readable by others: chmod 600 it")
    if not text.strip():
        raise IdentityError(f"the identity key {path} is empty")
    keys = parse_keys(text, str(path))
    if len(keys) != 1:
        raise IdentityError(f"the identity key {path} holds {len(keys)} keys; a key file holds one")
    return keys[0]


def parse_keys(text: str, source: str) -> list[IdentityKey]:
    """One private JWK, or a JSON list of them (the environment variable's form)."""
    try:
        value = json.loads(text)
    except ValueError:
        raise IdentityError(f"{source}: not JSON (an identity key is a private JWK)") from None
    items = value if isinstance(value, list) else [value]
    try:
        keys = [IdentityKey.from_private_jwk(item) for item in items]
    except IdentityError as exc:
        raise IdentityError(f"{source}: {exc}") from None
    if not keys:
        raise IdentityError(f"{source}: no key")
    if len({key.kid for key in keys}) != len(keys):
        raise IdentityError(f"{source}: two keys share a kid")
    return keys


def write_key_file(path: Path, key: IdentityKey) -> None:
    """Write ``key`` to a new file, private from the first byte (0600); an existing file is refused."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(key.to_private_jwk(), out, indent=2)
        out.write("\n")


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """A server's identity keys: the newest signs; an older one stays published for ``overlap``
    after the newest was made, so a client that cached the old set still knows the key that signed."""

    keys: tuple[IdentityKey, ...]
    overlap: timedelta = DEFAULT_OVERLAP

    def __post_init__(self) -> None:
        if not self.keys:
            raise IdentityError("a server identity needs at least one key")
        if len({key.kid for key in self.keys}) != len(self.keys):
            raise IdentityError("two identity keys share a kid")

    @property
    def signer(self) -> IdentityKey:
        return max(self.keys, key=lambda key: key.created)

    def published(self, now: datetime) -> list[PublicKey]:
        """The keys the JWKS lists now: the signer first, then the older ones still in their overlap."""
        signer = self.signer
        older = [k for k in self.keys if k is not signer and now < signer.created + self.overlap]
        return [signer.public, *(k.public for k in sorted(older, key=lambda k: k.created, reverse=True))]

    def retired(self, now: datetime) -> list[str]:
        """The kids of keys past their overlap: no longer published; they may leave the configuration."""
        signer = self.signer
        return [k.kid for k in self.keys if k is not signer and now >= signer.created + self.overlap]

    def jwks(self, now: datetime) -> dict[str, Any]:
        return {"keys": [key.to_jwk() for key in self.published(now)]}


def parse_jwks(document: bytes) -> list[PublicKey]:
    """The ed25519 signing keys of a JWKS document; keys of other types are skipped, a malformed
    document is an IdentityError."""
    if len(document) > MAX_JWKS_BYTES:
        raise IdentityError(f"the JWKS is larger than {MAX_JWKS_BYTES} bytes")
    try:
        value = json.loads(document)
    except ValueError:
        raise IdentityError("the JWKS is not JSON") from None
    entries = value.get("keys") if isinstance(value, dict) else None
    if not isinstance(entries, list):
        raise IdentityError('the JWKS has no "keys" list')
    keys: list[PublicKey] = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kty") != "OKP" or entry.get("crv") != "Ed25519":
            continue
        if entry.get("use", "sig") != "sig" or "d" in entry:
            continue  # an encryption key, or a private key nobody should publish
        raw = _unb64url(entry.get("x"), "a key's x", 32)
        keys.append(PublicKey(_kid(entry.get("kid")), Ed25519PublicKey.from_public_bytes(raw)))
        if len(keys) > MAX_JWKS_KEYS:
            raise IdentityError(f"the JWKS lists more than {MAX_JWKS_KEYS} ed25519 keys")
    return keys


def identity_signatures(header: str) -> list[bytes]:
    """The ``v1a`` signatures of a ``webhook-signature`` header, decoded; malformed entries skipped."""
    found: list[bytes] = []
    for encoded in entries(header, SIGNATURE_VERSION, _ENCODED_SIGNATURE):
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    return found


def verify_identity(
    keys: Iterable[PublicKey], msg_id: str, timestamp: str, header: str, body: bytes
) -> PublicKey | None:
    """The published key one of the header's ``v1a`` signatures verifies under, or None."""
    candidates = identity_signatures(header)
    if not candidates:
        return None
    content = signed_content(msg_id, timestamp, body)
    for key in keys:
        if any(key.verifies(candidate, content) for candidate in candidates):
            return key
    return None


def keys_from_sources(paths: Sequence[Path], env: dict[str, str] | None = None) -> list[IdentityKey]:
    """The identity keys of ``--identity-key`` files, else of the IDENTITY_KEY_ENV variable."""
    if paths:
        keys = [load_key_file(path) for path in paths]
        if len({key.kid for key in keys}) != len(keys):
            raise IdentityError("two identity key files share a kid")
        return keys
    text = (env if env is not None else os.environ).get(IDENTITY_KEY_ENV, "")
    return parse_keys(text, IDENTITY_KEY_ENV) if text.strip() else []
