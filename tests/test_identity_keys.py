"""Server identity keys: ed25519 v1a signatures checked against an independent implementation (PyNaCl,
libsodium), key files (agentwake keygen, and every way a file can be unusable), rotation's published set,
and the demo server's and the bridges' command lines refusing a bad key in one line, exit 2.

Nothing here runs a server; tests/test_identity_server.py does.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import pytest
from conftest import REPO
from typer.testing import CliRunner

from agentwake import signing
from agentwake.cli import app
from agentwake.cli.bridge import DEFAULT_IDENTITY_OVERLAP_HOURS
from agentwake.demo import parse_args
from agentwake.identity import (
    DEFAULT_OVERLAP,
    IDENTITY_KEY_ENV,
    IdentityError,
    IdentityKey,
    ServerIdentity,
    keys_from_sources,
    load_key_file,
    parse_jwks,
    signed_content,
    verify_identity,
    write_key_file,
)

MSG_ID = "evt_0001"
STAMP = 1_767_225_600
BODY = b'{"eventId":"evt_0001","name":"ticket.created","data":{"ticketId":"T-1"}}'
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def nacl_private_jwk(
    key: nacl.signing.SigningKey, kid: str, created: str = "2026-01-01T00:00:00Z"
) -> dict[str, str]:
    """A PyNaCl key in our key file format: d is the 32-byte seed, x the public key."""
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "d": b64url(bytes(key)),
        "x": b64url(bytes(key.verify_key)),
        "kid": kid,
        "created": created,
    }


def write_json(path: Path, value: Any, mode: int = 0o600) -> Path:
    path.write_text(json.dumps(value) if not isinstance(value, str) else value)
    path.chmod(mode)
    return path


# ---- interop with an independent ed25519 ---------------------------------------------------------


def test_our_v1a_signature_verifies_with_pynacl_under_the_published_x() -> None:
    key = IdentityKey.generate("ours")
    entry = key.sign(MSG_ID, STAMP, BODY)
    version, _, encoded = entry.partition(",")
    assert version == "v1a"
    signature = base64.b64decode(encoded, validate=True)
    published = ServerIdentity((key,)).jwks(T0)["keys"][0]
    verify_key = nacl.signing.VerifyKey(unb64url(published["x"]))
    content = f"{MSG_ID}.{STAMP}.".encode() + BODY
    assert verify_key.verify(content, signature) == content
    with pytest.raises(nacl.exceptions.BadSignatureError):
        verify_key.verify(content + b" ", signature)
    # The same content as the HMAC's v1, so the two sit side by side in one header.
    assert signed_content(MSG_ID, STAMP, BODY) == content


def test_a_pynacl_key_written_as_a_private_jwk_loads_and_its_signatures_verify(tmp_path: Path) -> None:
    theirs = nacl.signing.SigningKey.generate()
    path = write_json(tmp_path / "nacl.jwk", nacl_private_jwk(theirs, "libsodium"))
    loaded = load_key_file(path)
    assert loaded.kid == "libsodium" and loaded.created == T0
    assert loaded.public.to_jwk()["x"] == b64url(bytes(theirs.verify_key))

    signature = theirs.sign(f"{MSG_ID}.{STAMP}.".encode() + BODY).signature
    hmac = signing.sign([b"k" * 32], MSG_ID, STAMP, BODY)
    header = f"{hmac} v1a,{base64.b64encode(signature).decode()}"
    published = parse_jwks(json.dumps(ServerIdentity((loaded,)).jwks(T0)).encode())
    assert verify_identity(published, MSG_ID, str(STAMP), header, BODY) == published[0]
    assert verify_identity(published, MSG_ID, str(STAMP), header, BODY + b"x") is None
    assert verify_identity(published, MSG_ID, str(STAMP + 1), header, BODY) is None
    # And what our copy of their key signs, they verify: the same key, two implementations.
    ours = loaded.sign(MSG_ID, STAMP, BODY).partition(",")[2]
    theirs.verify_key.verify(f"{MSG_ID}.{STAMP}.".encode() + BODY, base64.b64decode(ours))


# ---- rotation ------------------------------------------------------------------------------------


def rotation(overlap: timedelta = DEFAULT_OVERLAP) -> tuple[IdentityKey, IdentityKey, ServerIdentity]:
    old = IdentityKey.generate("old", now=T0)
    new = IdentityKey.generate("new", now=T0 + timedelta(days=30))
    # Configured oldest last: the order of the files does not choose the signer, their times do.
    return old, new, ServerIdentity((new, old), overlap)


def test_during_the_overlap_both_keys_are_published_newest_first_and_the_newest_signs() -> None:
    _old, new, identity = rotation()
    now = new.created + timedelta(days=1)
    assert identity.signer is new
    assert [k.kid for k in identity.published(now)] == ["new", "old"]
    document = identity.jwks(now)
    assert [k["kid"] for k in document["keys"]] == ["new", "old"]
    for entry in document["keys"]:
        assert (entry["kty"], entry["crv"]) == ("OKP", "Ed25519") and "d" not in entry
    assert identity.retired(now) == []
    entry = new.sign(MSG_ID, STAMP, BODY)
    keys = parse_jwks(json.dumps(document).encode())
    assert verify_identity(keys, MSG_ID, str(STAMP), entry, BODY) == keys[0]


def test_once_the_overlap_has_passed_only_the_newest_is_published_and_the_old_one_is_retired() -> None:
    old, new, identity = rotation()
    just_before = new.created + DEFAULT_OVERLAP - timedelta(seconds=1)
    at_end = new.created + DEFAULT_OVERLAP
    assert [k.kid for k in identity.published(just_before)] == ["new", "old"]
    assert [k.kid for k in identity.published(at_end)] == ["new"]
    assert identity.retired(at_end) == ["old"]
    # The old key's signature no longer verifies against what is published.
    keys = parse_jwks(json.dumps(identity.jwks(at_end)).encode())
    assert verify_identity(keys, MSG_ID, str(STAMP), old.sign(MSG_ID, STAMP, BODY), BODY) is None


def test_the_bridges_default_overlap_is_the_identity_modules() -> None:
    assert timedelta(hours=DEFAULT_IDENTITY_OVERLAP_HOURS) == DEFAULT_OVERLAP


# ---- key files -----------------------------------------------------------------------------------


def good_jwk(kid: str = "k1") -> dict[str, str]:
    return IdentityKey.generate(kid).to_private_jwk()


def broken(change: dict[str, Any], drop: str | None = None) -> dict[str, Any]:
    jwk: dict[str, Any] = {**good_jwk(), **change}
    if drop is not None:
        del jwk[drop]
    return jwk


OTHER_D = b64url(bytes(nacl.signing.SigningKey.generate()))
BAD_FILES: list[tuple[str, Any, int, str]] = [
    ("readable by others", good_jwk(), 0o644, "is readable by others: chmod 600 it"),
    ("readable by the group", good_jwk(), 0o640, "is readable by others"),
    ("wrong kty", broken({"kty": "RSA"}), 0o600, '"kty": "OKP" and "crv": "Ed25519"'),
    ("wrong crv", broken({"crv": "X25519"}), 0o600, '"kty": "OKP" and "crv": "Ed25519"'),
    ("d too short", broken({"d": b64url(b"\x01" * 16)}), 0o600, "d decodes to 16 bytes, not 32"),
    ("d not base64url", broken({"d": "*" * 43}), 0o600, "d must be a base64url string"),
    ("d missing", broken({}, drop="d"), 0o600, "d must be a base64url string"),
    ("x not d's", broken({"d": OTHER_D}), 0o600, "x is not the public key of d"),
    ("kid missing", broken({}, drop="kid"), 0o600, "kid must be a printable string"),
    ("created missing", broken({}, drop="created"), 0o600, "created must be an RFC 3339 time"),
    ("not JSON", "kty=OKP\n", 0o600, "not JSON (an identity key is a private JWK)"),
    ("empty", "", 0o600, "is empty"),
    ("two keys", [good_jwk("a"), good_jwk("b")], 0o600, "holds 2 keys; a key file holds one"),
]


@pytest.mark.parametrize(("case", "content", "mode", "message"), BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_an_unusable_key_file_is_a_specific_error_naming_the_file_and_quoting_no_key(
    tmp_path: Path, case: str, content: Any, mode: int, message: str
) -> None:
    path = write_json(tmp_path / "key.jwk", content, mode)
    with pytest.raises(IdentityError) as caught:
        load_key_file(path)
    text = str(caught.value)
    assert message in text and str(path) in text, text
    assert "\n" not in text
    for secret in secrets_in(content):
        assert secret not in text


def secrets_in(content: Any) -> list[str]:
    items = content if isinstance(content, list) else [content]
    return [item["d"] for item in items if isinstance(item, dict) and isinstance(item.get("d"), str)]


def test_a_missing_or_binary_key_file_is_an_identity_error(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match=r"cannot read the identity key .*No such file"):
        load_key_file(tmp_path / "nowhere.jwk")
    binary = tmp_path / "binary.jwk"
    binary.write_bytes(b"\xff\xfe\x00")
    binary.chmod(0o600)
    with pytest.raises(IdentityError, match="not UTF-8 text"):
        load_key_file(binary)


def test_write_key_file_makes_a_0600_file_and_never_overwrites(tmp_path: Path) -> None:
    key = IdentityKey.generate("w")
    path = tmp_path / "w.jwk"
    write_key_file(path, key)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_key_file(path).public.to_jwk() == key.public.to_jwk()
    with pytest.raises(FileExistsError):
        write_key_file(path, IdentityKey.generate("other"))
    assert load_key_file(path).kid == "w"


def test_the_environment_variable_holds_one_key_or_a_list_and_files_win(tmp_path: Path) -> None:
    first, second = good_jwk("env-1"), good_jwk("env-2")
    assert [k.kid for k in keys_from_sources([], {IDENTITY_KEY_ENV: json.dumps(first)})] == ["env-1"]
    both = keys_from_sources([], {IDENTITY_KEY_ENV: json.dumps([first, second])})
    assert [k.kid for k in both] == ["env-1", "env-2"]
    assert keys_from_sources([], {}) == []
    path = write_json(tmp_path / "f.jwk", good_jwk("file"))
    assert [k.kid for k in keys_from_sources([path], {IDENTITY_KEY_ENV: json.dumps(first)})] == ["file"]
    with pytest.raises(IdentityError, match=f"^{IDENTITY_KEY_ENV}: not JSON"):
        keys_from_sources([], {IDENTITY_KEY_ENV: "{nope"})


# ---- agentwake keygen ----------------------------------------------------------------------------


def keygen(*args: str) -> Any:
    return CliRunner().invoke(app, ["keygen", *args])


def test_keygen_writes_a_private_0600_key_and_prints_only_its_public_half(tmp_path: Path) -> None:
    path = tmp_path / "identity.jwk"
    result = keygen("--out", str(path), "--kid", "server-2026")
    assert result.exit_code == 0, result.output
    assert path.stat().st_mode & 0o777 == 0o600
    key = load_key_file(path)
    assert key.kid == "server-2026"
    private = json.loads(path.read_text())
    assert private["d"] not in result.output
    assert "kid: server-2026" in result.output and private["x"] in result.output
    assert f"agentwake-demo --identity-key {path}" in result.output
    assert f"agentwake bridge NAME --identity-key {path}" in result.output
    assert "rotate:" in result.output and "drop the old one after the overlap" in result.output


def test_keygen_json_prints_the_kid_path_and_public_jwk(tmp_path: Path) -> None:
    path = tmp_path / "identity.jwk"
    result = keygen("--out", str(path), "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert set(printed) == {"kid", "path", "public_jwk"}
    assert printed["path"] == str(path) and printed["kid"] == load_key_file(path).kid
    assert printed["public_jwk"] == load_key_file(path).public.to_jwk() and "d" not in printed["public_jwk"]


def test_keygen_refuses_an_existing_file_and_leaves_it_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "identity.jwk"
    assert keygen("--out", str(path)).exit_code == 0
    before = path.read_bytes()
    result = keygen("--out", str(path))
    assert result.exit_code == 1
    assert "exists: keygen never overwrites a key" in result.output
    assert path.read_bytes() == before


def test_keygen_refuses_a_bad_kid_and_a_missing_folder(tmp_path: Path) -> None:
    result = keygen("--out", str(tmp_path / "k.jwk"), "--kid", "x" * 200)
    assert result.exit_code == 2 and "--kid: kid must be a printable string" in result.output
    assert not (tmp_path / "k.jwk").exists()
    result = keygen("--out", str(tmp_path / "no" / "k.jwk"))
    assert result.exit_code == 1 and "cannot write" in result.output


# ---- the command lines -----------------------------------------------------------------------------


DEMO_CASES = [
    case for case in BAD_FILES if case[0] in ("readable by others", "wrong kty", "x not d's", "not JSON")
]


@pytest.mark.parametrize(("case", "content", "mode", "message"), DEMO_CASES, ids=[c[0] for c in DEMO_CASES])
def test_the_demo_refuses_a_bad_key_file_in_one_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, content: Any, mode: int, message: str
) -> None:
    path = write_json(tmp_path / "key.jwk", content, mode)
    with pytest.raises(SystemExit) as exited:
        parse_args(["--identity-key", str(path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("agentwake-demo: error: ")
    assert message in err and str(path) in err
    for secret in secrets_in(content):
        assert secret not in err


def test_the_demo_program_exits_2_with_one_line_for_a_key_readable_by_others(tmp_path: Path) -> None:
    path = write_json(tmp_path / "key.jwk", good_jwk(), 0o644)
    done = subprocess.run(
        [sys.executable, "-m", "agentwake.demo", "--identity-key", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DEMO_DB": str(tmp_path / "demo.db")},
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr == f"agentwake-demo: error: the identity key {path} is readable by others: chmod 600 it\n"
    )
    assert done.stdout == ""


def test_the_demo_reads_keys_from_flags_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IDENTITY_KEY_ENV, raising=False)
    assert parse_args([])[1].identity is None
    old = write_json(tmp_path / "old.jwk", IdentityKey.generate("old", now=T0).to_private_jwk())
    new = write_json(
        tmp_path / "new.jwk", IdentityKey.generate("new", now=T0 + timedelta(1)).to_private_jwk()
    )
    settings = parse_args(
        ["--identity-key", str(old), "--identity-key", str(new), "--identity-overlap-hours", "2"]
    )[1]
    assert settings.identity is not None
    assert settings.identity.signer.kid == "new" and settings.identity.overlap == timedelta(hours=2)
    assert parse_args(["--identity-key", str(old)])[1].identity.overlap == DEFAULT_OVERLAP  # type: ignore[union-attr]
    monkeypatch.setenv(IDENTITY_KEY_ENV, json.dumps(good_jwk("from-env")))
    from_env = parse_args([])[1].identity
    assert from_env is not None and from_env.signer.kid == "from-env"


@pytest.mark.parametrize("bridge", ["github", "slack", "pagerduty"])
def test_each_bridge_refuses_a_bad_key_file_in_one_line_with_exit_2(tmp_path: Path, bridge: str) -> None:
    jwk = good_jwk()
    path = write_json(tmp_path / "key.jwk", {**jwk, "d": OTHER_D})
    result = CliRunner().invoke(
        app, ["bridge", bridge, "--state-dir", str(tmp_path / "state"), "--identity-key", str(path)]
    )
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {path}: x is not the public key of d"
    assert OTHER_D not in result.output


def test_the_bridge_options_carry_the_identity(tmp_path: Path) -> None:
    from agentwake.cli.bridge import bridge_options

    old = write_json(tmp_path / "old.jwk", IdentityKey.generate("old", now=T0).to_private_jwk())
    new = write_json(
        tmp_path / "new.jwk", IdentityKey.generate("new", now=T0 + timedelta(1)).to_private_jwk()
    )
    options = bridge_options(
        state_dir=tmp_path / "state",
        http=None,
        mcp_token_env=None,
        no_auth=False,
        listen=None,
        webhook_path="/webhook",
        poll=False,
        next_poll_ms=2000,
        heartbeat_ms=30_000,
        max_events=100,
        retention_days=1.0,
        keep_raw=False,
        events_webhook_allow=[],
        events_webhook_ca=None,
        events_webhook_ttl_ms=60_000,
        identity_key=[new, old],
        identity_overlap_hours=12.0,
    )
    assert options.identity is not None
    assert options.identity.signer.kid == "new" and options.identity.overlap == timedelta(hours=12)
    for path in (old, new):  # nothing private in a repr that may reach a log
        assert json.loads(path.read_text())["d"] not in repr(options)
