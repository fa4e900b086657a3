"""The git queries `ov sling` makes on every spawn, answered with fewer git processes, agree with git itself.

`current_branch` reads a main worktree's ``.git/HEAD`` instead of running `git symbolic-ref`; `branch_refs`
answers in one `git for-each-ref` what `branch_tips` plus `show-ref` (for a branch that is not a commit, or
absent) answered before. Each case below compares them with git's own answer on a real repository.
"""

from __future__ import annotations

import subprocess

import pytest

from conftest import run_git
from overstory.gitutil import branch_exists, branch_refs, branch_tips, current_branch


def git_says_branch(root) -> str | None:
    done = subprocess.run(["git", "symbolic-ref", "--quiet", "--short", "HEAD"], cwd=root, capture_output=True,
                          text=True, check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None


@pytest.mark.parametrize("checkout", [
    [],                                                  # main
    ["switch", "-q", "-c", "feature/deep/name"],         # a branch with slashes
    ["switch", "-q", "--detach"],                        # a detached HEAD: None
    ["switch", "-q", "--orphan", "unborn"],              # a branch with no commit yet
])
def test_current_branch_agrees_with_git(git_repo, checkout):
    if checkout:
        run_git(git_repo, *checkout)
    assert current_branch(git_repo) == git_says_branch(git_repo)


def test_current_branch_asks_git_when_head_is_not_a_plain_branch_file(git_repo, monkeypatch):
    # A worktree of its own (.git is a file there) and a GIT_DIR set by the caller are git's to resolve.
    other = git_repo.parent / "other"
    run_git(git_repo, "worktree", "add", "-q", "-b", "side", str(other))
    assert current_branch(other) == "side" == git_says_branch(other)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    assert current_branch(git_repo) == "side"  # what git says with that GIT_DIR, not the main .git/HEAD
    monkeypatch.delenv("GIT_DIR")
    (git_repo / ".git" / "HEAD").write_text("ref: refs/heads/main")  # no newline: git's to read
    assert current_branch(git_repo) == git_says_branch(git_repo) == "main"


def test_branch_refs_tells_absent_from_not_a_commit(git_repo):
    tree = run_git(git_repo, "rev-parse", "HEAD^{tree}").strip()
    run_git(git_repo, "branch", "main2")
    run_git(git_repo, "pack-refs", "--all")                              # main and main2 packed
    run_git(git_repo, "branch", "loose")
    # A branch naming a tree (git's own commands refuse to make one): it exists, with no tip.
    (git_repo / ".git" / "refs" / "heads" / "tree-branch").write_text(tree + "\n")
    names = ["main", "tree-branch", "loose", "absent", "mai"]
    refs = branch_refs(git_repo, *names)
    for name in names:
        assert (name in refs) == branch_exists(git_repo, name), name
    assert refs["tree-branch"] == ("tree", tree)
    head = run_git(git_repo, "rev-parse", "HEAD").strip()
    assert branch_tips(git_repo, *names) == {"main": head, "loose": head}
