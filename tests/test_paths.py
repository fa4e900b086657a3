"""Project discovery: from the root, a subdirectory, an agent worktree; overrides; clear failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_repo, run_git, run_ov
from overstory.errors import ProjectNotFound
from overstory.paths import PROJECT_ENV, ProjectPaths, find_project


@pytest.fixture
def agent_worktree(project: ProjectPaths) -> Path:
    """A real `git worktree add` where ov puts agents: .overstory/worktrees/<agent> on ov/<agent>."""
    worktree = project.worktree("builder-task-1")
    run_git(project.root, "worktree", "add", "-q", "-b", "ov/builder-task-1", str(worktree))
    (worktree / "pkg" / "sub").mkdir(parents=True)
    return worktree


def test_from_the_repository_root(project: ProjectPaths) -> None:
    assert find_project(cwd=project.root) == project


def test_from_a_subdirectory(project: ProjectPaths) -> None:
    deep = project.root / "src" / "a" / "b"
    deep.mkdir(parents=True)
    assert find_project(cwd=deep).root == project.root


def test_from_the_current_directory(project: ProjectPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    (project.root / "docs").mkdir()
    monkeypatch.chdir(project.root / "docs")
    assert find_project().root == project.root


def test_from_inside_an_agent_worktree(project: ProjectPaths, agent_worktree: Path) -> None:
    assert (agent_worktree / ".git").is_file(), "a linked worktree has a .git file"
    for start in (agent_worktree, agent_worktree / "pkg", agent_worktree / "pkg" / "sub"):
        assert find_project(cwd=start).root == project.root, start


def test_a_worktree_that_holds_its_own_overstory_still_leads_to_the_main_project(
        project: ProjectPaths, agent_worktree: Path) -> None:
    """If the agent's branch carries a committed .overstory/config.yaml, the main repository still wins."""
    (agent_worktree / ".overstory").mkdir()
    (agent_worktree / ".overstory" / "config.yaml").write_text("{}\n")
    assert find_project(cwd=agent_worktree / "pkg").root == project.root


def test_through_a_symlinked_path(project: ProjectPaths, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(project.root)
    assert find_project(cwd=link / ".overstory").root == project.root


def test_explicit_project_overrides_cwd(project: ProjectPaths, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert find_project(str(project.root), cwd=elsewhere).root == project.root
    assert find_project(project.root, cwd=elsewhere).root == project.root


def test_environment_overrides_cwd(project: ProjectPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = make_repo(tmp_path / "other")
    from overstory.project.init import init_project

    init_project(other)
    monkeypatch.setenv(PROJECT_ENV, str(other))
    assert find_project(cwd=project.root).root == other.resolve()
    # --project beats the environment variable.
    assert find_project(str(project.root), cwd=project.root).root == project.root


def test_an_override_that_is_not_a_project_is_refused(project: ProjectPaths, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ProjectNotFound, match="bare.*ov init"):
        find_project(str(bare), cwd=project.root)
    monkeypatch.setenv(PROJECT_ENV, str(bare))
    with pytest.raises(ProjectNotFound, match="bare"):
        find_project(cwd=project.root)


def test_outside_any_project(tmp_path: Path) -> None:
    outside = tmp_path / "nowhere" / "deeper"
    outside.mkdir(parents=True)
    with pytest.raises(ProjectNotFound) as caught:
        find_project(cwd=outside)
    message = str(caught.value)
    assert "ov init" in message and str(outside) in message and "\n" not in message


def test_a_git_repository_without_ov_is_not_a_project(git_repo: Path) -> None:
    with pytest.raises(ProjectNotFound):
        find_project(cwd=git_repo)


def test_paths_inside_the_project(project: ProjectPaths) -> None:
    ov = project.root / ".overstory"
    assert project.ov_dir == ov
    assert (project.state_db, project.events_db) == (ov / "state.db", ov / "events.db")
    assert project.config_file == ov / "config.yaml"
    assert project.local_config_file == ov / "config.local.yaml"
    assert project.worktree("scout-1") == ov / "worktrees" / "scout-1"
    assert project.is_initialized()


# ---- the same through the real `ov` executable --------------------------------


def _canonical_branch(result_stdout: str) -> str:
    return json.loads(result_stdout)["project"]["canonical_branch"]


def test_cli_finds_the_project_from_an_agent_worktree(project: ProjectPaths, agent_worktree: Path) -> None:
    (project.local_config_file).write_text("project:\n  canonical_branch: trunk\n")
    result = run_ov("config", "--json", cwd=agent_worktree / "pkg" / "sub")
    assert result.returncode == 0, result.stderr
    assert _canonical_branch(result.stdout) == "trunk"


def test_cli_project_option_and_environment(project: ProjectPaths, tmp_path: Path) -> None:
    project.local_config_file.write_text("project:\n  canonical_branch: trunk\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    by_option = run_ov("--project", str(project.root), "config", "--json", cwd=outside)
    assert by_option.returncode == 0, by_option.stderr
    assert _canonical_branch(by_option.stdout) == "trunk"
    by_env = run_ov("config", "--json", cwd=outside, env={PROJECT_ENV: str(project.root)})
    assert by_env.returncode == 0, by_env.stderr
    assert _canonical_branch(by_env.stdout) == "trunk"


def test_cli_outside_a_project(tmp_path: Path) -> None:
    result = run_ov("config", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("ov: error: no ov project found")
    assert len(result.stderr.strip().splitlines()) == 1
    as_json = run_ov("config", "--json", cwd=tmp_path)  # with --json the error is JSON too, one line
    assert (as_json.returncode, as_json.stdout) == (1, "")
    error = json.loads(as_json.stderr)["error"]
    assert error["kind"] == "project_not_found" and error["message"].startswith("no ov project found")
