"""The tool-call ledger (ARCHITECTURE §13): patterns, classes, keys, the replay policy, idempotent mail and sling.

Real SQLite files and real `ov` processes; no agent runs here (tests/test_durable.py runs them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from conftest import ov_command, run_git, run_ov
from overstory.agents import ledger
from overstory.guards import classify as cls
from overstory.guards.agent import _Agent
from overstory.guards.patterns import first_match, parse_pattern
from overstory.guards.policy import ALLOW, Decision, check_shell
from overstory.paths import ProjectPaths
from overstory.store import ledger as store
from overstory.store import sessions

SRC_DIR = str(Path(__file__).resolve().parent.parent / "src")

# ---- patterns ---------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, tool, tool_input, expected", [
    ("Bash(git push*)", "Bash", {"command": "git push origin ov/x"}, True),
    ("Bash(git push*)", "Bash", {"command": "cd sub && env -i GIT_DIR=x git -C .. push"}, True),
    ("Bash(git push*)", "Bash", {"command": "timeout 30 /usr/bin/git push"}, True),
    ("Bash(git push*)", "Bash", {"command": "bash -c 'make && git push'"}, True),
    ("Bash(git push*)", "Bash", {"command": "echo $(git push)"}, True),
    ("Bash(git push*)", "Bash", {"command": "git log --grep push"}, False),
    ("Bash(git push*)", "Bash", {"command": "echo git push"}, False),
    ("Bash(git push*)", "Write", {"file_path": "git push"}, False),
    ("Bash", "Bash", {"command": "anything at all"}, True),
    ("mcp__*__deploy*", "mcp__prod__deploy_service", {}, True),
    ("mcp__*__deploy*", "mcp__prod__describe", {}, False),
    ("Write(docs/*)", "Write", {"file_path": "docs/a/b.md"}, True),
    ("Write(docs/*)", "Write", {"file_path": "src/docs.md"}, False),
    ("WebFetch(https://api.example.com/*)", "WebFetch", {"url": "https://api.example.com/v1"}, True),
    ("Bash(curl *-X POST*)", "Bash", {"command": "curl -s -X POST https://x"}, True),
    ("Edit", "Edit", {"file_path": "x"}, True),
    ("Ed?t", "Edit", {}, True),
])
def test_pattern_table(pattern: str, tool: str, tool_input: dict[str, t.Any], expected: bool) -> None:
    assert parse_pattern(pattern).matches(tool, tool_input) is expected


@pytest.mark.parametrize("glob", ["gh search **", "find *-delete*", "a?b*", "[ab]x*", "x[!a]*y", "*deploy", "?"])
@pytest.mark.parametrize("text", ["gh search code x", "gh search ", "gh searc", "find . -delete", "find", "axb",
                                  "abbbb", "bx", "bx2", "xby", "xay", "x\ny", "run deploy", "deploy", "d", ""])
def test_a_glob_matches_as_fnmatch_translates_it(glob: str, text: str) -> None:
    """The regex of a glob with wildcards inside it is made only for a text that starts with the glob's literal
    head (`ov guard` would otherwise compile every default rule's on every call): the answers stay fnmatch's."""
    import fnmatch
    import re

    pattern = parse_pattern(f"Bash({glob})")
    assert pattern.subject_matches(text) is (re.fullmatch(fnmatch.translate(glob), text, re.DOTALL) is not None)


@pytest.mark.parametrize("text", ["", "   ", "(git push)", "Bash(git push", "Bash()", "Bash) x(", "Bash(x)y"])
def test_broken_patterns_say_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        parse_pattern(text)


def test_first_match_works_out_the_subjects_once_and_keeps_order() -> None:
    patterns = [parse_pattern(p) for p in ("Read", "Bash(git status*)", "Bash(git*)", "Bash")]
    assert first_match(patterns, "Bash", {"command": "git status -s"}).text == "Bash(git status*)"
    assert first_match(patterns, "Bash", {"command": "git push"}).text == "Bash(git*)"
    assert first_match(patterns, "Bash", {"command": "ls"}).text == "Bash"
    assert first_match(patterns, "Write", {"file_path": "x"}) is None


# ---- classes, normalized input, keys ------------------------------------------------------------


@pytest.mark.parametrize("tool, tool_input, expected", [
    ("Read", {"file_path": "/x"}, cls.READ),
    ("Grep", {"pattern": "x"}, cls.READ),
    ("Write", {"file_path": "/x", "content": ""}, cls.LOCAL_WRITE),
    ("Edit", {"file_path": "/x"}, cls.LOCAL_WRITE),
    ("TodoWrite", {}, cls.LOCAL_WRITE),
    ("WebFetch", {"url": "https://x"}, cls.READ),
    ("mcp__github__create_issue", {"title": "x"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "git log --oneline -5"}, cls.READ),
    ("Bash", {"command": "ls -la && cat README.md | head"}, cls.READ),
    ("Bash", {"command": "git status && git diff"}, cls.READ),
    ("Bash", {"command": "echo hi > notes.txt"}, cls.LOCAL_WRITE),
    ("Bash", {"command": "echo hi 2>/dev/null"}, cls.READ),
    ("Bash", {"command": "git add -A && git commit -m x"}, cls.LOCAL_WRITE),
    ("Bash", {"command": "python -m pytest -q"}, cls.LOCAL_WRITE),
    ("Bash", {"command": "git commit -am x && git push origin ov/b"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "gh pr create --fill"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "gh pr view 12"}, cls.READ),
    ("Bash", {"command": "gh api repos/o/r/issues"}, cls.READ),
    ("Bash", {"command": "gh api -X POST repos/o/r/issues -f title=x"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "curl -s https://example.com"}, cls.LOCAL_WRITE),
    ("Bash", {"command": "curl -X POST https://example.com/hook"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "curl --request DELETE https://x/1"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "curl -d @body.json https://x"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "curl -X GET https://x"}, cls.LOCAL_WRITE),
    ("Bash", {"command": "npm publish --access public"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "twine upload dist/*"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "ov mail send --to lead --subject s --body b"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "/opt/venv/bin/ov sling builder t2"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "ov merge builder-x"}, cls.SIDE_EFFECT),
    ("Bash", {"command": "ov status --json"}, cls.READ),
    ("Bash", {"command": "find . -name '*.py'"}, cls.READ),
    ("Bash", {"command": "find . -name '*.pyc' -delete"}, cls.LOCAL_WRITE),
    ("Bash", {"command": "unterminated 'quote"}, cls.LOCAL_WRITE),
])
def test_default_classes(tool: str, tool_input: dict[str, t.Any], expected: str) -> None:
    assert cls.classify(tool, tool_input) == expected


def test_configured_patterns_come_before_the_defaults() -> None:
    rules = cls.LedgerRules.from_texts(read_only=["mcp__github__get_*", "Bash(gh pr create --dry-run*)"],
                                       side_effects=["Bash(./deploy.sh*)", "Write(/etc/*)"])
    assert cls.classify("mcp__github__get_issue", {}, rules) == cls.READ
    assert cls.classify("mcp__github__create_issue", {}, rules) == cls.SIDE_EFFECT
    assert cls.classify("Bash", {"command": "make && ./deploy.sh prod"}, rules) == cls.SIDE_EFFECT
    assert cls.classify("Bash", {"command": "gh pr create --dry-run"}, rules) == cls.READ
    assert cls.classify("Write", {"file_path": "/etc/hosts"}, rules) == cls.SIDE_EFFECT
    assert cls.classify("Bash", {"command": "./deploy.sh"}) == cls.LOCAL_WRITE  # not without the config


def test_normalized_input_is_stable_relative_and_drops_cosmetics(tmp_path: Path) -> None:
    wt = str(tmp_path / "wt")
    a = cls.normalize_input("Bash", {"command": f"cat {wt}/src/a.py", "description": "look"}, wt)
    b = cls.normalize_input("Bash", {"description": "read the file", "command": f"cat {wt}/src/a.py"}, wt)
    assert a == b == '{"command":"cat src/a.py"}'
    assert cls.normalize_input("Write", {"file_path": wt, "content": "x"}, wt) == '{"content":"x","file_path":"."}'
    key = {"agent": "a", "task": "t", "klass": "side_effect", "tool": "Bash", "normalized": a, "scope": "mail:3"}
    assert cls.idempotency_key(**key) == cls.idempotency_key(**key)
    for field, other in (("agent", "b"), ("task", "u"), ("klass", "read"), ("tool", "Monitor"), ("scope", "mail:4")):
        assert cls.idempotency_key(**{**key, field: other}) != cls.idempotency_key(**key)


# ---- the replay policy in SQL ---------------------------------------------------------------------


def _ctx(turn: str, attempt: int = 0, *, dispatch: tuple[int, ...] = (7, 9), **extra: t.Any) -> ledger.LedgerContext:
    return ledger.LedgerContext(agent="builder-a", generation=1, task="t", turn_id=turn, attempt=attempt,
                                dispatch=dispatch, worktree="/wt", **extra)


def _hook(command: str, use: str, event: str = "PreToolUse", **extra: t.Any) -> dict[str, t.Any]:
    return {"hook_event_name": event, "tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": use,
            **extra}


def _post(conn: t.Any, ctx: ledger.LedgerContext, command: str, use: str, stdout: str = "ok") -> None:
    ledger.record_post(conn, _hook(command, use, "PostToolUse", tool_response={"stdout": stdout, "stderr": ""}), ctx)


def _rows(conn: t.Any) -> list[tuple[str, str, t.Any]]:
    return [(r["turn_id"], r["status"], r["replay_of"]) for r in store.calls(conn)]


def test_a_retried_turn_is_denied_a_side_effect_that_succeeded_with_its_receipt(state_db: t.Any) -> None:
    first, retry = _ctx("turn-1"), _ctx("turn-2", 1, dispatch=(7, 9, 12))  # more mail arrived meanwhile
    assert ledger.record_pre(state_db, _hook("git push origin ov/a", "u1"), ALLOW, first).allow
    _post(state_db, first, "git push origin ov/a", "u1", "To remote\n * [new branch] ov/a")
    verdict = ledger.record_pre(state_db, _hook("git push origin ov/a", "u2"), ALLOW, retry)
    assert not verdict.allow
    assert "already succeeded" in verdict.reason and "[new branch] ov/a" in verdict.reason
    assert _rows(state_db) == [("turn-1", "succeeded", None), ("turn-2", "skipped_duplicate", 1)]
    # Reads and local writes run again (policy rerun), and other dispatches are not affected.
    assert ledger.record_pre(state_db, _hook("git log", "u3"), ALLOW, first).allow
    assert ledger.record_pre(state_db, _hook("git log", "u4"), ALLOW, retry).allow
    assert ledger.record_pre(state_db, _hook("git push origin ov/a", "u5"), ALLOW, _ctx("turn-9", dispatch=(20,))).allow


def test_identical_calls_in_one_attempt_each_answer_to_one_earlier_effect(state_db: t.Any) -> None:
    one, two = _ctx("turn-1"), _ctx("turn-2", 1)
    for use in ("a", "b"):
        assert ledger.record_pre(state_db, _hook("ov mail send --to x --subject s", use), ALLOW, one).allow
        _post(state_db, one, "ov mail send --to x --subject s", use, "41" if use == "a" else "42")
    denied = [ledger.record_pre(state_db, _hook("ov mail send --to x --subject s", u), ALLOW, two) for u in "cde"]
    assert [d.allow for d in denied] == [False, False, True]
    assert "41" in denied[0].reason and "42" in denied[1].reason
    # A third attempt is held back from both again: the effects happened, whatever attempt 2 did.
    three = [ledger.record_pre(state_db, _hook("ov mail send --to x --subject s", u), ALLOW, _ctx("turn-3", 2))
             for u in "fg"]
    assert [d.allow for d in three] == [False, False]


def test_a_call_started_without_a_receipt_is_held_back_once_and_flagged(project: ProjectPaths, state_db: t.Any,
                                                                         events_db: t.Any) -> None:
    crashed, retry = _ctx("turn-1"), _ctx("turn-2", 1)
    assert ledger.record_pre(state_db, _hook("gh pr create --fill", "u1"), ALLOW, crashed).allow  # no post: killed
    warned = ledger.record_pre(state_db, _hook("gh pr create --fill", "u2"), ALLOW, retry)
    assert not warned.allow and "may already have happened" in warned.reason
    again = ledger.record_pre(state_db, _hook("gh pr create --fill", "u3"), ALLOW, retry)
    assert again.allow, "the model checked and asks again: it runs"
    ledger.record_post(state_db, _hook("gh pr create --fill", "u3", "PostToolUse",
                                       tool_response={"stdout": "https://github.com/o/r/pull/7"}), retry)
    third = _ctx("turn-3", 2)
    replay = ledger.record_pre(state_db, _hook("gh pr create --fill", "u4"), ALLOW, third)
    assert not replay.allow and "pull/7" in replay.reason, "attempt 2's pull request is not opened again"
    assert ledger.record_pre(state_db, _hook("gh pr create --fill", "u5"), ALLOW, third).allow, \
        "attempt 1's uncertain call was warned about once, not once per attempt"
    flagged = store.calls(state_db, flagged=True)
    assert [(r["id"], r["replay_of"], r["status"]) for r in flagged] == [(2, 1, "denied")]
    events = events_db.execute("SELECT kind, agent, summary FROM events WHERE kind = ?", (ledger.FLAG_EVENT,)).fetchall()
    assert [(e["kind"], e["agent"]) for e in events] == [(ledger.FLAG_EVENT, "builder-a")]
    assert "may already have happened" in events[0]["summary"]


def test_replay_policy_rerun_and_ask(state_db: t.Any) -> None:
    rerun = {"read": "rerun", "local_write": "rerun", "side_effect": "rerun"}
    first = _ctx("turn-1", replay=rerun)
    ledger.record_pre(state_db, _hook("git push origin ov/a", "u1"), ALLOW, first)
    _post(state_db, first, "git push origin ov/a", "u1")
    assert ledger.record_pre(state_db, _hook("git push origin ov/a", "u2"), ALLOW, _ctx("turn-2", replay=rerun)).allow
    ask = _ctx("turn-3", replay={**rerun, "side_effect": "ask"})
    verdict = ledger.record_pre(state_db, _hook("git push origin ov/a", "u3"), ALLOW, ask)
    # ask: the replay waits for a person through an approval gate (issue 17), written with its ledger row.
    [gate] = [dict(r) for r in state_db.execute("SELECT * FROM approvals")]
    assert not verdict.allow and f"waiting for approval `{gate['id']}`" in verdict.reason
    assert "config ledger.replay says a person decides" in verdict.reason
    assert gate["status"] == "pending" and gate["decider"] == "operator" and gate["rule"] == "ledger.replay: ask"
    assert [r[0] for r in state_db.execute("SELECT recipient FROM mail WHERE type = 'decision_gate'")] == ["operator"]
    assert [c["status"] for c in store.calls(state_db) if c["tool_use_id"] == "u3"] == ["denied"]
    from overstory.agents.approvals import decide

    decide(state_db, gate["id"], approve=True, by="operator")
    again = _ctx("turn-4", replay={**rerun, "side_effect": "ask"})
    assert ledger.record_pre(state_db, _hook("git push origin ov/a", "u4"), ALLOW, again).allow, "approved: runs once"
    later = _ctx("turn-5", replay={**rerun, "side_effect": "ask"})
    assert not ledger.record_pre(state_db, _hook("git push origin ov/a", "u5"), ALLOW, later).allow


def test_a_guard_denial_is_recorded_and_never_replay_checked(state_db: t.Any) -> None:
    verdict = ledger.record_pre(state_db, _hook("git push -f origin main", "u1"), Decision.deny("no force"), _ctx("t1"))
    assert verdict == Decision.deny("no force")
    row = store.calls(state_db)[0]
    assert (row["status"], row["reason"], row["class"]) == ("denied", "no force", "side_effect")


def test_post_hooks_store_receipts_and_exit_codes(state_db: t.Any) -> None:
    ctx = _ctx("turn-1")
    ledger.record_pre(state_db, _hook("make test", "u1"), ALLOW, ctx)
    ledger.record_post(state_db, {"hook_event_name": "PostToolUseFailure", "tool_name": "Bash",
                                  "tool_input": {"command": "make test"}, "tool_use_id": "u1",
                                  "error": "Exit code 3\npartial\nbad", "is_interrupt": False, "duration_ms": 41}, ctx)
    ledger.record_pre(state_db, {"tool_name": "Write", "tool_input": {"file_path": "/wt/a.txt", "content": "x" * 9000},
                                 "tool_use_id": "u2"}, ALLOW, ctx)
    ledger.record_post(state_db, {"hook_event_name": "PostToolUse", "tool_name": "Write", "tool_use_id": "u2",
                                  "tool_input": {"file_path": "/wt/a.txt"}, "duration_ms": 17,
                                  "tool_response": {"type": "create", "filePath": "/wt/a.txt", "content": "x" * 9000}},
                       ctx)
    # A receipt whose PreToolUse row is missing (its write was lost) still makes a row.
    ledger.record_post(state_db, _hook("ls", "u3", "PostToolUse", tool_response={"stdout": "a\nb"}), ctx)
    rows = store.calls(state_db)
    assert [(r["status"], r["exit_code"], r["duration_ms"]) for r in rows] == [
        ("failed", 3, 41), ("succeeded", None, 17), ("succeeded", 0, None)]
    assert rows[0]["receipt"].startswith("Exit code 3")
    assert json.loads(rows[1]["receipt"]) == {"type": "create", "filePath": "/wt/a.txt"}
    assert rows[1]["input"].endswith(',"file_path":"a.txt"}')
    trimmed = store.trim("y" * 10_000)
    assert trimmed is not None and trimmed.endswith("more characters)") and len(trimmed) <= store.RECEIPT_LIMIT


def test_stream_ledger_fills_rows_for_runtimes_without_hooks(state_db: t.Any) -> None:
    from overstory.runtimes.base import ParsedEvent

    feed = ledger.StreamLedger(state_db, _ctx("turn-1"))
    feed.feed([ParsedEvent("tool_start", tool="Bash", data={"tool_use_id": "s1", "tool_input": {"command": "ls"}}),
               ParsedEvent("tool_start", tool="mcp__x__post", data={"tool_use_id": "s2", "input": "post it"}),
               ParsedEvent("assistant_text", summary="hi")])
    feed.feed([ParsedEvent("tool_end", tool="Bash", data={"tool_use_id": "s1", "is_error": False, "output": "a",
                                                          "duration_ms": 5}),
               ParsedEvent("tool_end", tool="mcp__x__post", data={"tool_use_id": "s2", "is_error": True,
                                                                  "output": "boom"})])
    rows = store.calls(state_db)
    assert [(r["tool"], r["class"], r["status"], r["receipt"], r["source"]) for r in rows] == [
        ("Bash", "read", "succeeded", "a", "stream"), ("mcp__x__post", "side_effect", "failed", "boom", "stream")]


def test_a_headless_turns_receipts_come_from_its_stream(state_db: t.Any) -> None:
    """A runtime whose PreToolUse hook writes the rows gets no PostToolUse hook in a headless turn: the claude
    parser's tool_end events (from the real CLI's captured stream) finish the rows the hook began, and nothing else."""
    from overstory.runtimes.claude.stream import TurnStream

    fixture = Path(__file__).parent / "fixtures" / "stream" / "tool_turn.jsonl"
    stream, parsed = TurnStream(), []
    for index, line in enumerate(fixture.read_text().splitlines()):
        parsed += stream.feed(line, now=float(index))
    starts = [e for e in parsed if e.kind == "tool_start"]
    write, bash = (e.data["tool_use_id"] for e in starts)  # the capture's Write, then its Bash
    ctx = _ctx("turn-1")
    ledger.record_pre(state_db, {"tool_name": "Write", "tool_input": {"file_path": "/wt/hello.txt", "content": "x"},
                                 "tool_use_id": write}, ALLOW, ctx)
    ledger.record_pre(state_db, _hook("git log --oneline", bash), Decision.deny("not now"), ctx)  # refused
    feed = ledger.StreamLedger(state_db, ctx, receipts_only=True)
    feed.feed(parsed)
    rows = store.calls(state_db)
    assert [(r["tool"], r["status"], r["source"]) for r in rows] == [("Write", "succeeded", "hook"),
                                                                      ("Bash", "denied", "hook")]
    assert rows[0]["receipt"].startswith("File created successfully") and rows[0]["ended_at"]
    # Once more with the Bash call allowed: its exit code comes with it; tool_start makes no row of its own.
    state_db.execute("DELETE FROM tool_calls")
    ledger.record_pre(state_db, _hook("git log --oneline", bash), ALLOW, ctx)
    feed.feed(parsed)
    (row,) = store.calls(state_db)
    assert (row["status"], row["exit_code"], row["receipt"]) == ("succeeded", 0, "fb7b9cc agent-commit\n2e873f0 initial")
    # A PostToolUse hook as well (settings an older ov wrote): the call keeps its one row.
    assert ledger.record_post(state_db, _hook("git log --oneline", bash, "PostToolUse",
                                              tool_response={"stdout": "again"}), ctx) == row["id"]
    assert [r["receipt"] for r in store.calls(state_db)] == [row["receipt"]]


def _parsed(runtime_name: str, fixture: str) -> list[t.Any]:
    from overstory.runtimes import get_runtime

    parser, parsed = get_runtime(runtime_name).new_parser(), []
    for index, line in enumerate((Path(__file__).parent / "fixtures" / "stream" / fixture).read_text().splitlines()):
        parsed += parser.feed(line, now=float(index))
    return parsed


@pytest.mark.parametrize("runtime_name", ["codex", "gemini"])
def test_receipts_find_their_rows_by_the_call_where_hook_and_stream_ids_differ(state_db: t.Any,
                                                                               runtime_name: str) -> None:
    """Codex's hook gets the model's call id and its stream item_N; Gemini's hook gets no id. The real CLIs'
    captured streams finish the rows their hooks began, matched by the call itself (idempotency key, in the
    order the calls started), and leave other attempts' rows and denied rows alone."""
    from overstory.guards.runtimes import as_claude_input
    from overstory.runtimes import get_runtime

    runtime = get_runtime(runtime_name)
    assert not runtime.hook_ids_match
    parsed = _parsed(runtime_name, f"{runtime_name}-tool_turn.jsonl")
    starts = [e for e in parsed if e.kind == "tool_start"]
    if runtime_name == "codex":  # as its PreToolUse hook sends them: Claude's shape, the model's call ids
        hooks = [{"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": command},
                  "tool_use_id": f"call_{n}"}
                 for n, command in enumerate(["echo written > out.txt && cat out.txt", "echo failing; exit 3"])]
        expected = [("succeeded", 0, "written\n"), ("failed", 3, "failing\n")]
    else:  # Gemini's BeforeTool: its own tool names, no id
        hooks = [{"hook_event_name": "BeforeTool", "tool_name": "run_shell_command",
                  "tool_input": {"command": "echo made-by-gemini > out.txt && cat out.txt",
                                 "description": "write a file"}}]
        expected = [("succeeded", None, "made-by-gemini")]
    assert len(starts) == len(hooks)
    ctx, older = _ctx("turn-1", attempt=1), _ctx("turn-1", attempt=0)
    ledger.record_pre(state_db, as_claude_input(hooks[0])[1], ALLOW, older)  # the same call, an earlier attempt
    for hook in hooks:
        ledger.record_pre(state_db, as_claude_input(hook)[1], ALLOW, ctx)
    ledger.StreamLedger(state_db, ctx, receipts_only=True, hook_call=runtime.hook_call).feed(parsed)
    rows = store.calls(state_db)
    assert rows[0]["status"] == "started", "another attempt's row is not this stream's"
    assert [(r["status"], r["exit_code"], r["receipt"]) for r in rows[1:]] == expected

    # Two identical calls in one turn: the receipts go in the order the calls started.
    state_db.execute("DELETE FROM tool_calls")
    first = next(e for e in parsed if e.kind == "tool_start")
    ends = [e for e in parsed if e.kind == "tool_end" and e.data["tool_use_id"] == first.data["tool_use_id"]]
    twice = [first, ends[0], _renamed(first, "second"), _renamed(ends[0], "second", output="again")]
    for _ in range(2):
        ledger.record_pre(state_db, as_claude_input(hooks[0])[1], ALLOW, ctx)
    ledger.StreamLedger(state_db, ctx, receipts_only=True, hook_call=runtime.hook_call).feed(twice)
    assert [r["receipt"] for r in store.calls(state_db)] == [expected[0][2], "again"]

    # A denied call keeps its row as it is, and a call no hook saw has nothing to finish.
    state_db.execute("DELETE FROM tool_calls")
    ledger.record_pre(state_db, as_claude_input(hooks[0])[1], Decision.deny("not now"), ctx)
    ledger.StreamLedger(state_db, ctx, receipts_only=True, hook_call=runtime.hook_call).feed(parsed)
    assert [(r["status"], r["receipt"]) for r in store.calls(state_db)] == [("denied", None)]


def test_gemini_shell_receipts_come_from_its_after_tool_hook(state_db: t.Any) -> None:
    """Gemini's stream says "success" for any shell command that ran; its AfterTool hook (`ov guard --post`) is
    given the exit code. The hook's receipt finishes the row its BeforeTool began (neither has a call id), the
    stream's does not overwrite it, and a shell call whose hook never reported stays ``started``: not
    "succeeded" (a retry holds it back once as "may already have happened")."""
    from overstory.guards.runtimes import as_claude_input
    from overstory.runtimes import get_runtime

    runtime = get_runtime("gemini")
    parsed = _parsed("gemini", "gemini-tool_turn.jsonl")  # one shell call; its tool_result says "success"
    call = {"tool_name": "run_shell_command", "tool_input": {"command": "echo made-by-gemini > out.txt && cat out.txt",
                                                            "description": "write a file"}}
    ctx = _ctx("turn-1")
    ledger.record_pre(state_db, as_claude_input({"hook_event_name": "BeforeTool", **call})[1], ALLOW, ctx)
    after = {"hook_event_name": "AfterTool", **call, "tool_response": {
        "llmContent": "<untrusted_context>\nOutput: no space\nExit Code: 3\nProcess Group PGID: 9\n</untrusted_context>",
        "returnDisplay": "no space"}}
    row = ledger.record_post(state_db, after, ctx)
    feed = ledger.StreamLedger(state_db, ctx, receipts_only=True, hook_call=runtime.hook_call,
                               hook_receipts=runtime.hook_receipts)
    feed.feed(parsed)
    (only,) = store.calls(state_db)
    assert (only["id"], only["status"], only["exit_code"], only["receipt"]) == (row, "failed", 3, "Exit code 3\nno space")
    # The hook died: the stream's "success" is not taken for a receipt.
    state_db.execute("DELETE FROM tool_calls")
    ledger.record_pre(state_db, as_claude_input({"hook_event_name": "BeforeTool", **call})[1], ALLOW, ctx)
    feed.feed(parsed)
    assert [r["status"] for r in store.calls(state_db)] == ["started"]


def _renamed(event: t.Any, stream_id: str, **data: t.Any) -> t.Any:
    from dataclasses import replace

    return replace(event, data={**event.data, "tool_use_id": stream_id, **data})


def test_context_round_trips_through_the_turn_environment() -> None:
    policy = ledger.LedgerPolicy(("mcp__x__get*",), ("Bash(./deploy*)",), {**ledger.DEFAULT_REPLAY, "read": "skip"})
    env = {"OVERSTORY_AGENT_NAME": "b", "OVERSTORY_GENERATION": "3", "OVERSTORY_TURN_ID": "t9",
           "OVERSTORY_TASK_ID": "task", "OVERSTORY_WORKTREE": "/wt",
           **ledger.turn_env(attempt=2, dispatch=[12, 5], run_id="run-1", policy=policy)}
    ctx = ledger.LedgerContext.from_env(env)
    assert ctx is not None
    assert (ctx.agent, ctx.generation, ctx.turn_id, ctx.attempt, ctx.dispatch, ctx.scope, ctx.run_id) == (
        "b", 3, "t9", 2, (5, 12), "mail:5", "run-1")
    assert ctx.replay["read"] == "skip" and cls.classify("Bash", {"command": "./deploy.sh"}, ctx.rules) == "side_effect"
    assert ledger.LedgerContext.from_env({}) is None
    assert ledger.LedgerPolicy.from_json("{not json") == ledger.LedgerPolicy()
    assert ledger.ENV_POLICY not in ledger.turn_env(attempt=0, dispatch=[1], run_id=None, policy=ledger.LedgerPolicy())


def test_a_turn_gets_its_own_durable_ids_never_inherited_ones(project: ProjectPaths, state_db: t.Any,
                                                              tmp_path: Path) -> None:
    """A retried (or forked) turn's hooks key its calls by this agent's attempt, dispatch and run; what ov's own
    environment happens to carry (a launch from inside another agent's turn) must not stand in for them, and a
    push permission or replay policy only ever comes from this project's config."""
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.agents.turns import durable_env, turn_environment
    from overstory.config.model import load_config

    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [], "result": "done"}]}))
    config = load_config(project.config_file, project.local_config_file)
    slung = sling(project, config, state_db, SlingRequest(capability="builder", task_id="d", runtime="scripted",
                                                          scenario=scenario), start=False)
    agent = sessions.get(state_db, slung.name)
    assert agent is not None
    stale = {"OVERSTORY_ATTEMPT": "7", "OVERSTORY_DISPATCH": "99", "OVERSTORY_RUN_ID": "run-of-someone-else",
             "OVERSTORY_PUSH_REMOTES": "origin",
             ledger.ENV_POLICY: ledger.LedgerPolicy((), (), {**ledger.DEFAULT_REPLAY, "side_effect": "rerun"}).to_json()}
    env = turn_environment({**os.environ, **stale}, agent, project, "turn-2", durable_env(config, agent, 1, [5, 3]))
    ctx = ledger.LedgerContext.from_env(env)
    assert ctx is not None
    assert (ctx.agent, ctx.turn_id, ctx.attempt, ctx.dispatch, ctx.run_id) == (
        agent.name, "turn-2", 1, (3, 5), agent.run_id)
    assert ctx.replay == ledger.DEFAULT_REPLAY, "the replay policy is this project's, not an inherited one"
    assert "OVERSTORY_PUSH_REMOTES" not in env, "no push permission the config does not give"
    project.local_config_file.write_text("guards:\n  push_remotes: [backup]\n")
    config = load_config(project.config_file, project.local_config_file)
    env = turn_environment({**os.environ, **stale}, agent, project, "turn-3", durable_env(config, agent, 0, [5]))
    assert (env["OVERSTORY_PUSH_REMOTES"], env["OVERSTORY_ATTEMPT"], env["OVERSTORY_DISPATCH"]) == ("backup", "0", "5")


def test_config_rejects_broken_patterns_and_policies(project: ProjectPaths) -> None:
    from overstory.config.model import load_config
    from overstory.errors import ConfigError

    for body, needle in (("ledger:\n  side_effects: ['Bash(git push']\n", "must end with"),
                         ("ledger:\n  replay: {side_effect: maybe}\n", "unknown replay policy"),
                         ("ledger:\n  replay: {deploys: skip}\n", "unknown class")):
        project.local_config_file.write_text(body)
        with pytest.raises(ConfigError, match=needle):
            load_config(project.config_file, project.local_config_file)
    project.local_config_file.write_text("ledger:\n  replay: {local_write: skip}\n")
    config = load_config(project.config_file, project.local_config_file)
    assert config.ledger.replay == {"read": "rerun", "local_write": "skip", "side_effect": "skip"}


# ---- the real `ov guard` and `ov guard --post` ------------------------------------------------------


def _guard(project: ProjectPaths, payload: dict[str, t.Any], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}
    full.update({"OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_CAPABILITY": "builder",
                 "OVERSTORY_PROJECT_ROOT": str(project.root), "OVERSTORY_WORKTREE": str(project.worktree("builder-a")),
                 "OVERSTORY_TASK_ID": "t", "OVERSTORY_GENERATION": "1", **env})
    return subprocess.run([*ov_command(), "guard", *args], input=json.dumps(payload), capture_output=True, text=True,
                          env=full, cwd=project.root, timeout=60, check=False)


def test_ov_guard_and_guard_post_write_the_ledger(project: ProjectPaths, state_db: t.Any) -> None:
    turn = {"OVERSTORY_TURN_ID": "turn-1", "OVERSTORY_DISPATCH": "4"}
    allowed = _guard(project, _hook("git status", "u1"), **turn)
    assert (allowed.returncode, allowed.stdout, allowed.stderr) == (0, "", "")
    posted = _guard(project, _hook("git status", "u1", "PostToolUse", tool_response={"stdout": "clean"}), "--post", **turn)
    assert (posted.returncode, posted.stdout) == (0, "")
    denied = _guard(project, _hook("git push origin ov/builder-a", "u2"), **turn)
    assert json.loads(denied.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
    rows = store.calls(state_db)
    assert [(r["tool_use_id"], r["status"], r["class"], r["turn_id"], r["scope"]) for r in rows] == [
        ("u1", "succeeded", "read", "turn-1", "mail:4"), ("u2", "denied", "side_effect", "turn-1", "mail:4")]
    # No state.db (not an ov project, or outside an agent): the guard still decides, silently.
    elsewhere = _guard(project, _hook("ls", "u3"), OVERSTORY_PROJECT_ROOT=str(project.root / "nowhere"))
    assert (elsewhere.returncode, elsewhere.stdout, elsewhere.stderr) == (0, "", "")


def test_a_ledger_that_cannot_be_written_never_blocks_a_call(project: ProjectPaths) -> None:
    broken = project.root / "broken"
    (broken / ".overstory").mkdir(parents=True)
    (broken / ".overstory" / "state.db").write_text("this is not a database")
    done = _guard(project, _hook("ls", "u1"), OVERSTORY_PROJECT_ROOT=str(broken))
    assert done.returncode == 0 and done.stdout == ""
    assert "ledger was not written" in done.stderr


def test_guard_hot_path_imports_stay_light(project: ProjectPaths) -> None:
    """Running the guard (PreToolUse and --post, with the ledger write) imports nothing heavy."""
    heavy = ["pydantic", "rich", "git", "libtmux", "anthropic", "yaml", "hashlib"]
    code = ("import json, sys, io\n"
            "from overstory.cli.guard import guard\n"
            "for args in ([], ['--post']):\n"
            "    sys.stdin = io.TextIOWrapper(io.BytesIO(sys.argv[1].encode()))\n"
            "    try:\n"
            "        guard.main(args, standalone_mode=False)\n"
            "    except SystemExit:\n"
            "        pass\n"
            f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))")
    env = {**os.environ, "PYTHONPATH": SRC_DIR, "OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_CAPABILITY": "builder",
           "OVERSTORY_PROJECT_ROOT": str(project.root), "OVERSTORY_TURN_ID": "t", "OVERSTORY_DISPATCH": "1"}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(_hook("git push origin x", "u1"))],
                          capture_output=True, text=True, env=env, timeout=60, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        assert conn.execute("SELECT count(*) FROM tool_calls").fetchone()[0] >= 1
    finally:
        conn.close()


# ---- the push rule --------------------------------------------------------------------------------


def _push_agent(capability: str = "builder", remotes: str = "origin") -> _Agent:
    env = {"OVERSTORY_CAPABILITY": capability, "OVERSTORY_WORKTREE": "/p/.overstory/worktrees/b",
           "OVERSTORY_PROJECT_ROOT": "/p", "OVERSTORY_BRANCH": "ov/b", "OVERSTORY_PUSH_REMOTES": remotes}
    return _Agent.from_env("b", env)


@pytest.mark.parametrize("command, allowed", [
    ("git push origin ov/b", True),
    ("git push -u origin ov/b", True),
    ("git push --set-upstream origin ov/b", True),
    ("git push origin HEAD", True),
    ("git push origin HEAD:ov/b", True),
    ("git push origin ov/b:refs/heads/ov/b", True),
    ("git push -q origin refs/heads/ov/b", True),
    ("git push", False),
    ("git push origin", False),
    ("git push origin main", False),
    ("git push origin ov/b:main", False),
    ("git push origin HEAD:main", False),
    ("git push origin ov/other", False),
    ("git push origin +ov/b", False),
    ("git push -f origin ov/b", False),
    ("git push --force origin ov/b", False),
    ("git push --force-with-lease origin ov/b", False),
    ("git push --delete origin ov/b", False),
    ("git push origin :ov/b", False),
    ("git push --all origin", False),
    ("git push --mirror origin", False),
    ("git push --tags origin ov/b", False),
    ("git push origin ov/b v1.0", False),
    ("git push upstream ov/b", False),
    ("git push /tmp/elsewhere.git ov/b", False),
    ("git push --receive-pack=evil origin ov/b", False),
    ("git -c remote.origin.url=/tmp/x push origin ov/b", False),
    ("git config --worktree remote.origin.url /tmp/x", False),
])
def test_push_rule_table(command: str, allowed: bool) -> None:
    agent = _push_agent()
    reason = check_shell(command, agent, agent.worktree)
    assert (reason is None) is allowed, reason


def test_nobody_pushes_without_configured_remotes_and_readers_never_do() -> None:
    for agent in (_push_agent(remotes=""), _push_agent("reviewer"), _push_agent("lead")):
        reason = check_shell("git push origin ov/b", agent, agent.worktree)
        assert reason is not None and ("nobody pushes" in reason or "read-only" in reason)


# ---- idempotent `ov mail send` and `ov sling` ------------------------------------------------------


def _agent_row(conn: t.Any, name: str, parent: str = "operator", **extra: t.Any) -> None:
    sessions.create_session(conn, name=name, capability=extra.pop("capability", "builder"), task_id="t",
                            runtime="scripted", actor="test", parent=parent, **extra)


def test_ov_mail_send_is_idempotent_per_dispatch(project: ProjectPaths, state_db: t.Any, events_db: t.Any) -> None:
    _agent_row(state_db, "lead-1", capability="lead")
    _agent_row(state_db, "builder-a", parent="lead-1")
    agent = {"OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_TASK_ID": "t", "OVERSTORY_BRANCH": "ov/builder-a"}
    send = ("mail", "send", "--type", "merge_ready", "--subject", "ready", "--body", "pushed", "--json")
    first = run_ov(*send, cwd=project.root, env={**agent, "OVERSTORY_DISPATCH": "3", "OVERSTORY_TURN_ID": "t1"})
    again = run_ov(*send, cwd=project.root, env={**agent, "OVERSTORY_DISPATCH": "3,8", "OVERSTORY_TURN_ID": "t2"})
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert json.loads(first.stdout)["ids"] == json.loads(again.stdout)["ids"] == [1]
    other_dispatch = run_ov(*send, cwd=project.root, env={**agent, "OVERSTORY_DISPATCH": "8"})
    operator = run_ov("mail", "send", "--to", "lead-1", "--subject", "ready", "--body", "pushed", cwd=project.root)
    operator_again = run_ov("mail", "send", "--to", "lead-1", "--subject", "ready", "--body", "pushed",
                            cwd=project.root)
    assert json.loads(other_dispatch.stdout)["ids"] == [2]
    assert operator.stdout.strip() == "sent #3 to lead-1" and operator_again.stdout.strip() == "sent #4 to lead-1", \
        "the operator is never deduplicated"
    rows = state_db.execute("SELECT recipient, type FROM mail WHERE type = 'merge_ready'").fetchall()
    assert [tuple(r) for r in rows] == [("lead-1", "merge_ready")] * 2
    sent_events = events_db.execute("SELECT count(*) FROM events WHERE kind = 'mail_sent'").fetchone()[0]
    assert sent_events == 4, "the deduplicated send recorded no second mail_sent event"


def test_a_replayed_send_to_an_agent_that_finished_since_returns_the_first_id(project: ProjectPaths,
                                                                             state_db: t.Any) -> None:
    _agent_row(state_db, "lead-1", capability="lead")
    _agent_row(state_db, "builder-a", parent="lead-1")
    env = {"OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_DISPATCH": "1"}
    args = ("mail", "send", "--to", "lead-1", "--subject", "s", "--body", "b")
    assert run_ov(*args, cwd=project.root, env=env).stdout.strip() == "sent #1 to lead-1"
    lead = sessions.get(state_db, "lead-1")
    sessions.transition(state_db, "lead-1", lead.generation, "completed", actor="test")
    replay = run_ov(*args, cwd=project.root, env=env)
    assert (replay.returncode, replay.stdout.strip()) == (0, "sent #1 to lead-1")
    fresh = run_ov(*args[:-1], "new body", cwd=project.root, env=env)
    assert fresh.returncode == 1 and "completed" in fresh.stderr


def test_ov_sling_from_an_agent_is_idempotent_per_dispatch(project: ProjectPaths, state_db: t.Any) -> None:
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.config.model import load_config

    config = load_config(project.config_file, project.local_config_file)
    _agent_row(state_db, "lead-1", capability="lead", depth=0)
    env = {**os.environ, "OVERSTORY_AGENT_NAME": "lead-1", "OVERSTORY_CAPABILITY": "lead", "OVERSTORY_DISPATCH": "5"}
    request = SlingRequest(capability="builder", task_id="sub", runtime="scripted", prompt="build it")
    first = sling(project, config, state_db, request, env, start=False)
    again = sling(project, config, state_db, request, {**env, "OVERSTORY_DISPATCH": "5,9"}, start=False)
    assert again.as_dict() == first.as_dict()
    assert state_db.execute("SELECT count(*) FROM mail WHERE type = 'dispatch'").fetchone()[0] == 1
    from overstory.errors import AgentExists

    with pytest.raises(AgentExists):  # another dispatch (or other words) is a new request: refused as before
        sling(project, config, state_db, request, {**env, "OVERSTORY_DISPATCH": "11"}, start=False)
    run_git(project.root, "rev-parse", "--verify", "ov/builder-sub")


# ---- checkpoints ----------------------------------------------------------------------------------


def test_worktree_state_and_stale_git_locks(git_repo: Path, tmp_path: Path) -> None:
    from overstory.agents.checkpoint import clear_stale_git_locks, worktree_state

    wt = tmp_path / "wt"
    run_git(git_repo, "worktree", "add", "-q", "-b", "ov/b", str(wt))
    (wt / "new.txt").write_text("x")
    (wt / "README.md").write_text("changed\n")
    head, status = worktree_state(str(wt))
    assert head == run_git(git_repo, "rev-parse", "ov/b").strip()
    assert status is not None and not status["clean"] and status["untracked"] == 1 and status["modified"] == 1
    assert worktree_state(str(tmp_path / "nowhere")) == (None, None)
    gitdir = Path(run_git(wt, "rev-parse", "--absolute-git-dir").strip())
    common = Path(run_git(wt, "rev-parse", "--path-format=absolute", "--git-common-dir").strip())
    locks = [gitdir / "index.lock", gitdir / "HEAD.lock", common / "refs" / "heads" / "ov" / "b.lock"]
    for lock in locks:
        lock.write_text("")
    project_lock = common / "index.lock"
    project_lock.write_text("")
    assert sorted(clear_stale_git_locks(str(wt), "ov/b")) == sorted(str(p) for p in locks)
    assert project_lock.exists(), "the project checkout's own lock is never touched"
    run_git(wt, "add", "new.txt")  # git works again
    assert clear_stale_git_locks(None, "ov/b") == [] and clear_stale_git_locks(str(git_repo), None) == []


def test_a_retried_merger_turn_announces_merged_once(project: ProjectPaths, state_db: t.Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.merge.announce import announce

    _agent_row(state_db, "lead-1", capability="lead")
    _agent_row(state_db, "builder-a", parent="lead-1", branch="ov/builder-a")
    agent = sessions.get(state_db, "builder-a")
    monkeypatch.setenv("OVERSTORY_AGENT_NAME", "merger-1")
    monkeypatch.setenv("OVERSTORY_DISPATCH", "4")
    for reason in ("merged cleanly", "Already up to date."):  # the replay of `ov merge` reports again
        announce(state_db, project.root, agent, merged=True, branch="ov/builder-a", target="main",
                 source_commit="abc123", reason=reason, tier=1, commit="def456")
    merged = state_db.execute("SELECT recipient FROM mail WHERE type = 'merged' ORDER BY id").fetchall()
    assert [r[0] for r in merged] == ["lead-1", "builder-a"], "one announcement per recipient, not two"


def test_the_turn_runner_fills_the_ledger_from_the_stream_when_the_runtime_has_no_hooks(
        project: ProjectPaths, state_db: t.Any, events_db: t.Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime without tool hooks (here the scripted one with its hooks taken away): the rows come from its
    tool_start/tool_end events. Nothing can be held back that way, but everything is recorded."""
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.agents.turns import run_turn
    from overstory.config.model import load_config
    from overstory.runtimes.scripted import ScriptedRuntime
    from overstory.store import mail, mail_text

    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [{"bash": "git status --short"},
                                                           {"bash": "exit 3"}], "result": "done"}]}))
    config = load_config(project.config_file, project.local_config_file)
    result = sling(project, config, state_db, SlingRequest(capability="builder", task_id="s", runtime="scripted",
                                                           scenario=scenario), start=False)
    (project.run_dir / result.name / ScriptedRuntime.run_settings_file).unlink()  # no hooks run (ov keeps them there)
    monkeypatch.setattr(ScriptedRuntime, "tool_hooks", frozenset())
    claimed = mail.claim(state_db, result.name, "turn-s")
    agent = sessions.get(state_db, result.name)
    done = run_turn(project, config, state_db, events_db, agent, mail_text.render_for_prompt(claimed), "turn-s",
                    resume_session_id=None, base_env=dict(os.environ))
    assert done.status == "ok", done.reason
    rows = store.calls(state_db, agent=result.name)
    assert [(r["input"], r["class"], r["status"], r["source"], r["scope"]) for r in rows] == [
        ('{"command":"git status --short"}', "read", "succeeded", "stream", f"mail:{claimed[0].id}"),
        ('{"command":"exit 3"}', "local_write", "failed", "stream", f"mail:{claimed[0].id}")]
    mark = checkpoints_latest(state_db, result.name)
    assert (mark["phase"], mark["turn_status"], mark["mail_ids"]) == ("end", "ok", [claimed[0].id])
    assert mark["session_id"] == done.session_id and mark["head"]


def checkpoints_latest(conn: t.Any, name: str) -> dict[str, t.Any]:
    from overstory.store import checkpoints

    found = checkpoints.latest(conn, name)
    assert found is not None
    return found


def test_resume_all_leaves_recovery_to_a_running_watchdog(project: ProjectPaths) -> None:
    idle = run_ov("resume", "--all", "--json", cwd=project.root)
    assert idle.returncode == 0, idle.stderr
    assert json.loads(idle.stdout)["actions"] == []
    watchdog = subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.5"], cwd=project.root,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert watchdog.stdout is not None and "watchdog running" in watchdog.stdout.readline()
        busy = run_ov("resume", "--all", cwd=project.root)
        assert busy.returncode == 0 and f"pid {watchdog.pid}" in busy.stdout and "re-adopts" in busy.stdout
    finally:
        watchdog.terminate()
        watchdog.wait(timeout=30)
    for args in (("resume",), ("resume", "--all", "x"), ("resume", "--all", "--fork")):
        bad = run_ov(*args, cwd=project.root)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr, args


def test_an_interrupted_ov_mail_send_or_sling_just_runs_again(state_db: t.Any) -> None:
    """They are idempotent per dispatch themselves, so nothing needs checking: no warning, no flag."""
    for command, safe in (("ov mail send --type worker_done --subject done --body ok", True),
                          ("git add -A && /venv/bin/ov sling builder t2 --prompt x", True),
                          ("ov mail send --to x --subject s && git push origin ov/a", False),
                          ("gh pr create --fill", False)):
        assert cls.reruns_safely("Bash", {"command": command}) is safe, command
    crashed, retry = _ctx("turn-1"), _ctx("turn-2", 1)
    send = "ov mail send --type worker_done --subject done --body ok"
    assert ledger.record_pre(state_db, _hook(send, "u1"), ALLOW, crashed).allow  # killed mid-call: no receipt
    assert ledger.record_pre(state_db, _hook(send, "u2"), ALLOW, retry).allow
    rows = store.calls(state_db)
    assert [(r["status"], r["replay_of"], r["flagged"]) for r in rows] == [("started", None, False),
                                                                         ("started", 1, False)]
    _post(state_db, retry, send, "u2", "sent #7 to lead-1")
    assert not ledger.record_pre(state_db, _hook(send, "u3"), ALLOW, _ctx("turn-3", 2)).allow, \
        "once a result is known, a replay is answered with it"


def test_a_codex_apply_patch_gets_its_receipt_from_the_file_change(state_db: t.Any) -> None:
    """Codex's hook sees an apply_patch as a Bash heredoc, its stream as a file_change listing the files:
    the receipt goes to the started row whose patch names the same files, and to no other."""
    from overstory.guards.runtimes import as_claude_input
    from overstory.runtimes import get_runtime

    repo = "/tmp/pytest-of-root/pytest-82/test_apply_patch_through_exec_0/repo"  # where the fixture was captured
    parsed = _parsed("codex", "codex-file_change.jsonl")
    ctx = ledger.LedgerContext(agent="builder-a", generation=1, task="t", turn_id="turn-1", attempt=1,
                               dispatch=(7,), worktree=repo)
    other = "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: elsewhere.txt\n+x\n*** End Patch\nEOF\n"
    patch = ("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: README.md\n@@\n-a\n+b\n"
             "*** Add File: hello.txt\n+hello\n*** End Patch\nEOF\n")
    for command in (other, patch):
        ledger.record_pre(state_db, as_claude_input(_hook(command, "call_x"))[1], ALLOW, ctx)
    runtime = get_runtime("codex")
    ledger.StreamLedger(state_db, ctx, receipts_only=True, hook_call=runtime.hook_call).feed(parsed)
    assert [r["status"] for r in store.calls(state_db)] == ["started", "succeeded"]
