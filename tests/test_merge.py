"""ov merge, the git side: real repositories in tmp_path with crafted histories.

Naming: "ours" is the target branch (main unless said otherwise), "theirs" the source
branch (``feature``) being merged into it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mockapi import MockMessagesAPI, error_reply, text_reply  # tests/ is on sys.path (conftest.py)
from overstory.errors import LockHeld, MergeError
from overstory.merge import (
    AnthropicResolver,
    TargetLock,
    accept_model_reply,
    merge_branch,
    predict_merge,
)
from overstory.merge.threeway import lost_lines, resolve_mechanically

SRC_DIR = Path(__file__).resolve().parent.parent / "src"

# --------------------------------------------------------------------------- helpers


def git(repo: Path, *args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


def write(repo: Path, files: dict[str, str | None]) -> None:
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def commit(repo: Path, files: dict[str, str | None], message: str = "change", branch: str | None = None) -> str:
    """Commit ``files`` (None deletes) on ``branch`` (default: the current one), coming back after."""
    previous = git(repo, "symbolic-ref", "--short", "HEAD").strip()
    if branch and branch != previous:
        git(repo, "checkout", "-q", branch)
    write(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    sha = git(repo, "rev-parse", "HEAD").strip()
    if branch and branch != previous:
        git(repo, "checkout", "-q", previous)
    return sha


def history(repo: Path, base: dict[str, str | None], ours: dict[str, str | None],
            theirs: dict[str, str | None], *, source: str = "feature", target: str = "main") -> None:
    """base on ``target``; ``source`` branches off there and commits ``theirs``; ``target`` commits ``ours``."""
    commit(repo, base, "base", branch=target)
    git(repo, "branch", source, target)
    if theirs:
        commit(repo, theirs, "theirs", branch=source)
    if ours:
        commit(repo, ours, "ours", branch=target)


def worktree_files(repo: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(repo.rglob("*")):
        rel = path.relative_to(repo).as_posix()
        if rel.split("/")[0] in (".git", ".overstory") or not path.is_file():
            continue
        out[rel] = path.read_bytes()
    return out


def repo_state(repo: Path) -> dict[str, object]:
    """Everything a failed merge or a dry run must leave exactly as it was."""
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "symbolic": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "refs": git(repo, "for-each-ref"),
        "index": git(repo, "ls-files", "-s"),
        "status": git(repo, "status", "--porcelain=v1", "--untracked-files=all"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "merge_head": git(repo, "rev-parse", "-q", "--verify", "MERGE_HEAD", check=False),
        "files": worktree_files(repo),
    }


def parents(repo: Path, rev: str) -> list[str]:
    return git(repo, "rev-list", "--parents", "-n", "1", rev).split()[1:]


def no_temp_worktrees(repo: Path) -> bool:
    """Only the root worktree is registered and nothing is left under .overstory/tmp."""
    listed = [ln for ln in git(repo, "worktree", "list", "--porcelain").splitlines() if ln.startswith("worktree ")]
    tmp, meta = repo / ".overstory" / "tmp", repo / ".git" / "worktrees"
    return len(listed) == 1 and not (tmp.exists() and any(tmp.iterdir())) and not (
        meta.exists() and any(meta.iterdir())
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    # What `ov init` arranges: ov's own files never show up as changes.
    (path / ".git" / "info" / "exclude").write_text(".overstory/\n")
    commit(path, {"README.md": "hello\n"}, "initial")
    return path


BASE_PY = "def a():\n    return 1\n"
OURS_PY = BASE_PY + "\n\ndef ours():\n    return 2\n"
THEIRS_PY = BASE_PY + "\n\ndef theirs():\n    return 3\n"
BOTH_PY = BASE_PY + "\n\ndef ours():\n    return 2\n\n\ndef theirs():\n    return 3\n"
TODO_PY = BASE_PY + "\n\n# TODO: more functions\n"


def appended_both(repo: Path) -> None:
    """Both sides append a different function at the end: tier 2 keeps both, the target's first."""
    history(repo, {"mod.py": BASE_PY}, {"mod.py": OURS_PY}, {"mod.py": THEIRS_PY})


def replaced_both(repo: Path) -> None:
    """Both sides replace the same base line with a different function: tier 2 cannot resolve it."""
    history(repo, {"mod.py": TODO_PY}, {"mod.py": OURS_PY}, {"mod.py": THEIRS_PY})


def same_line(repo: Path) -> None:
    history(repo, {"f.txt": "one\ntwo\nthree\n"}, {"f.txt": "one\nTWO (ours)\nthree\n"},
            {"f.txt": "one\nTWO (theirs)\nthree\n"})


# --------------------------------------------------------------------------- tier 1


def test_clean_merge_makes_a_no_ff_merge_commit(repo: Path) -> None:
    history(repo, {"a.txt": "a\n"}, {"a.txt": "a\nours\n"}, {"b.txt": "b\n"})
    main_before = git(repo, "rev-parse", "main").strip()
    feature = git(repo, "rev-parse", "feature").strip()

    result = merge_branch(repo, "feature", "main")

    assert result.merged and result.tier == 1 and result.conflicts == []
    assert result.commit == git(repo, "rev-parse", "main").strip()
    assert parents(repo, "main") == [main_before, feature]
    assert result.files == ["b.txt"]
    assert (repo / "b.txt").read_text() == "b\n" and (repo / "a.txt").read_text() == "a\nours\n"
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "log", "-1", "--format=%s", "main").strip() == "Merge feature into main"


def test_fast_forwardable_source_still_gets_a_merge_commit(repo: Path) -> None:
    history(repo, {"a.txt": "a\n"}, {}, {"b.txt": "b\n"})
    before = git(repo, "rev-parse", "main").strip()
    result = merge_branch(repo, "feature", "main", message="ov: merge builder-1")
    assert result.merged and len(parents(repo, "main")) == 2 and parents(repo, "main")[0] == before
    assert git(repo, "log", "-1", "--format=%B", "main").strip() == "ov: merge builder-1"


def test_already_merged_source_is_a_no_op(repo: Path) -> None:
    history(repo, {"a.txt": "a\n"}, {}, {"b.txt": "b\n"})
    merge_branch(repo, "feature", "main")
    head = git(repo, "rev-parse", "main").strip()
    again = merge_branch(repo, "feature", "main")
    assert again.merged and again.commit == head and "already merged" in again.reason
    assert git(repo, "rev-parse", "main").strip() == head
    prediction = predict_merge(repo, "feature", "main")
    assert prediction.clean and prediction.tier == 1


def test_unknown_branches_are_clear_errors(repo: Path) -> None:
    with pytest.raises(MergeError, match="'nope'"):
        merge_branch(repo, "nope", "main")
    git(repo, "branch", "feature")
    with pytest.raises(MergeError, match="target branch 'gone' does not exist"):
        merge_branch(repo, "feature", "gone")


# --------------------------------------------------------------------------- tier 2


def test_union_file_is_merged_by_git_and_counted_as_tier_2(repo: Path) -> None:
    history(
        repo,
        {"CHANGES.md": "# changes\n- base\n", ".gitattributes": "CHANGES.md merge=union\n"},
        {"CHANGES.md": "# changes\n- base\n- ours\n"},
        {"CHANGES.md": "# changes\n- base\n- theirs\n"},
    )
    state = repo_state(repo)
    refused = merge_branch(repo, "feature", "main", tier_max=1)
    assert not refused.merged and refused.conflicts == ["CHANGES.md"] and "union" in refused.reason
    assert repo_state(repo) == state

    result = merge_branch(repo, "feature", "main", tier_max=2)
    assert result.merged and result.tier == 2
    assert result.resolutions == {"CHANGES.md": "union"}
    text = (repo / "CHANGES.md").read_text()
    assert "- ours\n" in text and "- theirs\n" in text


def test_same_line_conflict_fails_tiers_1_and_2_and_leaves_everything_as_it_was(repo: Path) -> None:
    same_line(repo)
    state = repo_state(repo)
    for tier_max in (1, 2):
        result = merge_branch(repo, "feature", "main", tier_max=tier_max)
        assert not result.merged and result.commit is None and result.tier is None
        assert result.conflicts == ["f.txt"]
        assert "f.txt" in result.reason and "tier 3" in result.reason
        assert repo_state(repo) == state
    # tier 3 allowed but no model configured: still refused, still untouched
    result = merge_branch(repo, "feature", "main", tier_max=3)
    assert not result.merged and "no model resolver" in result.reason
    assert repo_state(repo) == state


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        # ours only re-indents the line, theirs changes what it says: "take ours" would lose theirs' edit
        ("if x:\n        call(1)\nend\n", "if x:\n    call(2)\nend\n"),
        # ours deletes a block in which theirs edited a line
        ("if x:\nend\n", "if x:\n    call(1)\n    call(99)\nend\n"),
    ],
    ids=["reindent-vs-edit", "delete-vs-edit"],
)
def test_tier_2_refuses_a_resolution_that_would_drop_content(repo: Path, ours: str, theirs: str) -> None:
    base = "if x:\n    call(1)\n    call(2)\nend\n" if "99" in theirs else "if x:\n    call(1)\nend\n"
    history(repo, {"f.py": base}, {"f.py": ours}, {"f.py": theirs})
    state = repo_state(repo)
    result = merge_branch(repo, "feature", "main", tier_max=2)
    assert not result.merged and result.conflicts == ["f.py"]
    assert repo_state(repo) == state
    assert predict_merge(repo, "feature", "main").tier == 3


def test_verification_catches_a_resolution_that_drops_an_added_line() -> None:
    base, ours, theirs = b"a\nb\n", b"a\nb\nours\n", b"a\nb\ntheirs\n"
    assert lost_lines(base, ours, theirs, b"a\nb\nours\ntheirs\n") == []
    assert lost_lines(base, ours, theirs, ours) == ["theirs"]
    assert lost_lines(base, ours, theirs, b"a\nb\n  theirs\nours\n") == []  # whitespace-insensitive
    # a line both sides added is needed once; two copies added by one side are needed twice
    assert lost_lines(b"", b"x\n", b"x\n", b"x\n") == []
    assert lost_lines(b"", b"x\nx\n", b"", b"x\n") == ["x"]


def test_whitespace_only_conflict_is_resolved_by_tier_2_keeping_ours(repo: Path) -> None:
    base = "start\nif ready:\n  go()\nend\n"
    history(
        repo,
        {"w.py": base, "other.txt": "1\n"},
        {"w.py": "start\nif ready:\n    go()\nend\n"},
        {"w.py": "start\nif ready:\n\tgo()   \nend\n", "other.txt": "1\n2\n"},
    )
    assert not merge_branch(repo, "feature", "main", tier_max=1).merged  # git itself conflicts
    result = merge_branch(repo, "feature", "main", tier_max=2)
    assert result.merged and result.tier == 2
    assert result.resolutions == {"w.py": "whitespace only"}
    assert (repo / "w.py").read_text() == "start\nif ready:\n    go()\nend\n"
    assert (repo / "other.txt").read_text() == "1\n2\n"
    assert "tier 2" in git(repo, "log", "-1", "--format=%B", "main")


def test_edits_on_adjacent_lines_are_resolved_as_one_side_unchanged(repo: Path) -> None:
    history(repo, {"f.txt": "a\nb\nc\nd\n"}, {"f.txt": "a\nB-ours\nc\nd\n"}, {"f.txt": "a\nb\nC-theirs\nd\n"})
    assert not merge_branch(repo, "feature", "main", tier_max=1).merged
    result = merge_branch(repo, "feature", "main")
    assert result.merged and result.tier == 2 and result.resolutions == {"f.txt": "one side unchanged"}
    assert (repo / "f.txt").read_text() == "a\nB-ours\nC-theirs\nd\n"
    assert git(repo, "show", "main:f.txt") == "a\nB-ours\nC-theirs\nd\n"


def test_modify_delete_conflict_is_unresolvable_and_the_model_is_not_asked(repo: Path) -> None:
    history(repo, {"f.txt": "a\n", "mod.py": TODO_PY}, {"f.txt": None, "mod.py": OURS_PY},
            {"f.txt": "a\nmore\n", "mod.py": THEIRS_PY})
    state = repo_state(repo)
    prediction = predict_merge(repo, "feature", "main")
    assert prediction.tier is None and prediction.conflicts == ["f.txt", "mod.py"]
    resolver = _CountingResolver()
    result = merge_branch(repo, "feature", "main", tier_max=3, model_resolver=resolver)
    assert not result.merged and "f.txt (deleted" in result.reason
    assert resolver.calls == []  # mod.py alone could go to the model, but the merge would fail anyway
    assert repo_state(repo) == state


class _CountingResolver:
    def __init__(self, reply: str = "") -> None:
        self.reply = reply
        self.calls: list[str] = []

    def resolve(self, path: str, base: str, ours: str, theirs: str) -> str:
        self.calls.append(path)
        return self.reply


# --------------------------------------------------------------------------- tier 3


def test_tier_3_resolves_through_the_messages_api(repo: Path) -> None:
    # mod.py needs the model; f.txt is mechanical and must not be sent
    history(repo, {"mod.py": TODO_PY, "f.txt": "a\nb\nc\n"}, {"mod.py": OURS_PY, "f.txt": "a\nB\nc\n"},
            {"mod.py": THEIRS_PY, "f.txt": "a\nb\nC\n"})
    assert not merge_branch(repo, "feature", "main", tier_max=2).merged
    with MockMessagesAPI(lambda body: text_reply(BOTH_PY)) as api:
        resolver = AnthropicResolver("claude-test-model", base_url=api.base_url, api_key="test-key", max_retries=0)
        result = merge_branch(repo, "feature", "main", tier_max=3, model_resolver=resolver)
        requests = api.main_requests
    assert result.merged and result.tier == 3
    assert result.resolutions == {"mod.py": "model", "f.txt": "one side unchanged"}
    assert (repo / "mod.py").read_text() == BOTH_PY and (repo / "f.txt").read_text() == "a\nB\nC\n"
    assert git(repo, "status", "--porcelain") == ""
    assert len(requests) == 1
    body = requests[0]
    assert body["model"] == "claude-test-model"
    prompt = body["messages"][0]["content"]
    assert "mod.py" in prompt and "def ours()" in prompt and "def theirs()" in prompt
    assert f"<base>\n{TODO_PY}</base>" in prompt


def test_tier_3_honours_anthropic_base_url(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    replaced_both(repo)
    with MockMessagesAPI(lambda body: text_reply("```python\n" + BOTH_PY + "```")) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.base_url)
        result = merge_branch(repo, "feature", "main", tier_max=3,
                              model_resolver=AnthropicResolver("m", api_key="k", max_retries=0))
        assert len(api.main_requests) == 1
    assert result.merged and (repo / "mod.py").read_text() == BOTH_PY  # the single fence was stripped


BAD_REPLIES = {
    "conflict-markers": text_reply(
        BASE_PY + "<<<<<<< HEAD\ndef ours():\n    return 2\n=======\ndef theirs():\n    return 3\n>>>>>>> feature\n"
    ),
    "prose-before": text_reply("Here is the merged file:\n\n" + BOTH_PY),
    "prose-around-fence": text_reply("Sure! Here it is:\n```python\n" + BOTH_PY + "```\nLet me know."),
    "drops-a-side": text_reply(OURS_PY),
    "http-error": error_reply(500, "api_error", "upstream exploded"),
}
BAD_REASONS = {
    "conflict-markers": "conflict markers",
    "prose-before": "does not look like the file",
    "prose-around-fence": "markdown fences",
    "drops-a-side": "drops the line",
    "http-error": "model resolution failed",
}


@pytest.mark.parametrize("kind", sorted(BAD_REPLIES))
def test_tier_3_bad_reply_is_refused_and_target_unchanged(repo: Path, kind: str) -> None:
    replaced_both(repo)
    state = repo_state(repo)
    with MockMessagesAPI(lambda body: BAD_REPLIES[kind]) as api:
        resolver = AnthropicResolver("claude-test-model", base_url=api.base_url, api_key="k", max_retries=0)
        result = merge_branch(repo, "feature", "main", tier_max=3, model_resolver=resolver)
        assert len(api.main_requests) == 1
    assert not result.merged and result.conflicts == ["mod.py"]
    assert BAD_REASONS[kind] in result.reason
    assert repo_state(repo) == state


def test_accept_model_reply_rules() -> None:
    base, ours, theirs = "a\n", "a\nb\n", "a\nc\n"
    assert accept_model_reply("a\nb\nc", base, ours, theirs) == "a\nb\nc\n"  # final newline restored
    assert accept_model_reply("```\na\nb\nc\n```\n", base, ours, theirs) == "a\nb\nc\n"
    with pytest.raises(MergeError, match="markdown"):
        accept_model_reply("```\na\n```\nb\n```\nc\n```", base, ours, theirs)
    with pytest.raises(MergeError, match="last line"):
        accept_model_reply("a\nb\nc\nHope this helps!", base, ours, theirs)
    with pytest.raises(MergeError, match="empty"):
        accept_model_reply("  \n", base, ours, theirs)
    # a markdown file that itself starts with a fence keeps it; an RST underline is not a marker
    md = "```sh\nmake\n```\n"
    assert accept_model_reply(md + "x\n", md, md + "x\n", md) == md + "x\n"
    rst = "Title\n=======\n"
    assert accept_model_reply(rst + "b\nc\n", rst, rst + "b\n", rst + "c\n") == rst + "b\nc\n"


# --------------------------------------------------------------------------- dirty targets


def test_dirty_file_the_merge_touches_is_refused_and_kept(repo: Path) -> None:
    history(repo, {"f.txt": "a\n", "g.txt": "g\n"}, {"g.txt": "g2\n"}, {"f.txt": "a\ntheirs\n"})
    (repo / "f.txt").write_text("a\nmy unsaved work\n")
    state = repo_state(repo)
    with pytest.raises(MergeError, match=r"f\.txt") as caught:
        merge_branch(repo, "feature", "main")
    assert "uncommitted" in str(caught.value)
    assert repo_state(repo) == state
    assert (repo / "f.txt").read_text() == "a\nmy unsaved work\n"
    assert predict_merge(repo, "feature", "main").blocked_by == ["f.txt"]


@pytest.mark.parametrize("ignored", [False, True], ids=["untracked", "ignored"])
def test_untracked_or_ignored_file_where_the_merge_adds_one_is_refused(repo: Path, ignored: bool) -> None:
    name = "build.log" if ignored else "new.txt"
    commit(repo, {".gitignore": "*.log\n"})
    git(repo, "branch", "feature")
    git(repo, "checkout", "-q", "feature")
    write(repo, {name: "from the branch\n"})
    git(repo, "add", "-f", name)
    git(repo, "commit", "-q", "-m", "add")
    git(repo, "checkout", "-q", "main")
    commit(repo, {"other.txt": "x\n"})
    (repo / name).write_text("mine, not committed\n")
    state = repo_state(repo)
    with pytest.raises(MergeError, match=name.replace(".", r"\.")):
        merge_branch(repo, "feature", "main")
    assert repo_state(repo) == state and (repo / name).read_text() == "mine, not committed\n"


def test_dirty_but_unrelated_files_are_allowed_and_preserved(repo: Path) -> None:
    history(repo, {"f.txt": "a\n", "mine.txt": "m\n"}, {"mine.txt": "m\nm2\n"}, {"f.txt": "a\ntheirs\n"})
    (repo / "mine.txt").write_text("m\nm2\nunsaved\n")
    (repo / "notes.txt").write_text("scratch\n")
    result = merge_branch(repo, "feature", "main")
    assert result.merged and result.files == ["f.txt"]
    assert (repo / "f.txt").read_text() == "a\ntheirs\n"
    assert (repo / "mine.txt").read_text() == "m\nm2\nunsaved\n"
    assert (repo / "notes.txt").read_text() == "scratch\n"
    assert git(repo, "status", "--porcelain") == " M mine.txt\n?? notes.txt\n"
    assert git(repo, "show", "main:mine.txt") == "m\nm2\n"  # the unsaved edit was not committed


def test_failed_merge_keeps_unrelated_dirty_files(repo: Path) -> None:
    same_line(repo)
    commit(repo, {"mine.txt": "m\n"})
    (repo / "mine.txt").write_text("unsaved\n")
    state = repo_state(repo)
    assert not merge_branch(repo, "feature", "main").merged
    assert repo_state(repo) == state


def test_dirty_overstory_files_do_not_block(repo: Path) -> None:
    # .overstory/ not excluded here: it shows up in `git status`, tracked and untracked
    (repo / ".git" / "info" / "exclude").write_text("")
    history(repo, {".overstory/config.yaml": "a: 1\n", "f.txt": "a\n"}, {"g.txt": "g\n"},
            {"f.txt": "a\ntheirs\n", ".overstory/agents.md": "builder\n"})
    (repo / ".overstory" / "config.yaml").write_text("a: 2\n")
    (repo / ".overstory" / "state.db").write_bytes(b"sqlite")
    result = merge_branch(repo, "feature", "main")
    assert result.merged and (repo / "f.txt").read_text() == "a\ntheirs\n"
    assert (repo / ".overstory" / "config.yaml").read_text() == "a: 2\n"
    assert (repo / ".overstory" / "state.db").read_bytes() == b"sqlite"


def test_staged_changes_are_refused(repo: Path) -> None:
    history(repo, {"f.txt": "a\n", "s.txt": "s\n"}, {}, {"f.txt": "a\nb\n"})
    (repo / "s.txt").write_text("staged\n")
    git(repo, "add", "s.txt")
    state = repo_state(repo)
    with pytest.raises(MergeError, match=r"staged.*s\.txt"):
        merge_branch(repo, "feature", "main")
    assert repo_state(repo) == state


def test_unfinished_merge_at_the_root_is_refused(repo: Path) -> None:
    same_line(repo)
    git(repo, "branch", "other", "main~1")
    commit(repo, {"other.txt": "o\n"}, branch="other")
    git(repo, "merge", "feature", check=False)  # the user's own conflicted merge
    assert git(repo, "rev-parse", "-q", "--verify", "MERGE_HEAD")
    state = repo_state(repo)
    with pytest.raises(MergeError, match="a merge is in progress"):
        merge_branch(repo, "other", "main")
    assert repo_state(repo) == state


# --------------------------------------------------------------------------- temporary worktree


def test_merge_into_a_branch_that_is_not_checked_out(repo: Path) -> None:
    commit(repo, {"f.txt": "a\n"})
    git(repo, "branch", "release")
    history(repo, {"r.txt": "r\n"}, {"r.txt": "r\nrelease\n"}, {"n.txt": "n\n"}, target="release")
    (repo / "README.md").write_text("dirty at the root, irrelevant to release\n")
    root_state = repo_state(repo)
    release_before = git(repo, "rev-parse", "release").strip()

    result = merge_branch(repo, "feature", "release", gates=["test -f n.txt && test -f r.txt"])

    assert result.merged and result.tier == 1
    assert git(repo, "rev-parse", "release").strip() == result.commit
    assert parents(repo, "release") == [release_before, git(repo, "rev-parse", "feature").strip()]
    assert git(repo, "show", "release:n.txt") == "n\n"
    after = repo_state(repo)
    assert {k: v for k, v in after.items() if k != "refs"} == {k: v for k, v in root_state.items() if k != "refs"}
    assert not (repo / "n.txt").exists()
    assert no_temp_worktrees(repo)


def test_failed_merge_in_a_temporary_worktree_is_cleaned_up(repo: Path) -> None:
    git(repo, "branch", "release")
    same_line_files = ({"f.txt": "1\n2\n3\n"}, {"f.txt": "1\nours\n3\n"}, {"f.txt": "1\ntheirs\n3\n"})
    history(repo, *same_line_files, target="release")
    state = repo_state(repo)
    result = merge_branch(repo, "feature", "release")
    assert not result.merged and result.conflicts == ["f.txt"]
    assert repo_state(repo) == state
    assert no_temp_worktrees(repo)


def test_a_dead_merges_temporary_worktree_is_reaped(repo: Path) -> None:
    history(repo, {"f.txt": "a\n"}, {}, {"g.txt": "g\n"})
    git(repo, "branch", "release", "main")
    stale = repo / ".overstory" / "tmp" / "merge-deadbeef"
    git(repo, "worktree", "add", "-q", str(stale), "release")  # what a SIGKILLed merge leaves behind
    (stale / "half-done.txt").write_text("x\n")
    result = merge_branch(repo, "feature", "release")
    assert result.merged and git(repo, "show", "release:g.txt") == "g\n"
    assert no_temp_worktrees(repo)


def test_target_checked_out_in_another_worktree_is_refused(repo: Path, tmp_path: Path) -> None:
    history(repo, {"f.txt": "a\n"}, {}, {"g.txt": "g\n"})
    git(repo, "branch", "release", "main")
    git(repo, "worktree", "add", "-q", str(tmp_path / "elsewhere"), "release")
    with pytest.raises(MergeError, match="checked out in another worktree"):
        merge_branch(repo, "feature", "release")


# --------------------------------------------------------------------------- quality gates


def test_quality_gate_failure_aborts_and_reports_the_output_tail(repo: Path) -> None:
    history(repo, {"f.txt": "a\n"}, {"g.txt": "g\n"}, {"f.txt": "a\nb\n"})
    state = repo_state(repo)
    gate = "for i in $(seq 1 100); do echo line-$i; done; echo 'FAILED: 1 test' >&2; exit 3"
    result = merge_branch(repo, "feature", "main", gates=["true", gate])
    assert not result.merged and result.commit is None
    assert "exited 3" in result.reason and "FAILED: 1 test" in result.reason and "line-100" in result.reason
    assert "line-1\n" not in result.reason  # only the tail
    assert repo_state(repo) == state


def test_quality_gate_runs_on_the_merged_tree_before_the_commit(repo: Path) -> None:
    history(repo, {"f.txt": "a\n"}, {"g.txt": "g\n"}, {"f.txt": "a\nb\n"})
    head = git(repo, "rev-parse", "main").strip()
    # the merged content is there, the branch has not moved yet, and the gate sees a merge in progress
    gate = f"grep -q b f.txt && test \"$(git rev-parse main)\" = {head} && git rev-parse -q --verify MERGE_HEAD"
    result = merge_branch(repo, "feature", "main", gates=[gate])
    assert result.merged, result.reason


def test_quality_gate_timeout_kills_the_gate(repo: Path) -> None:
    history(repo, {"f.txt": "a\n"}, {}, {"f.txt": "a\nb\n"})
    state = repo_state(repo)
    result = merge_branch(repo, "feature", "main", gates=["echo started; sleep 30"], gate_timeout=0.5)
    assert not result.merged and "timed out" in result.reason and "started" in result.reason
    assert repo_state(repo) == state


def test_quality_gate_that_modifies_tracked_files_fails_the_merge(repo: Path) -> None:
    git(repo, "branch", "release")
    history(repo, {"f.txt": "a\n"}, {"g.txt": "g\n"}, {"f.txt": "a\nb\n"}, target="release")
    state = repo_state(repo)
    result = merge_branch(repo, "feature", "release", gates=["echo reformatted > f.txt"])
    assert not result.merged and "modified tracked files (f.txt)" in result.reason
    assert repo_state(repo) == state and no_temp_worktrees(repo)
    # into the branch checked out at the root too: the gate ran in the scratch worktree, the user's files are untouched
    history(repo, {"h.txt": "a\n"}, {}, {"h.txt": "a\nb\n"}, source="feature2")
    state = repo_state(repo)
    result = merge_branch(repo, "feature2", "main", gates=["echo reformatted > h.txt"])
    assert not result.merged and "modified tracked files (h.txt)" in result.reason
    assert repo_state(repo) == state and no_temp_worktrees(repo)
    assert (repo / "h.txt").read_text() == "a\n"


# --------------------------------------------------------------------------- locking


def test_lock_held_by_a_live_process_names_it_and_a_dead_holders_lock_is_taken_over(tmp_path: Path) -> None:
    lock_dir = tmp_path / "locks"
    holder_code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from pathlib import Path; from overstory.merge import TargetLock;"
        "lock = TargetLock(Path(sys.argv[2]), 'ov/feature', 0); lock.acquire();"
        "print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen([sys.executable, "-c", holder_code, str(SRC_DIR), str(lock_dir)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waited_for: list[int | None] = []
        with pytest.raises(LockHeld, match=f"pid {holder.pid}"), TargetLock(
            lock_dir, "ov/feature", 0.2, on_wait=waited_for.append
        ):
            pass
        assert waited_for == [holder.pid]
        with TargetLock(lock_dir, "other", 0):  # another target is not blocked
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with TargetLock(lock_dir, "ov/feature", 0) as lock:  # the OS released the dead holder's lock
        assert lock.holder_pid() == os.getpid()


_RACER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from overstory.errors import LockHeld
from overstory.merge import merge_branch
args = json.loads(sys.argv[2])
def waiting(pid):
    if args.get("marker"):
        Path(args["marker"]).write_text(str(pid))
try:
    r = merge_branch(Path(args["repo"]), args["source"], "main", gates=args["gates"],
                     lock_wait=args["wait"], on_lock_wait=waiting)
    print(json.dumps({"merged": r.merged, "commit": r.commit, "reason": r.reason}))
except LockHeld as exc:
    print(json.dumps({"lock_held": str(exc)}))
"""


def _racer(repo: Path, source: str, *, wait: float, gates: list[str] | None = None,
           marker: Path | None = None) -> subprocess.Popen[str]:
    args = {"repo": str(repo), "source": source, "wait": wait, "gates": gates or [],
            "marker": str(marker) if marker else None}
    return subprocess.Popen([sys.executable, "-c", _RACER, str(SRC_DIR), json.dumps(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)


def _wait_for_file(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"process ended before {path.name} appeared: {proc.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} never appeared")
        time.sleep(0.02)


def test_two_merges_racing_on_one_target(repo: Path, tmp_path: Path) -> None:
    commit(repo, {"f.txt": "a\n"})
    git(repo, "branch", "feature-a")
    git(repo, "branch", "feature-c")
    commit(repo, {"a.txt": "a\n"}, branch="feature-a")
    commit(repo, {"c.txt": "c\n"}, branch="feature-c")
    in_gate, release, waiting = tmp_path / "in-gate", tmp_path / "release", tmp_path / "waiting"
    hold = f"touch {in_gate}; while [ ! -f {release} ]; do sleep 0.02; done"

    first = _racer(repo, "feature-a", wait=30, gates=[hold])
    try:
        _wait_for_file(in_gate, first)  # first holds the lock, its merge is in progress at the root
        impatient = _finish(_racer(repo, "feature-c", wait=0))
        assert f"pid {first.pid}" in str(impatient.get("lock_held")), impatient
        patient = _racer(repo, "feature-c", wait=120, marker=waiting)
        _wait_for_file(waiting, patient)
        assert waiting.read_text() == str(first.pid)
    finally:
        release.touch()
    first_result, patient_result = _finish(first), _finish(patient)

    assert first_result["merged"] and patient_result["merged"], (first_result, patient_result)
    assert parents(repo, "main")[0] == first_result["commit"]  # the second merged on top of the first
    assert git(repo, "rev-parse", "main").strip() == patient_result["commit"]
    assert (repo / "a.txt").exists() and (repo / "c.txt").exists()
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "rev-parse", "-q", "--verify", "MERGE_HEAD", check=False) == ""


# --------------------------------------------------------------------------- dry run


def _predict_untouched(repo: Path, source: str, target: str):
    state = repo_state(repo)
    index_before = (repo / ".git" / "index").read_bytes()
    prediction = predict_merge(repo, source, target)
    assert (repo / ".git" / "index").read_bytes() == index_before
    assert repo_state(repo) == state
    return prediction


SCENARIOS = {
    "clean": (lambda r: history(r, {"a.txt": "a\n"}, {"a.txt": "a\nb\n"}, {"c.txt": "c\n"}), 1),
    "union": (
        lambda r: history(r, {"L": "x\n", ".gitattributes": "L merge=union\n"}, {"L": "x\no\n"}, {"L": "x\nt\n"}),
        2,
    ),
    "adjacent": (lambda r: history(r, {"f": "a\nb\nc\n"}, {"f": "a\nB\nc\n"}, {"f": "a\nb\nC\n"}), 2),
    "whitespace": (lambda r: history(r, {"f": "a\n  b\n"}, {"f": "a\n    b\n"}, {"f": "a\n\tb\n"}), 2),
    "same-line": (same_line, 3),
    "appended": (appended_both, 2),
    "replaced": (replaced_both, 3),
    "modify-delete": (lambda r: history(r, {"f": "a\n", "g": "g\n"}, {"f": None}, {"f": "a\nb\n"}), None),
    "binary": (lambda r: history(r, {"b.bin": "\0a\n"}, {"b.bin": "\0b\n"}, {"b.bin": "\0c\n"}), None),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_dry_run_predicts_the_tier_and_touches_nothing(repo: Path, name: str) -> None:
    build, expected = SCENARIOS[name]
    build(repo)
    (repo / "README.md").write_text("a dirty file the dry run must not touch\n")
    (repo / "scratch.txt").write_text("untracked\n")
    prediction = _predict_untouched(repo, "feature", "main")
    assert prediction.tier == expected, prediction
    assert prediction.clean == (expected == 1)
    assert (prediction.conflicts == []) == (expected == 1)
    assert prediction.blocked_by == []


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_merge_needs_the_tier_the_dry_run_predicted(repo: Path, name: str) -> None:
    build, expected = SCENARIOS[name]
    build(repo)
    predicted = predict_merge(repo, "feature", "main")
    result = merge_branch(repo, "feature", "main", tier_max=2)
    if expected in (1, 2):
        assert result.merged and result.tier == predicted.tier == expected
        assert result.conflicts == predicted.conflicts
    else:
        assert not result.merged and result.conflicts == predicted.conflicts


def test_dry_run_for_a_branch_not_checked_out_reads_that_branchs_attributes(repo: Path) -> None:
    # main has no union attribute at all; release does. The prediction must follow release.
    git(repo, "branch", "release")
    history(repo, {"L": "x\n", ".gitattributes": "L merge=union\n"}, {"L": "x\no\n"}, {"L": "x\nt\n"},
            target="release")
    prediction = _predict_untouched(repo, "feature", "release")
    assert prediction.tier == 2 and prediction.resolutions == {"L": "union"}
    assert merge_branch(repo, "feature", "release").tier == 2


def test_dry_run_reports_what_would_block(repo: Path) -> None:
    history(repo, {"f.txt": "a\n"}, {}, {"f.txt": "a\nb\n"})
    (repo / "f.txt").write_text("edited\n")
    prediction = _predict_untouched(repo, "feature", "main")
    assert prediction.tier == 1 and prediction.blocked_by == ["f.txt"] and "refusing" in prediction.reason


# --------------------------------------------------------------------------- three-way properties

_lines = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "  a\n", "d\n", "}\n", "\n"]), max_size=8)


@settings(max_examples=300, deadline=None)
@given(base=_lines, ours=_lines, theirs=_lines)
def test_mechanical_resolution_never_loses_an_added_line(base: list[str], ours: list[str], theirs: list[str]) -> None:
    b, o, t = ("".join(x).encode() for x in (base, ours, theirs))
    resolution = resolve_mechanically(b, o, t)
    if resolution.content is not None:
        assert lost_lines(b, o, t, resolution.content) == []
    if o == b:
        assert resolution.content == t
    if t == b or o == t:
        assert resolution.content == o
