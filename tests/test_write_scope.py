"""Write scopes (`ov sling --files`, issue 31): the patterns, the guard's refusals, the sling's checks.

The guard cases call ``guards.decide`` with a real worktree on disk (paths are resolved for real);
the CLI cases run the real `ov`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import run_git, run_ov
from overstory import guards
from overstory.guards import scope

# ---- the patterns --------------------------------------------------------------------------------


def test_patterns_match_files_directories_and_globs() -> None:
    patterns = scope.parse(["src/calc.py,src/calc/**", "docs/", "tests/test_*.py"])
    assert patterns == ["src/calc.py", "src/calc/**", "docs/**", "tests/test_*.py"]
    inside = ["src/calc.py", "src/calc", "src/calc/x.py", "src/calc/a/b.py", "docs/a/b.md", "tests/test_a.py"]
    outside = ["src/b.py", "src/calcx.py", "src/calc.pyc", "tests/sub/test_a.py", "README.md", "src"]
    assert [p for p in inside if not scope.matches(patterns, p)] == []
    assert [p for p in outside if scope.matches(patterns, p)] == []
    assert scope.outside(patterns, ["src/b.py", "src/calc.py", "README.md"]) == ["README.md", "src/b.py"]
    assert scope.matches(["**/*.md"], "README.md") and scope.matches(["**/*.md"], "a/b/c.md")
    assert scope.matches(["x/[!a].py"], "x/b.py") and not scope.matches(["x/[!a].py"], "x/a.py")
    assert scope.matches([], "anything/at/all")  # no scope: the whole worktree
    # Directories on the way to the scope (a new one may be made), and not beyond or beside it.
    assert scope.leads_to(["src/calc.py"], "src") and not scope.leads_to(["src/calc.py"], "src/calc")
    assert scope.leads_to(["src/**/x.py"], "src/deep/er") and not scope.leads_to(["src/**/x.py"], "lib")
    assert not scope.leads_to(["docs/*.md"], "src")


@pytest.mark.parametrize(("value", "says"), [
    ("/etc/passwd", "is absolute"),
    ("../other/x.py", "leaves the worktree (..)"),
    ("src/../../x.py", "leaves the worktree (..)"),
    ("src/[a.py", "'[' without its ']'"),
    ("src/a**.py", "** must be a whole part"),
    ("~/x.py", "starts with ~"),
    (".git/config", "git's metadata"),
    ("", "an empty pattern"),
    (".", "names the whole worktree"),
    ("a\nb", "control character"),
])
def test_bad_patterns_are_refused_with_a_reason(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        scope.parse([value])
    assert says in str(caught.value)


def test_overlap_is_found_between_files_globs_and_directories() -> None:
    assert scope.overlap(["src/a.py"], ["src/*.py"]) == [("src/a.py", "src/*.py")]
    assert scope.overlap(["src/**"], ["src/x/y.py"]) == [("src/**", "src/x/y.py")]
    assert scope.overlap(["src/a.py"], ["src/b.py"]) == []
    assert scope.overlap(["docs/**"], ["src/**"]) == []
    assert scope.overlap(["src/*.py"], ["lib/*.py"]) == []
    assert scope.overlap(["src/a.py", "lib/**"], ["lib/x/**"]) == [("lib/**", "lib/x/**")]


# ---- the guard ----------------------------------------------------------------------------------


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    wt = tmp_path / "proj" / ".overstory" / "worktrees" / "builder-a"
    (wt / "src" / "calc").mkdir(parents=True)
    for name in ("src/a.py", "src/b.py", "src/calc/x.py"):
        (wt / name).write_text("x = 1\n")
    return wt


def _env(worktree: Path, files: str | None) -> dict[str, str]:
    env = {"HOME": "/nonexistent-home/agent", "OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_CAPABILITY": "builder",
           "OVERSTORY_PROJECT_ROOT": str(worktree.parents[2]), "OVERSTORY_WORKTREE": str(worktree),
           "OVERSTORY_PARENT": "lead-l"}
    if files is not None:
        env[scope.ENV] = scope.to_env(scope.parse([files]))
    return env


def _decide(worktree: Path, files: str | None, tool: str, tool_input: dict) -> guards.Decision:
    return guards.decide({"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": tool_input,
                          "cwd": str(worktree)}, _env(worktree, files))


@pytest.mark.parametrize(("tool", "tool_input"), [
    ("Write", {"file_path": "{wt}/src/b.py", "content": "y\n"}),
    ("Edit", {"file_path": "{wt}/src/b.py", "old_string": "x", "new_string": "y"}),
    ("MultiEdit", {"file_path": "src/b.py", "edits": []}),
    ("NotebookEdit", {"notebook_path": "{wt}/src/b.py", "new_source": "y"}),
    ("Bash", {"command": "echo y > src/b.py"}),
    ("Bash", {"command": "printf y >> {wt}/src/b.py"}),
    ("Bash", {"command": "echo y | tee src/a.py src/b.py"}),
    ("Bash", {"command": "sed -i s/x/y/ src/b.py"}),
    ("Bash", {"command": "cp src/a.py src/b.py"}),
    ("Bash", {"command": "mv src/a.py src/new.py"}),
    ("Bash", {"command": "rm src/b.py"}),
    ("Bash", {"command": "rm -r src"}),
    ("Bash", {"command": "cd src && echo y > b.py"}),
    ("Bash", {"command": "touch src/*.py"}),
])
def test_a_write_outside_the_scope_is_refused_naming_the_scope_and_the_lead(worktree: Path, tool: str,
                                                                           tool_input: dict) -> None:
    filled = json.loads(json.dumps(tool_input).replace("{wt}", str(worktree)))
    decision = _decide(worktree, "src/a.py", tool, filled)
    assert not decision.allow
    assert "outside builder-a's write scope (src/a.py)" in decision.reason
    assert "ov mail send --to lead-l --type question" in decision.reason
    assert (worktree / "src" / "b.py").read_text() == "x = 1\n"


@pytest.mark.parametrize(("tool", "tool_input"), [
    ("Write", {"file_path": "{wt}/src/a.py", "content": "y\n"}),
    ("Edit", {"file_path": "src/a.py", "old_string": "x", "new_string": "y"}),
    ("Bash", {"command": "echo y > src/a.py && sed -i s/x/y/ src/a.py"}),
    ("Bash", {"command": "echo y > src/calc/new.py"}),
    ("Bash", {"command": "mkdir -p src/calc/deeper && rm -r src/calc"}),
    ("Bash", {"command": "mkdir -p lib/tools"}),  # new directories on the way to the scope
    ("Read", {"file_path": "{wt}/src/b.py"}),  # reading stays free
    ("Bash", {"command": "cat src/b.py > /tmp/copy.py && grep x src/*.py"}),  # and the temp dir is not the worktree
    ("Bash", {"command": "git add src/a.py && git commit -qm a"}),
])
def test_writes_inside_the_scope_and_reads_anywhere_are_allowed(worktree: Path, tool: str, tool_input: dict) -> None:
    filled = json.loads(json.dumps(tool_input).replace("{wt}", str(worktree)))
    decision = _decide(worktree, "src/a.py,src/calc/**,lib/tools/**", tool, filled)
    assert decision.allow, decision.reason


def test_the_guard_reads_the_scope_from_the_variable_the_turn_sets() -> None:
    from overstory.guards import agent

    assert agent._SCOPE_ENV == scope.ENV  # agent.py reads it without importing scope.py (`ov guard`'s start-up)


@pytest.mark.parametrize("name", ["[x", "[]", "[!", "a[b/c", "[^]"])
def test_a_name_with_an_unclosed_bracket_is_judged_not_looped_on(worktree: Path, name: str) -> None:
    """A new path whose name holds a `[` with no `]` once sent the scope's glob code into an endless loop that ate
    memory until the guard died (a scoped builder's `touch '[x/y'`): it is a plain character, outside the scope."""
    assert not scope.leads_to(["d/*.txt", "src/calc.py"], f"{name}/y")
    assert scope.leads_to(["[[]x/*.txt"], "[x")  # a pattern's own [...] still is a class
    decision = _decide(worktree, "src/a.py", "Bash", {"command": f"mkdir -p '{name}/y' && touch '{name}/y/z'"})
    assert not decision.allow and "write scope (src/a.py)" in decision.reason


def test_an_existing_directory_outside_the_scope_is_not_a_way_in(worktree: Path) -> None:
    decision = _decide(worktree, "src/calc.py", "Bash", {"command": "cp /etc/hostname src"})
    assert not decision.allow and "write scope (src/calc.py)" in decision.reason


def test_without_a_scope_and_outside_the_worktree_the_rules_are_unchanged(worktree: Path) -> None:
    assert _decide(worktree, None, "Write", {"file_path": str(worktree / "src" / "b.py")}).allow
    outside = _decide(worktree, "src/a.py", "Write", {"file_path": str(worktree.parents[2] / "planted.py")})
    assert not outside.allow and "project checkout" in outside.reason and "write scope" not in outside.reason
    assert _decide(worktree, "src/a.py", "Write", {"file_path": "/tmp/scratch.py"}).allow
    git_meta = _decide(worktree, "src/a.py", "Bash", {"command": "echo x > .git"})
    assert not git_meta.allow and "git metadata" in git_meta.reason


# ---- ov sling --files ------------------------------------------------------------------------------


@pytest.mark.parametrize(("files", "says"), [
    ("/abs/x.py", "is absolute"),
    ("../x.py", "leaves the worktree"),
    ("src/[a.py", "not a valid glob"),
])
def test_sling_refuses_a_bad_scope_with_one_usage_line_and_creates_nothing(project, files: str, says: str) -> None:
    result = run_ov("sling", "builder", "t", "--runtime", "scripted", "--files", files, cwd=project.root)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and says in result.stderr and "--files" in result.stderr
    assert "Traceback" not in result.stderr
    assert run_git(project.root, "branch", "--list", "ov/builder-t") == ""
    assert not project.worktree("builder-t").exists()


def test_the_scope_is_stored_and_given_to_each_turn(project, tmp_path: Path) -> None:
    from agent_helpers import agent_state, wait_terminal, write_scenario

    scenario = write_scenario(tmp_path / "s.json", [{"actions": [
        {"bash": "printenv OVERSTORY_WRITE_SCOPE > /tmp/scope.txt; ov mail send --type worker_done "
                 "--subject \"$(tr '\\n' ' ' < /tmp/scope.txt)\" --body ok"}]}])
    result = run_ov("sling", "builder", "t", "--runtime", "scripted", "--scenario", str(scenario),
                    "--files", "src/a.py, src/calc/", "--files", "docs/*.md", cwd=project.root)
    assert result.returncode == 0, result.stderr
    agent = agent_state(project, "builder-t")
    assert agent is not None and agent.spec["write_scope"] == ["src/a.py", "src/calc/**", "docs/*.md"]
    instructions = next(project.run_dir.joinpath("builder-t").rglob("CLAUDE.md")).read_text()
    assert "`src/calc/**`" in instructions and "ov refuses your writes to other files" in instructions
    assert wait_terminal(project, "builder-t").state == "completed"
    from agent_helpers import mail_rows

    [done] = mail_rows(project, type="worker_done")
    assert done["subject"].split() == ["src/a.py", "src/calc/**", "docs/*.md"]


def test_overlapping_scopes_warn_at_sling_show_in_status_and_can_be_refused(project, tmp_path: Path) -> None:
    from agent_helpers import write_scenario
    from test_watchdog import write_local_config

    idle = write_scenario(tmp_path / "idle.json", [{"actions": [{"text": "thinking"}]}])

    def sling(task: str, files: str):
        return run_ov("sling", "builder", task, "--runtime", "scripted", "--scenario", str(idle), "--files", files,
                      cwd=project.root)

    assert sling("a", "src/a.py,src/calc/**").stderr.count("warning") == 1  # only the missing --prompt
    second = sling("b", "src/*.py")
    assert second.returncode == 0, second.stderr
    assert "ov: warning: the write scopes of builder-b and builder-a overlap (src/*.py ~ src/a.py)" in second.stderr
    third = sling("c", "docs/**")
    assert third.returncode == 0 and "overlap" not in third.stderr

    status = run_ov("status", cwd=project.root)
    assert "overlap: the write scopes of builder-a and builder-b overlap (src/a.py ~ src/*.py)" in status.stdout
    document = json.loads(run_ov("status", "--json", cwd=project.root).stdout)
    assert [o["agents"] for o in document["scope_overlaps"]] == [["builder-a", "builder-b"]]

    write_local_config(project, agents={"exclusive_scopes": True})
    refused = sling("d", "src/calc/x.py")
    assert refused.returncode == 1
    assert "overlap (src/calc/x.py ~ src/calc/**)" in refused.stderr and "agents.exclusive_scopes" in refused.stderr
    assert run_git(project.root, "branch", "--list", "ov/builder-d") == ""
    for name in ("builder-a", "builder-b", "builder-c"):
        run_ov("stop", name, "--force", cwd=project.root)
    assert "overlap" not in run_ov("status", cwd=project.root).stdout
    assert os.environ.get(scope.ENV) is None  # nothing leaked into the test's own environment
