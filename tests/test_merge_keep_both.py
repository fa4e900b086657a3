"""Tier 2 keeps both sides when both only added lines at one place, and the gates prove it.

Real git repositories in tmp_path (the helpers of test_merge.py); the model is a local stub.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from overstory.merge import merge_branch, predict_merge
from overstory.merge.threeway import BOTH_ADDED, duplicated_lines, lost_lines, resolve_mechanically
from test_merge import (
    BASE_PY,
    BOTH_PY,
    OURS_PY,
    THEIRS_PY,
    appended_both,
    git,
    repo,  # noqa: F401  (the fixture)
    repo_state,
    same_line,
)

# A gate that proves nothing but the order: it wants theirs() defined before ours().
THEIRS_FIRST_GATE = "python3 -c \"s = open('mod.py').read(); assert s.index('def theirs') < s.index('def ours')\""
THEIRS_FIRST_PY = BASE_PY + "\n\ndef theirs():\n    return 3\n\n\ndef ours():\n    return 2\n"


class _Resolver:
    def __init__(self, reply: str) -> None:
        self.reply = reply
        self.calls: list[str] = []

    def resolve(self, path: str, base: str, ours: str, theirs: str) -> str:
        self.calls.append(path)
        return self.reply


def test_both_sides_appending_is_merged_by_tier_2_keeping_both_the_targets_first(repo: Path) -> None:
    appended_both(repo)
    state = repo_state(repo)
    refused = merge_branch(repo, "feature", "main", tier_max=1)
    assert not refused.merged and refused.conflicts == ["mod.py"] and repo_state(repo) == state

    prediction = predict_merge(repo, "feature", "main")
    assert prediction.tier == 2 and prediction.resolutions == {"mod.py": f"tier 2: {BOTH_ADDED}"}
    result = merge_branch(repo, "feature", "main", gates=["python3 -c 'import mod; mod.ours(); mod.theirs()'"])
    assert result.merged and result.tier == 2, result.reason
    assert result.resolutions == {"mod.py": BOTH_ADDED}
    assert git(repo, "show", "main:mod.py") == BOTH_PY
    for line in ("def ours():", "return 2", "def theirs():", "return 3", "def a():", "return 1"):
        assert BOTH_PY.count(line) == 1
    assert f"mod.py: {BOTH_ADDED}" in git(repo, "log", "-1", "--format=%B", "main")


def test_a_gate_failing_on_the_combination_commits_nothing_and_names_the_gate(repo: Path) -> None:
    appended_both(repo)
    state = repo_state(repo)
    result = merge_branch(repo, "feature", "main", gates=["true", THEIRS_FIRST_GATE])
    assert not result.merged and result.commit is None and result.tier == 2
    assert result.reason.startswith(f"quality gate {THEIRS_FIRST_GATE!r} exited 1 on the combined result "
                                    "(tier 2 kept both sides' insertions in mod.py); nothing was committed")
    assert "AssertionError" in result.reason  # the gate's own output
    assert repo_state(repo) == state


def test_with_tier_3_a_gate_failing_on_the_combination_hands_the_file_to_the_model(repo: Path) -> None:
    appended_both(repo)
    resolver = _Resolver(THEIRS_FIRST_PY)
    result = merge_branch(repo, "feature", "main", tier_max=3, model_resolver=resolver, gates=[THEIRS_FIRST_GATE])
    assert result.merged and result.tier == 3 and result.resolutions == {"mod.py": "model"}, result.reason
    assert resolver.calls == ["mod.py"]  # asked once, after the gate refused tier 2's combination
    assert git(repo, "show", "main:mod.py") == THEIRS_FIRST_PY

    # Without a gate to refuse it, tier 2's combination stands and the model is never asked.
    git(repo, "reset", "-q", "--hard", "main^1")
    resolver = _Resolver(THEIRS_FIRST_PY)
    result = merge_branch(repo, "feature", "main", tier_max=3, model_resolver=resolver)
    assert result.merged and result.tier == 2 and resolver.calls == []


def test_both_changing_the_same_line_still_refuses_tier_2(repo: Path) -> None:
    same_line(repo)
    state = repo_state(repo)
    result = merge_branch(repo, "feature", "main", tier_max=2)
    assert not result.merged and result.conflicts == ["f.txt"] and "tier 3" in result.reason
    assert repo_state(repo) == state
    assert predict_merge(repo, "feature", "main").tier == 3


def test_keep_both_can_be_turned_off_and_insertions_then_stay_unresolved() -> None:
    base, ours, theirs = BASE_PY.encode(), OURS_PY.encode(), THEIRS_PY.encode()
    assert resolve_mechanically(base, ours, theirs).content == BOTH_PY.encode()
    off = resolve_mechanically(base, ours, theirs, keep_both=False)
    assert off.content is None and off.unresolved_regions == 1


def test_duplicated_lines_catches_a_base_line_copied_twice() -> None:
    base, ours, theirs = b"a\n}\n", b"a\n}\nx {\n}\n", b"a\n}\ny {\n}\n"
    assert duplicated_lines(base, ours, theirs, b"a\n}\nx {\n}\ny {\n}\n") == []  # each side added one "}"
    assert duplicated_lines(base, ours, theirs, b"a\na\n}\nx {\n}\ny {\n}\n") == ["a"]
    assert duplicated_lines(b"a\n", b"a\nb\n", b"a\nb\n", b"a\nb\nb\n") == []  # both added b: two copies at most


_lines = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "  a\n", "d\n", "}\n", "\n"]), max_size=8)


@settings(max_examples=300, deadline=None)
@given(base=_lines, ours=_lines, theirs=_lines)
# found in CI: each side removes one `a` and inserts others elsewhere; the net count of `a` misjudged what they added
@example(base=["a\n", "b\n", "a\n"], ours=["b\n", "a\n", "a\n"], theirs=["b\n", "a\n", "a\n", "a\n"])
def test_mechanical_resolution_neither_loses_nor_repeats(base: list[str], ours: list[str], theirs: list[str]) -> None:
    b, o, t = ("".join(x).encode() for x in (base, ours, theirs))
    for keep_both in (True, False):
        resolution = resolve_mechanically(b, o, t, keep_both=keep_both)
        if resolution.content is not None:
            assert lost_lines(b, o, t, resolution.content) == []
            assert duplicated_lines(b, o, t, resolution.content) == []


@pytest.mark.parametrize("extra", [[], ["x\n"]])
def test_pure_insertions_are_always_resolved_keeping_every_line(extra: list[str]) -> None:
    base = ["a\n", "b\n", *extra]
    ours = ["o1\n", "a\n", "o2\n", "b\n", *extra, "o3\n"]
    theirs = ["t1\n", "a\n", "b\n", *extra, "t3\n"]
    resolution = resolve_mechanically(*("".join(x).encode() for x in (base, ours, theirs)))
    assert resolution.content == "".join(["o1\n", "t1\n", "a\n", "o2\n", "b\n", *extra, "o3\n", "t3\n"]).encode()
