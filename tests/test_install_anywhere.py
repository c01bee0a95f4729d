"""agentwake installed from its wheel, used from a folder far from the checkout, with no venv activated.

The slow test builds the wheel offline from a copy of the sources, installs it into a fresh
virtualenv outside the repository, and runs what a newcomer types: `agentwake init`, `check`,
`run` (stopped after the first agent action) and `actions`. The fresh venv sees the main venv's
site-packages (the dependencies) through a .pth file, but not the checkout: `agentwake` there must
be the installed wheel, packaged defaults and `agentwake-demo` program included.

The quick tests pin the rule a stdio server's bare `command` is resolved by (agentwake.commands).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from agentwake.commands import resolve_command, script_dirs

# ---- the command rule (quick) ------------------------------------------------------------------


def test_python_means_the_interpreter_that_runs_agentwake() -> None:
    major, minor = sys.version_info[:2]
    for name in ("python", f"python{major}", f"python{major}.{minor}"):
        assert resolve_command(name) == sys.executable


def test_a_name_on_path_is_left_to_path(tmp_path: Path) -> None:
    program = tmp_path / "my-server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert resolve_command("my-server", {"PATH": str(tmp_path)}) == "my-server"


def test_a_name_not_on_path_is_found_next_to_the_interpreter(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    found = resolve_command("agentwake-demo", {"PATH": str(empty)})
    assert Path(found).parent in script_dirs() and Path(found).name.startswith("agentwake-demo")
    assert Path(found).parent == Path(sysconfig.get_path("scripts"))


def test_paths_and_unknown_names_are_left_as_written(tmp_path: Path) -> None:
    assert resolve_command("/nonexistent/server") == "/nonexistent/server"
    assert resolve_command("./server") == "./server"
    assert resolve_command("no-such-program-anywhere", {"PATH": str(tmp_path)}) == "no-such-program-anywhere"


def test_the_servers_own_path_is_the_one_searched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`env = { PATH = ... }` on the server decides where a bare name is found, as for the child."""
    program = tmp_path / "only-here"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert resolve_command("only-here", {"PATH": str(tmp_path)}) == "only-here"
    assert resolve_command("only-here") == "only-here"  # not found anywhere: unchanged, fails to start


# ---- the wheel, installed elsewhere (slow) -----------------------------------------------------

SOURCES = ("pyproject.toml", "README.md", "agentwake")
RUN_TIMEOUT_S = 240  # a hang guard: on a busy machine a bridge, its fake and a run take a while


def clean_env(**extra: str) -> dict[str, str]:
    """No venv activated, nothing of the checkout on sys.path, the fresh venv's bin not on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH") and not k.startswith("PIP_")
    }
    env.update(PATH="/usr/bin:/bin", PYTHONDONTWRITEBYTECODE="1", **extra)
    return env


def run(args: list[str | Path], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=cwd, env=clean_env(**extra), capture_output=True, text=True, timeout=180
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin folder of a fresh venv, outside the repository, with agentwake's wheel installed."""
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, (
        f"setuptools {setuptools.__version__} cannot build this pyproject (PEP 639 license):"
        " pip install -e '.[dev]' brings setuptools>=77"
    )
    root = tmp_path_factory.mktemp("install-anywhere")
    source = root / "src"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, source / name)
    # Built from a copy: a build in the checkout would leave build/ and *.egg-info in it.
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    ok(run([*build, "--wheel-dir", root / "dist", source], cwd=root))
    [wheel] = sorted((root / "dist").glob("agentwake-*.whl"))
    venv = root / "venv"
    ok(run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root))
    python = venv / "bin" / "python"
    ok(
        run(
            [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
            cwd=root,
        )
    )
    # The dependencies, from the main venv's site-packages: a path line, so that folder's own .pth
    # files (the editable install's finder, which maps `agentwake` to the checkout) are not run.
    purelib = Path(sysconfig.get_path("purelib"))
    fresh = Path(
        ok(run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=root)).strip()
    )
    (fresh / "zz-main-venv-deps.pth").write_text(f"{purelib}\n")
    yield venv / "bin"


def actions(agentwake: Path, project: Path) -> list[dict[str, Any]]:
    result = run([agentwake, "actions", "--json"], cwd=project)
    return json.loads(result.stdout) if result.returncode == 0 else []


@pytest.mark.slow
def test_the_wheel_installed_elsewhere_inits_checks_and_runs_a_project(
    installed: Path, tmp_path: Path
) -> None:
    python, agentwake = installed / "python", installed / "agentwake"
    assert (installed / "agentwake-demo").is_file()
    probe = (
        "import agentwake, json, importlib.metadata as m;"
        "print(json.dumps([agentwake.__file__, str(m.distribution('agentwake').locate_file('')),"
        " m.version('agentwake')]))"
    )
    module, dist, version = json.loads(ok(run([python, "-c", probe], cwd=tmp_path)))
    for path in (module, dist):  # the wheel in the fresh venv, not the checkout nor its editable install
        assert Path(path).resolve().is_relative_to(installed.parent.resolve()), (module, dist)
    assert ok(run([agentwake, "--version"], cwd=tmp_path)).strip() == f"agentwake {version}"

    project = tmp_path / "my-agent"
    project.mkdir()
    said = ok(run([agentwake, "init"], cwd=project))
    assert "agentwake check" in said and (project / "agentwake.toml").is_file()
    assert "config OK" in " ".join(ok(run([agentwake, "check"], cwd=project)).split())

    service = subprocess.Popen(
        [str(agentwake), "run"],
        cwd=project,
        # Any free port for the endpoint: 9464 may be taken on this machine.
        env=clean_env(DEMO_RATE="5", AGENTWAKE_LISTEN="127.0.0.1:0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        done: list[dict[str, Any]] = []
        while not done:
            assert service.poll() is None, f"agentwake run ended early:\n{service.communicate()[0]}"
            assert time.monotonic() < deadline, "no agent action within the timeout"
            done = [r for r in actions(agentwake, project) if r["status"] == "completed" and r["tools"]]
        service.send_signal(signal.SIGINT)
        output, _ = service.communicate(timeout=30)
    finally:
        if service.poll() is None:
            service.kill()
            service.communicate()
    assert service.returncode == 0, output
    runs = [r for r in actions(agentwake, project) if r["status"] == "completed" and r["tools"]]
    assert runs and runs[0]["tools"][0].startswith("demo__"), runs
    assert "comment added" in output or "acknowledged" in output, output
    assert (project / "agentwake.db").is_file() and (project / "demo.db").is_file()


# ---- the playgrounds (agentwake init --example), from the wheel (slow) -------------------------

# What each playground's first event has the offline model ask of its fake, as the bridge prints it,
# and how many agent runs that takes.
SLACK_CALL = r"fake Slack got POST chat\.postMessage in C0GENERAL"
PLAYGROUND_CALLS = {
    "github": ([r"fake GitHub got POST /repos/acme/demo/issues/1/comments"], 1),
    "slack": ([SLACK_CALL], 1),
    "pagerduty": ([r"fake PagerDuty got POST /incidents/\w+/notes"], 1),
    "triage": (
        [
            r"fake GitHub got POST /repos/acme/demo/issues/1/comments",
            # The P1 incident's rule may post to the triage channel (its first writer) or note the incident.
            r"fake PagerDuty got POST /incidents/\w+/notes|fake Slack got POST chat\.postMessage in C0123ABCD",
            SLACK_CALL,
        ],
        3,
    ),
}
# One more delivery, sent with `agentwake bridge send-test` while the playground runs.
PLAYGROUND_SEND = {
    "github": ("github", "issue_comment.created"),
    "slack": ("slack", "app_mention"),
    "pagerduty": ("pagerduty", "incident.triggered"),
    "triage": ("slack", "app_mention"),
}


@pytest.mark.slow
@pytest.mark.parametrize("example", list(PLAYGROUND_CALLS))
def test_each_playground_runs_from_the_wheel_offline(installed: Path, tmp_path: Path, example: str) -> None:
    """`init --example NAME`, `check`, `run`: the fake's first event becomes an agent action whose
    tool call lands on the fake; `bridge send-test` then delivers one more, and it runs too."""
    agentwake = installed / "agentwake"
    project = tmp_path / f"{example}-playground"
    said = ok(run([agentwake, "init", "--example", example, project], cwd=tmp_path))
    assert "agentwake run" in said and "send-test" in said, said
    assert "config OK" in " ".join(ok(run([agentwake, "check"], cwd=project)).split())
    assert not list(project.glob(".agentwake-bridge/*/playground.json"))  # check sent nothing

    expected, first_runs = PLAYGROUND_CALLS[example]
    lines: list[str] = []
    arrived: queue.Queue[str | None] = queue.Queue()
    service = subprocess.Popen(
        [str(agentwake), "run"],
        cwd=project,
        env=clean_env(AGENTWAKE_LISTEN="127.0.0.1:0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def read() -> None:
        assert service.stdout is not None
        for line in service.stdout:
            arrived.put(line)
        arrived.put(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        # The run's output, until every expected write on the fake was printed.
        while not all(any(re.search(w, line) for line in lines) for w in expected):
            left = deadline - time.monotonic()
            assert left > 0, "the playground's writes did not come:\n" + "".join(lines)
            try:
                line = arrived.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, "agentwake run ended early:\n" + "".join(lines)
            lines.append(line)
        done = [r for r in actions(agentwake, project) if r["status"] == "completed" and r["tools"]]
        while len(done) < first_runs:
            assert time.monotonic() < deadline, f"no completed runs: {done}"
            done = [r for r in actions(agentwake, project) if r["status"] == "completed" and r["tools"]]

        upstream, event = PLAYGROUND_SEND[example]
        sent = ok(run([agentwake, "bridge", "send-test", upstream, event], cwd=project))
        assert re.search(r"HTTP 20[02] .*accepted", sent), sent
        while len(done) < first_runs + 1:
            assert time.monotonic() < deadline, f"the send-test delivery did not run: {done}"
            done = [r for r in actions(agentwake, project) if r["status"] == "completed" and r["tools"]]
        service.send_signal(signal.SIGINT)
        service.wait(timeout=30)
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
        reader.join(timeout=30)
        if service.stdout is not None:
            service.stdout.close()
    while not arrived.empty():
        lines.append(arrived.get() or "")
    output = "".join(lines)
    assert service.returncode == 0, output
    assert not list(project.glob(".agentwake-bridge/*/playground.json")), "the playground file outlived run"
    assert "Traceback" not in output, output
