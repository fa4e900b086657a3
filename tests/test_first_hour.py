"""The first hour of a new user (issue 15): init, doctor, models, status after a demo, sling hints, help.

Real git repositories, real `ov` processes; nothing is mocked.
"""

from __future__ import annotations

import json
import sqlite3
import typing as t
from pathlib import Path

import yaml

from conftest import make_repo, run_git, run_ov
from overstory.paths import ProjectPaths


def _check(document: dict[str, t.Any], name: str) -> dict[str, t.Any]:
    return next(check for check in document["checks"] if check["name"] == name)


# ---- ov init: canonical branch, models, what to commit ------------------------------------------


def test_init_takes_the_branch_you_are_on_and_doctor_warns_when_you_leave_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    run_git(repo, "branch", "-m", "main", "trunk")
    result = run_ov("init", cwd=repo)
    assert result.returncode == 0, result.stderr
    assert "canonical branch: trunk (the branch you are on" in result.stdout
    config = yaml.safe_load((repo / ".overstory" / "config.yaml").read_text())
    assert config["project"]["canonical_branch"] == "trunk"
    effective = json.loads(run_ov("config", "--json", cwd=repo).stdout)
    assert effective["project"]["canonical_branch"] == "trunk"

    on_trunk = json.loads(run_ov("doctor", "--json", cwd=repo).stdout)
    assert _check(on_trunk, "canonical branch")["status"] == "ok"
    run_git(repo, "switch", "-q", "-c", "feature")
    doctor = run_ov("doctor", "--json", cwd=repo)
    assert doctor.returncode == 0, "a warning does not fail doctor"
    check = _check(json.loads(doctor.stdout), "canonical branch")
    assert check["status"] == "warn" and "you are on feature" in check["detail"] and "trunk" in check["detail"]
    assert "canonical_branch" in check["hint"]


def test_init_quotes_a_branch_that_yaml_would_read_as_a_number(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    run_git(repo, "branch", "-m", "main", "2024")
    assert run_ov("init", cwd=repo).returncode == 0
    effective = json.loads(run_ov("config", "--json", cwd=repo).stdout)
    assert effective["project"]["canonical_branch"] == "2024"


def test_init_on_a_detached_head_says_so(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    run_git(repo, "checkout", "-q", "--detach")
    result = run_ov("init", "--json", cwd=repo)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["canonical_branch"], report["branch_detected"]) == ("main", False)
    assert "HEAD is detached" in run_ov("init", "--force", cwd=repo).stdout


def test_init_config_gives_builders_and_scouts_cheaper_models_and_says_so(git_repo: Path) -> None:
    result = run_ov("init", cwd=git_repo)
    assert "builders use sonnet, scouts haiku" in result.stdout
    config = yaml.safe_load((git_repo / ".overstory" / "config.yaml").read_text())
    assert config["models"] == {"builder": "sonnet", "scout": "haiku"}


def test_after_committing_what_init_says_git_status_stays_clean_through_a_run(git_repo: Path) -> None:
    """`ov init` tells the user what to commit; after that, agents, logs and databases never dirty the repo."""
    result = run_ov("init", cwd=git_repo)
    commit_line = next(line.strip() for line in result.stdout.splitlines() if line.strip().startswith("git add"))
    assert commit_line == "git add .overstory && git commit -m 'ov: project config'"
    run_git(git_repo, "add", ".overstory")
    run_git(git_repo, "commit", "-q", "-m", "ov: project config")
    committed = run_git(git_repo, "ls-files", ".overstory").split()
    assert ".overstory/config.yaml" in committed and ".overstory/.gitignore" in committed
    assert any(p.startswith(".overstory/agents/") for p in committed)
    assert not [p for p in committed if p.endswith(".db")]
    # A whole agent life: worktree, logs, run files, databases, a local config, a stray future file.
    sling = run_ov("sling", "builder", "t1", "--runtime", "scripted", "--prompt", "add notes", cwd=git_repo)
    assert sling.returncode == 0, sling.stderr
    from agent_helpers import wait_terminal

    assert wait_terminal(ProjectPaths(git_repo), "builder-t1").state == "completed"
    (git_repo / ".overstory" / "config.local.yaml").write_text("turns:\n  max_retries: 1\n")
    (git_repo / ".overstory" / "something-new.json").write_text("{}")
    assert (git_repo / ".overstory" / "logs").is_dir() and (git_repo / ".overstory" / "worktrees" / "builder-t1").is_dir()
    assert run_git(git_repo, "status", "--porcelain", "--untracked-files=all") == ""


# ---- ov status after ov demo ------------------------------------------------------------------


def test_status_says_how_to_see_the_finished_agents_it_hides(project: ProjectPaths, state_db: sqlite3.Connection) -> None:
    from overstory.store import sessions

    for name in ("scout-survey", "builder-docs"):
        generation = sessions.create_session(state_db, name=name, capability="builder", task_id=name,
                                             runtime="scripted", actor="test")
        assert sessions.transition(state_db, name, generation, "completed", actor="test").ok
    only_finished = run_ov("status", cwd=project.root)
    assert only_finished.stdout.splitlines()[0] == "no active agents; 2 finished (`ov status --all` shows them)"
    generation = sessions.create_session(state_db, name="builder-live", capability="builder", task_id="live",
                                         runtime="scripted", actor="test")
    assert sessions.transition(state_db, "builder-live", generation, "in_turn", actor="test").ok
    mixed = run_ov("status", cwd=project.root).stdout
    assert "builder-live" in mixed and "(2 completed agents not shown: `ov status --all`)" in mixed
    every = run_ov("status", "--all", cwd=project.root).stdout
    assert "scout-survey" in every and "not shown" not in every


def test_demo_suggests_a_status_that_shows_its_agents(tmp_path: Path) -> None:
    result = run_ov("demo", "--dir", str(tmp_path / "demo"), cwd=tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    suggested = next(line.strip() for line in result.stdout.splitlines() if line.strip().startswith("ov status"))
    command = suggested.split("#")[0].split()
    shown = run_ov(*command[1:], cwd=tmp_path / "demo").stdout
    for name in ("scout-survey", "builder-docs", "builder-api"):
        assert name in shown, shown


# ---- ov sling without a prompt, ov guard in help ------------------------------------------------


def test_sling_without_prompt_or_spec_warns(project: ProjectPaths) -> None:
    bare = run_ov("sling", "scout", "look", "--runtime", "scripted", cwd=project.root)
    assert bare.returncode == 0, bare.stderr
    assert "no --prompt or --spec" in bare.stderr and "task id 'look'" in bare.stderr
    assert bare.stderr.count("\n") == 1
    with_prompt = run_ov("sling", "scout", "look2", "--runtime", "scripted", "--prompt", "survey", cwd=project.root)
    assert with_prompt.returncode == 0 and "warning" not in with_prompt.stderr


def test_guard_is_hidden_from_help_but_documented(tmp_path: Path) -> None:
    from conftest import REPO_ROOT

    top = run_ov("--help", cwd=tmp_path)
    listed = [line.split()[0] for line in top.stdout.split("Commands:")[1].splitlines() if line.strip()]
    assert "guard" not in listed and "sling" in listed
    own = run_ov("guard", "--help", cwd=tmp_path)
    assert own.returncode == 0 and "PreToolUse" in own.stdout
    readme = (REPO_ROOT / "README.md").read_text()
    assert "| `ov guard`" in readme


# ---- the scripted runtime's scenario format, as documented ------------------------------------


def test_the_documented_scenario_example_plays_as_documented(project: ProjectPaths, tmp_path: Path) -> None:
    """The YAML example of docs/scripted-runtime.md is a working scenario: a builder following it commits, reports."""
    import re

    from agent_helpers import wait_terminal
    from conftest import REPO_ROOT

    page = (REPO_ROOT / "docs" / "scripted-runtime.md").read_text()
    [example] = [block for block in re.findall(r"```yaml\n(.*?)```", page, flags=re.S)
                 if block.startswith("agents:")]  # the scenario; other yaml blocks are other files
    plan = tmp_path / "plan.yaml"
    plan.write_text(example)
    result = run_ov("sling", "builder", "docs", "--runtime", "scripted", "--scenario", str(plan), "--prompt", "x",
                    cwd=project.root)
    assert result.returncode == 0, result.stderr
    agent = wait_terminal(project, "builder-docs")
    assert agent.state == "completed", agent.state_reason
    assert run_git(project.root, "show", "ov/builder-docs:notes.md") == "# Notes\n"
    conn = sqlite3.connect(project.state_db)
    body = conn.execute("SELECT body FROM mail WHERE type = 'worker_done'").fetchone()[0]
    conn.close()
    assert body == "docs done", "${OVERSTORY_TASK_ID} was filled in"
    help_text = run_ov("demo", "--help", cwd=project.root).stdout
    assert "docs/scripted-runtime.md" in help_text and "## The scripted runtime's scenarios" in page


def test_not_logged_in_is_an_auth_failure_that_is_not_retried() -> None:
    """The result line of claude 2.1.197 run with no key and no login (captured in tests/e2e/test_demo_claude.py)."""
    from overstory.runtimes import get_runtime
    from overstory.runtimes.base import AUTH

    parser = get_runtime("claude").new_parser()
    parser.feed(json.dumps({"type": "result", "subtype": "success", "is_error": True, "api_error_status": None,
                            "num_turns": 1, "result": "Not logged in \u00b7 Please run /login", "session_id": "s",
                            "total_cost_usd": 0, "usage": {"input_tokens": 0, "output_tokens": 0}}))
    assert parser.finished and not parser.succeeded
    failure = parser.failure(resumed=False)
    assert failure.kind == AUTH and "Not logged in" in failure.reason
