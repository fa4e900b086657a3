"""A turn's checkpoint reads its worktree's HEAD and ``git status`` in one git call (porcelain v2 with ``--branch``).
It must say what the two calls it replaced said: ``git rev-parse HEAD`` and ``git status --porcelain=v1``, read
here the way ov read them before, on real repositories in every state a turn can leave."""

from __future__ import annotations

import subprocess
import types
import typing as t
from pathlib import Path

import pytest

from overstory.agents.checkpoint import STATUS_SAMPLE, worktree_state


def _git(cwd: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check).stdout


def _two_calls(cwd: Path) -> tuple[str | None, dict[str, object]]:
    """The reading the one call replaced (rev-parse, then porcelain v1)."""
    head = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=cwd, capture_output=True, text=True)
    status = _git(cwd, "status", "--porcelain=v1", "--untracked-files=normal")
    counts = {"modified": 0, "added": 0, "deleted": 0, "renamed": 0, "untracked": 0, "conflicted": 0}
    paths = []
    for line in status.splitlines():
        code, path = line[:2], line[3:]
        kind = ("untracked" if code == "??" else "conflicted" if "U" in code or code in ("AA", "DD")
                else "renamed" if "R" in code else "deleted" if "D" in code else "added" if "A" in code
                else "modified")
        counts[kind] += 1
        if len(paths) < STATUS_SAMPLE:
            paths.append(f"{code.strip() or '?'} {path}")
    return (head.stdout.strip() or None) if head.returncode == 0 else None, \
        {"clean": not status.strip(), **counts, "paths": paths}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "t@example.com")
    _git(root, "config", "user.name", "t")
    return root


def _commit(root: Path, files: dict[str, str], message: str = "c") -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message)


def test_an_empty_repository_has_no_head(repo: Path) -> None:
    assert worktree_state(str(repo)) == _two_calls(repo) == (None, {**_two_calls(repo)[1], "clean": True})
    (repo / "new file.txt").write_text("x")
    assert worktree_state(str(repo)) == _two_calls(repo)


def test_every_kind_of_change_reads_the_same(repo: Path) -> None:
    _commit(repo, {"a.txt": "a\n", "b.txt": "b\n", "c.txt": "c\n", "dir/d.txt": "d\n", "gone.txt": "g\n",
                   "ünï cödé.txt": "u\n", "old name.txt": "r\n" * 20})
    assert worktree_state(str(repo)) == _two_calls(repo)
    assert worktree_state(str(repo))[1]["clean"] is True
    (repo / "a.txt").write_text("changed\n")                     # modified in the worktree
    (repo / "b.txt").write_text("staged\n")
    _git(repo, "add", "b.txt")                                   # modified in the index
    (repo / "gone.txt").unlink()                                 # deleted
    _git(repo, "mv", "old name.txt", "new name.txt")             # renamed (a name with spaces)
    (repo / "added.txt").write_text("n\n")
    _git(repo, "add", "added.txt")                               # added
    (repo / "untracked dir").mkdir()
    (repo / "untracked dir" / "x.txt").write_text("x")           # untracked
    (repo / "ünï cödé.txt").write_text("v\n")                    # quoted by git
    (repo / "tab\tname.txt").write_text("t")
    head, summary = worktree_state(str(repo))
    assert (head, summary) == _two_calls(repo)
    assert head == _git(repo, "rev-parse", "HEAD").strip()
    assert summary["renamed"] == 1 and summary["deleted"] == 1 and summary["added"] == 1
    assert 'R "old name.txt" -> "new name.txt"' in summary["paths"]


def test_a_merge_conflict_reads_the_same(repo: Path) -> None:
    _commit(repo, {"f.txt": "base\n", "g.txt": "base\n"})
    _git(repo, "checkout", "-q", "-b", "other")
    _commit(repo, {"f.txt": "other\n"})
    _git(repo, "rm", "-q", "g.txt")
    _git(repo, "commit", "-q", "-m", "rm g")
    _git(repo, "checkout", "-q", "main")
    _commit(repo, {"f.txt": "main\n", "g.txt": "main\n", "both.txt": "main\n"})
    _git(repo, "merge", "-q", "other", check=False)
    head, summary = worktree_state(str(repo))
    assert (head, summary) == _two_calls(repo)
    assert summary["conflicted"] == 2


def test_a_detached_head_and_many_changes_read_the_same(repo: Path) -> None:
    _commit(repo, {f"f{i}.txt": "x\n" for i in range(STATUS_SAMPLE + 5)})
    _git(repo, "checkout", "-q", "--detach")
    for i in range(STATUS_SAMPLE + 5):
        (repo / f"f{i}.txt").write_text("y\n")
    assert worktree_state(str(repo)) == _two_calls(repo)
    assert len(worktree_state(str(repo))[1]["paths"]) == STATUS_SAMPLE


def test_not_a_repository_says_nothing(tmp_path: Path) -> None:
    assert worktree_state(str(tmp_path)) == (None, None)
    assert worktree_state(None) == (None, None)


# ---- the first turn in a worktree its spawn checked out: HEAD only --------------------------------------------


def _agent(worktree: Path, **fields: object) -> t.Any:
    """The fields of a session row that ``save_start`` reads."""
    values: dict[str, object] = {"name": "builder-x", "generation": 1, "worktree": str(worktree), "turns": 0,
                                 "spec": {"new_worktree": True}, "cost_usd": 0.0, "input_tokens": 0,
                                 "output_tokens": 0}
    values.update(fields)
    return types.SimpleNamespace(**values)


@pytest.mark.parametrize(("fields", "attempt", "resume", "skipped"), [
    ({}, 0, None, True),                                 # the first attempt of the first turn: HEAD only
    ({"turns": 1}, 0, None, False),                      # a later turn
    ({}, 1, None, False),                                # a retried first turn (the failed attempt may have written)
    ({}, 0, "session-1", False),                         # a session to continue
    ({"spec": {}}, 0, None, False),                      # a reused worktree (`ov resume --restart`), or an old row
])
def test_only_a_new_worktrees_first_turn_skips_the_status(repo: Path, tmp_path: Path, fields: dict[str, object],
                                                         attempt: int, resume: str | None, skipped: bool) -> None:
    from overstory.agents.checkpoint import save_start
    from overstory.store import checkpoints
    from overstory.store.db import open_state

    _commit(repo, {"a.txt": "a\n"})
    (repo / "a.txt").write_text("changed\n")  # what a status would see
    state = open_state(tmp_path / "state.db")
    save_start(state, _agent(repo, **fields), "turn-1", attempt=attempt, scope="", mail_ids=[],
               resume_session_id=resume, cwd=str(repo), started_ms=1)
    mark = checkpoints.by_turn(state, ["turn-1"])["turn-1"]
    assert mark["head"] == _git(repo, "rev-parse", "HEAD").strip()
    if skipped:
        assert mark["git_status"] is None
    else:
        assert mark["git_status"]["modified"] == 1 and not mark["git_status"]["clean"]


def test_a_sling_marks_the_worktree_it_checked_out(tmp_path: Path) -> None:
    from conftest import make_repo, run_ov
    from overstory.paths import ProjectPaths
    from overstory.project.init import init_project
    from overstory.store import sessions
    from overstory.store.db import open_state

    root = make_repo(tmp_path / "project")
    init_project(root)
    done = run_ov("sling", "builder", "t1", "--runtime", "scripted", "--prompt", "x", "--json", cwd=root)
    assert done.returncode == 0, done.stderr
    project = ProjectPaths(root)
    agent = sessions.get(open_state(project.state_db), "builder-t1")
    assert agent is not None and agent.spec.get("new_worktree") is True
    run_ov("stop", "builder-t1", "--clean", "--force", cwd=root)
