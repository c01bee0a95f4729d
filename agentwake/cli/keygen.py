"""keygen: a new server identity key (ed25519), for a server that signs its webhook deliveries.

The private key goes to a new file, mode 0600 from its first byte (an existing file is never
overwritten); only the public half is printed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from agentwake.cli.common import app, fail


def usage_lines(path: Path) -> list[str]:
    """How to use the key and how to rotate it, as keygen prints them."""
    return [
        f"use it: agentwake-demo --identity-key {path}   or   agentwake bridge NAME --identity-key {path}",
        "rotate: make a new key with agentwake keygen, pass both --identity-key files (the newest signs,"
        " the old one stays published for --identity-overlap-hours, 7 days by default), then drop the"
        " old one after the overlap",
    ]


@app.command()
def keygen(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            metavar="FILE",
            help="Where to write the private key (a JWK, JSON): a new file, mode 0600; an existing file is refused.",
        ),
    ],
    kid: Annotated[
        str | None,
        typer.Option(
            "--kid",
            metavar="KID",
            help="The key's id in the published JWKS (default: 16 random hex digits).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object: the kid, the file's path and the public JWK."),
    ] = False,
) -> None:
    """Make a server identity key (ed25519) that signs webhook deliveries as well as their HMAC.

    A server started with --identity-key FILE (agentwake-demo, agentwake bridge NAME) adds a v1a
    signature to every delivery and serves its public keys at /.well-known/mcp-webhook-jwks.json.
    The private key is written to FILE alone; only the kid and the public key are printed.
    """
    from agentwake.identity import IdentityError, IdentityKey, write_key_file

    try:
        key = IdentityKey.generate(kid)
    except IdentityError as exc:
        raise fail(f"--kid: {exc}", code=2) from None
    try:
        write_key_file(out, key)
    except FileExistsError:
        raise fail(f"{out} exists: keygen never overwrites a key (choose another --out)", code=1) from None
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc.strerror}", code=1) from None
    public = key.public.to_jwk()
    if as_json:
        typer.echo(json.dumps({"kid": key.kid, "path": str(out), "public_jwk": public}))
        return
    typer.echo(f"wrote a new identity key to {out} (mode 0600; keep it private)")
    typer.echo(f"kid: {key.kid}")
    typer.echo(f"public JWK: {json.dumps(public)}")
    for line in usage_lines(out):
        typer.echo(line)
