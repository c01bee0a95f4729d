"""Which program a stdio server's ``command`` runs, whether or not the virtualenv is activated.

A config written for a virtualenv (``command = "agentwake-demo"``, or ``python -m my_server``)
must work when agentwake is started as ``.venv/bin/agentwake``, from a service manager, or from
``pipx``, where the environment's scripts directory is not on PATH. The rule, for a bare name
(no path separator):

- ``python``, ``python3`` and ``python3.X`` (this interpreter's version) are this interpreter,
  ``sys.executable``: the Python that runs agentwake, so a server installed beside it is found.
  Give a path (``/usr/bin/python3``) for another one.
- any other name is looked up on PATH (the server's ``env`` PATH when it sets one) as usual;
  only when it is not found there is it looked for in this interpreter's scripts directory
  (``sysconfig.get_path("scripts")``, then the folder of ``sys.executable``).
- a command with a path separator, or a name found nowhere, is left as written (the latter
  fails to start with "command not found").
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path


def python_names() -> frozenset[str]:
    """The bare names that mean "this interpreter"."""
    major, minor = sys.version_info[:2]
    return frozenset({"python", f"python{major}", f"python{major}.{minor}"})


def script_dirs() -> list[Path]:
    """Where this interpreter's environment installs programs, in lookup order, without repeats."""
    found: list[Path] = []
    scripts = sysconfig.get_path("scripts")
    for candidate in (Path(scripts) if scripts else None, Path(sys.executable).parent):
        if candidate is not None and candidate not in found:
            found.append(candidate)
    return found


def resolve_command(command: str, env: Mapping[str, str] | None = None) -> str:
    """The program to spawn for a stdio server's ``command`` (see the module docstring for the rule)."""
    if not command or os.sep in command or (os.altsep and os.altsep in command):
        return command
    name = command.removesuffix(".exe") if sys.platform == "win32" else command
    if name in python_names() and sys.executable:
        return sys.executable
    path = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(command, path=path) is not None:
        return command
    for folder in script_dirs():
        found = shutil.which(command, path=str(folder))
        if found is not None:
            return found
    return command
