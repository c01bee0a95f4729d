"""`agentwake init`, the packaged defaults it copies, the prompts fallback and `--version`."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from conftest import REPO
from typer.testing import CliRunner

from agentwake.agent.prompts import PACKAGED_PROMPTS
from agentwake.cli import app
from agentwake.cli.init import DEFAULTS, planned_files

runner = CliRunner()
EXPECTED = [
    "agentwake.toml",
    "policies/10-triage.toml",
    "policies/99-default.toml",
    "policies/github-triage.toml",
    "policies/triage.toml",
    "prompts/alert.fired.md.j2",
    "prompts/event.md.j2",
    "prompts/github.answer-comment.md.j2",
    "prompts/github.ci-failure.md.j2",
    "prompts/github.close-duplicate.md.j2",
    "prompts/github.close-spam.md.j2",
    "prompts/github.route-pull-request.md.j2",
    "prompts/github.security-alert.md.j2",
    "prompts/github.suspicious.md.j2",
    "prompts/github.triage-issue.md.j2",
    "prompts/system.md.j2",
    "prompts/ticket.created.md.j2",
    "prompts/triage.pagerduty-p1.md.j2",
    "prompts/triage.settings.md.j2",
    "prompts/triage.slack-incident-action.md.j2",
    "prompts/triage.slack-mention.md.j2",
]


def flat(text: str) -> str:
    return " ".join(text.split())


def written(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize(
    ("folder", "packaged_folder"), [("prompts", "prompts"), ("policies", "project/policies")]
)
def test_the_packaged_defaults_are_the_repositorys_own_files(folder: str, packaged_folder: str) -> None:
    """The bundled config uses the top-level folders; the wheel ships copies. They cannot drift."""
    top, packaged = written(REPO / folder), written(DEFAULTS / packaged_folder)
    assert top and packaged == top, (
        f"agentwake/defaults/{packaged_folder} differs from {folder}/: copy it over"
    )


def test_the_packaged_prompts_are_where_the_renderer_falls_back_to() -> None:
    assert PACKAGED_PROMPTS == DEFAULTS / "prompts"
    assert (PACKAGED_PROMPTS / "system.md.j2").is_file()


def test_init_writes_a_config_policies_and_prompts_into_an_empty_folder(tmp_path: Path) -> None:
    project = tmp_path / "new" / "project"  # created, parents included
    result = runner.invoke(app, ["init", str(project)])
    assert result.exit_code == 0, result.output
    files = written(project)
    assert sorted(files) == EXPECTED
    for source, relative in planned_files():
        assert files[relative.as_posix()] == source.read_bytes()
    text = flat(result.output)
    assert f"Wrote a new agentwake project in {project}" in text
    for name in EXPECTED:
        assert name in text
    config = project / "agentwake.toml"
    assert "agentwake check -c" in text and "agentwake run -c" in text and str(config) in text
    assert 'command = "agentwake-demo"' in files["agentwake.toml"].decode()
    assert 'model = "agentwake/offline"' in files["agentwake.toml"].decode()


def test_init_in_the_current_folder_needs_no_config_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    assert sorted(written(tmp_path)) == EXPECTED
    assert "agentwake check " in result.output and " -c " not in result.output


def test_init_refuses_to_overwrite_and_then_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "agentwake.toml").write_text("# mine\n")
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "system.md.j2").write_text("My system prompt.\n")
    before = written(tmp_path)
    result = runner.invoke(app, ["init", str(tmp_path)])
    assert result.exit_code == 1
    text = flat(result.output)
    assert "agentwake.toml" in text and "prompts/system.md.j2" in text
    assert "nothing was written" in text and "--force" in text
    assert written(tmp_path) == before  # not even the files that did not exist
    assert not (tmp_path / "policies").exists()


def test_init_with_force_overwrites_what_it_writes_and_keeps_other_files(tmp_path: Path) -> None:
    (tmp_path / "agentwake.toml").write_text("# mine\n")
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "custom.md.j2").write_text("Kept.\n")
    result = runner.invoke(app, ["init", "--force", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "agentwake.toml (overwritten)" in flat(result.output)
    assert (tmp_path / "agentwake.toml").read_bytes() == (
        DEFAULTS / "project" / "agentwake.toml"
    ).read_bytes()
    assert (tmp_path / "prompts" / "custom.md.j2").read_text() == "Kept.\n"
    assert sorted(written(tmp_path)) == sorted([*EXPECTED, "prompts/custom.md.j2"])


def test_init_into_a_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, ["init", str(tmp_path / "file")])
    assert result.exit_code == 1
    assert "is not a folder" in flat(result.output)


def test_init_has_help_on_the_command_and_its_options() -> None:
    result = runner.invoke(app, ["init", "--help"])
    assert result.exit_code == 0
    text = flat(result.output)
    assert "Start a new project in DIR" in text
    assert "--force" in text and "Overwrite" in text and "created if missing" in text


def test_check_passes_on_what_init_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_RATE", "0")
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    result = runner.invoke(app, ["check", "-c", str(tmp_path / "agentwake.toml")])
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "config OK: 1 server(s), 2 subscription(s), agent model agentwake/offline" in text
    assert (tmp_path / "demo.db").is_file()  # the demo server ran in the project folder


def test_a_config_without_prompts_uses_the_packaged_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newcomer's failure: a config in a new folder, no prompts/ beside it."""
    monkeypatch.setenv("DEMO_RATE", "0")
    assert runner.invoke(app, ["init", str(tmp_path)]).exit_code == 0
    for template in (tmp_path / "prompts").iterdir():
        template.unlink()
    (tmp_path / "prompts").rmdir()
    result = runner.invoke(app, ["check", "-c", str(tmp_path / "agentwake.toml")])
    assert result.exit_code == 0, result.output
    assert "not found" not in result.output


def test_a_broken_template_in_the_prompts_folder_still_wins_over_the_packaged_one(tmp_path: Path) -> None:
    project = tmp_path / "project"
    assert runner.invoke(app, ["init", str(project)]).exit_code == 0
    (project / "prompts" / "system.md.j2").write_text("{{ broken\n")
    result = runner.invoke(app, ["check", "-c", str(project / "agentwake.toml")])
    assert result.exit_code == 1
    assert "system.md.j2 line" in flat(result.output)


def test_version_prints_the_installed_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"agentwake {importlib.metadata.version('agentwake')}"
