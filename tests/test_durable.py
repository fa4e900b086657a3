"""Durable runs with real agent loops on the scripted runtime: replays, mid-call crashes, resume, recovery, forks.

The scripted runtime plays the same calls again when a turn is retried (like a model
answering the same mail again) and runs the agent's real PreToolUse hooks, so every tool
call goes through the real guard and the real ledger; the receipts come from the turn's
stream, which the real agent loop reads (a headless turn has no PostToolUse hook).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
import typing as t
from pathlib import Path

import pytest
import yaml

from conftest import ov_command, run_ov
from durable_helpers import (
    assert_invariants,
    kill_everything,
    make_remote,
    project_processes,
    pushes,
    remote_refs,
    row,
    shared,
    wait_for,
)
from overstory.paths import ProjectPaths
from overstory.store import checkpoints, ledger, sessions
from test_watchdog import start_agent, write_local_config

pytestmark = pytest.mark.slow


@pytest.fixture
def durable(project: ProjectPaths, tmp_path: Path) -> t.Iterator[tuple[ProjectPaths, Path]]:
    write_local_config(project, guards={"push_remotes": ["origin"]},
                       turns={"retry_backoff": 0.1, "kill_grace": 1, "stall_timeout": 120, "max_retries": 3,
                              "max_concurrent": 8},
                       watchdog={"interval": 0.3, "stale_after": 300, "zombie_after": 900})
    # The remote, its push log and the tests' markers live in one directory bound writable into every
    # agent's sandbox (a sandboxed turn's /tmp is its own, and the rest outside its worktree read-only).
    log = make_remote(project, shared(tmp_path))
    config = yaml.safe_load(project.local_config_file.read_text())
    write_local_config(project, **config, sandbox={"writable": [str(shared(tmp_path))]})
    yield project, log
    kill_everything(project)


def once(marker: Path, then: str) -> str:
    """A shell step that does ``then`` only the first time it runs (the marker remembers)."""
    return f"test -e {marker} || {{ touch {marker}; {then}; }}"


def turns_of(conn: t.Any, name: str) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at", (name,))]


def calls_of(conn: t.Any, name: str, needle: str) -> list[tuple[int, str, int | None]]:
    return [(r["attempt"], r["status"], r["replay_of"]) for r in ledger.calls(conn, agent=name) if needle in r["input"]]


# ---- one agent ---------------------------------------------------------------------------------


def test_a_retried_turn_does_not_push_or_mail_twice(durable: tuple[ProjectPaths, Path], state_db: t.Any,
                                                    tmp_path: Path) -> None:
    project, log = durable
    scenario = {"turns": [{"actions": [
        {"expect_in_prompt": "Type: dispatch"},
        {"write": {"path": "work.txt", "content": "done\n"}},
        {"bash": "git add work.txt && git commit -qm work || true"},
        {"bash": "git push origin ov/builder-push"},
        {"bash": "ov mail send --type merge_ready --subject ready --body pushed"},
        {"bash": once(shared(tmp_path) / "killed", "kill -9 $PPID")},  # the runtime dies before its result
        {"bash": "ov mail send --type worker_done --subject done --body finished"},
    ], "result": "done"}]}
    from overstory.store import runs

    runs.open_or_join(state_db, "operator")  # so that `ov run show` has a run to show
    name = start_agent(project, state_db, "push", scenario)
    wait_for(lambda: row(state_db, name).is_terminal, 90, "the agent to finish")
    agent = row(state_db, name)
    assert agent.state == "completed", agent.state_reason
    assert pushes(log) == {"refs/heads/ov/builder-push": 1}
    assert len(state_db.execute("SELECT id FROM mail WHERE type = 'merge_ready'").fetchall()) == 1
    first_push = next(r["id"] for r in ledger.calls(state_db, agent=name) if "git push" in r["input"])
    assert calls_of(state_db, name, "git push") == [(0, "succeeded", None), (1, "skipped_duplicate", first_push)]
    replay = [r for r in ledger.calls(state_db, agent=name) if r["status"] == "skipped_duplicate"]
    assert len(replay) == 2 and all("already succeeded" in r["reason"] for r in replay)
    assert "[new branch]" in replay[0]["reason"], "the model is told what the push did"
    merge_ready_id = state_db.execute("SELECT id FROM mail WHERE type = 'merge_ready'").fetchone()[0]
    assert f"its result was: sent #{merge_ready_id} to operator" in replay[1]["reason"]
    assert [t["status"] for t in turns_of(state_db, name)] == ["transient", "ok"]
    # ov run show --turns and ov trace show the attempts and the replays.
    shown = run_ov("trace", name, "--json", cwd=project.root)
    document = json.loads(shown.stdout)
    assert [c["status"] for c in document["turns"][1]["tool_calls"] if c["class"] == "side_effect"] == [
        "skipped_duplicate", "skipped_duplicate", "succeeded"]
    text = run_ov("trace", name, cwd=project.root).stdout
    assert "skipped_duplicate (replay of #" in text and "attempt 1 started" in text
    turns_text = run_ov("run", "show", "--turns", cwd=project.root)
    assert turns_text.returncode == 0, turns_text.stderr
    assert "attempt 0 transient" in turns_text.stdout and "attempt 1 ok" in turns_text.stdout
    assert "2 skipped_duplicate" in turns_text.stdout


def test_a_side_effect_killed_mid_call_is_held_back_once_and_flagged(durable: tuple[ProjectPaths, Path],
                                                                     state_db: t.Any, events_db: t.Any,
                                                                     tmp_path: Path) -> None:
    project, log = durable
    # The push's own tool process kills the runtime: PreToolUse ran, PostToolUse never will.
    push = f"git push origin ov/builder-mid && {once(shared(tmp_path) / 'killed', 'kill -9 $PPID; sleep 1')}"
    scenario = {"turns": [{"actions": [
        {"write": {"path": "work.txt", "content": "done\n"}},
        {"bash": "git add work.txt && git commit -qm work"},
        {"bash": push},
        {"bash": push},  # what a model told "may already have happened" does after checking: asks again
        {"bash": "ov mail send --type worker_done --subject done --body finished"},
    ], "result": "done"}]}
    name = start_agent(project, state_db, "mid", scenario)
    wait_for(lambda: row(state_db, name).is_terminal, 90, "the agent to finish")
    assert row(state_db, name).state == "completed"
    assert pushes(log) == {"refs/heads/ov/builder-mid": 1}
    first = [r for r in ledger.calls(state_db, agent=name) if "git push" in r["input"]]
    assert [(r["attempt"], r["status"], r["flagged"]) for r in first] == [
        (0, "started", False), (1, "denied", True), (1, "succeeded", False)]
    assert "may already have happened" in first[1]["reason"] and first[1]["replay_of"] == first[0]["id"]
    flags = events_db.execute("SELECT agent, summary FROM events WHERE kind = 'tool_call_flagged'").fetchall()
    assert [f["agent"] for f in flags] == [name]
    # The operator's views: ov trace lists the flag, ov watch shows the event among its problems.
    trace = json.loads(run_ov("trace", name, "--json", cwd=project.root).stdout)
    assert [c["id"] for c in trace["flagged"]] == [first[1]["id"]]
    from overstory.views.status import recent_problems

    assert any(p["kind"] == "tool_call_flagged" for p in recent_problems(events_db))


def test_a_loop_killed_before_reading_a_receipt_holds_the_call_back_once(durable: tuple[ProjectPaths, Path],
                                                                         state_db: t.Any, tmp_path: Path) -> None:
    """Receipts come from the stream: the loop is frozen while the push runs, so the push's result waits
    unread in the pipe when the whole project is killed. Its row stays ``started``: the recovered attempt
    is told it may already have happened (flagged), not told it succeeded, and the push happens once."""
    project, log = durable
    pushed = shared(tmp_path) / "pushed"
    push = f"git push origin ov/builder-unread && touch {pushed} && sleep 1"
    scenario = {"turns": [{"actions": [
        {"write": {"path": "work.txt", "content": "done\n"}},
        {"bash": "git add work.txt && git commit -qm work"},
        {"bash": push},
        {"bash": push},  # told "may already have happened", the model checks and asks again
        {"bash": "ov mail send --type worker_done --subject done --body finished"},
    ], "result": "done"}]}
    name = start_agent(project, state_db, "unread", scenario)
    wait_for(pushed.exists, 90, "the push to run")
    loop = row(state_db, name)
    os.kill(loop.loop_pid, signal.SIGSTOP)  # from here on nothing reads the turn's stdout
    transcripts = project.run_dir / name / "scripted" / "projects"

    def result_written() -> bool:  # the player flushes a result to stdout before its transcript gets it
        return any("tool_result" in line and "builder-unread" in line
                   for path in transcripts.rglob("*.jsonl") for line in path.read_text().splitlines())

    wait_for(result_written, 30, "the push's result to be written")
    assert calls_of(state_db, name, "git push") == [(0, "started", None)]
    kill_everything(project)
    _resume_all(project)
    wait_for(lambda: row(state_db, name).is_terminal, 90, "the agent to finish")
    assert row(state_db, name).state == "completed", row(state_db, name).state_reason
    assert pushes(log) == {"refs/heads/ov/builder-unread": 1}
    rows = [r for r in ledger.calls(state_db, agent=name) if "git push" in r["input"]]
    assert [(r["attempt"], r["status"], r["flagged"]) for r in rows] == [
        (0, "started", False), (1, "denied", True), (1, "succeeded", False)]
    assert "may already have happened" in rows[1]["reason"]


def test_a_crash_in_the_first_turn_resumes_the_same_session(durable: tuple[ProjectPaths, Path], state_db: t.Any,
                                                            tmp_path: Path) -> None:
    project, _log = durable
    scenario = {"turns": [{"actions": [
        {"text": "starting"},
        {"bash": once(shared(tmp_path) / "killed", "kill -9 $PPID")},
        {"bash": "ov mail send --type worker_done --subject done --body finished"},
    ], "result": "done"}]}
    name = start_agent(project, state_db, "first", scenario)
    wait_for(lambda: row(state_db, name).is_terminal, 90, "the agent to finish")
    turns = turns_of(state_db, name)
    assert [(t["status"], t["resumed"]) for t in turns] == [("transient", 0), ("ok", 1)]
    assert turns[0]["session_id"] and turns[1]["session_id"] == turns[0]["session_id"]
    assert checkpoints.by_turn(state_db, [turns[0]["id"]])[turns[0]["id"]]["session_id"] == turns[0]["session_id"]
    transcript = next((project.run_dir / name / "scripted" / "projects").rglob(f"{turns[0]['session_id']}.jsonl"))
    users = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert sum(1 for u in users if u["type"] == "user" and isinstance(u["message"]["content"], str)) == 2, \
        "the retry continued the first attempt's conversation"


def test_fork_starts_a_new_agent_from_the_checkpoint(durable: tuple[ProjectPaths, Path], state_db: t.Any) -> None:
    project, _log = durable
    scenario = {"turns": [{"actions": [
        {"write": {"path": "idea.txt", "content": "first idea\n"}},
        {"bash": "git add idea.txt && git commit -qm idea || true"},
        {"bash": "ov mail send --type worker_done --subject done --body finished"},
    ], "result": "done"}]}
    name = start_agent(project, state_db, "orig", scenario)
    wait_for(lambda: row(state_db, name).is_terminal, 90, "the agent to finish")
    head = checkpoints.latest(state_db, name)["head"]
    forked = run_ov("resume", name, "--fork", "--prompt", "try a second idea", "--json", cwd=project.root)
    assert forked.returncode == 0, forked.stderr
    result = json.loads(forked.stdout)
    assert result["name"] == f"{name}-fork1" and result["branch"] == f"ov/{name}-fork1"
    fork = row(state_db, result["name"])
    assert (fork.capability, fork.task_id, fork.parent) == ("builder", "orig", "operator")
    dispatch = state_db.execute("SELECT body FROM mail WHERE recipient = ? AND type = 'dispatch'",
                                (fork.name,)).fetchone()[0]
    assert f"fork of {name}" in dispatch and "try a second idea" in dispatch and head[:12] in dispatch
    wait_for(lambda: row(state_db, fork.name).is_terminal, 90, "the fork to finish")
    assert subprocess.run(["git", "merge-base", "--is-ancestor", head, fork.branch], cwd=project.root,
                          check=False).returncode == 0
    again = run_ov("resume", name, "--fork", cwd=project.root)
    assert again.returncode == 0 and f"{name}-fork2" in again.stdout
    bad = run_ov("resume", "nobody", "--fork", cwd=project.root)
    assert bad.returncode == 1 and "no agent named" in bad.stderr and "Traceback" not in bad.stderr
    usage = run_ov("resume", name, "--name", "x", cwd=project.root)
    assert usage.returncode == 2 and "--fork" in usage.stderr
    wait_for(lambda: all(a.is_terminal for a in sessions.list_sessions(state_db)), 90, "every fork to finish")


# ---- the whole project dies ------------------------------------------------------------------------

REPORT = "ov mail send --type worker_done --subject 'done ${OVERSTORY_AGENT_NAME}' --body finished"


def _team(project: ProjectPaths, conn: t.Any, tmp_path: Path) -> dict[str, str]:
    """Five agents that will be, at the moment of the crash: in a turn, between turns, waiting on a
    child, parked, and completed (and a sixth in a turn with no retries left)."""
    busy = {"turns": [{"actions": [
        {"write": {"path": "busy.txt", "content": "work\n"}},
        {"bash": "git add busy.txt && git commit -qm busy || true"},
        {"bash": "git push origin ov/builder-busy"},
        {"bash": once(shared(tmp_path) / "busy-slept", "sleep 300")},
        {"bash": REPORT}, {"bash": REPORT},
    ], "result": "done"}]}
    busy_file = shared(tmp_path) / "busy.json"
    busy_file.write_text(json.dumps(busy))
    lead = {"turns": [
        {"actions": [{"bash": f"ov sling builder busy --runtime scripted --scenario {busy_file}"}], "result": "waiting"},
        # Refused while builder-busy's commit is not merged (a lead reports last); its `merged` mail wakes it.
        {"actions": [{"expect_in_prompt": "done builder-busy"}, {"bash": REPORT}], "result": "waiting for the merge"},
        {"actions": [{"bash": REPORT}], "result": "done"},
    ]}
    idle = {"turns": [
        {"actions": [{"bash": "ov mail send --to operator --type question --subject 'which way?' --body '?'"}],
         "result": "asked"},
        {"actions": [{"expect_in_prompt": "go left"}, {"bash": REPORT}], "result": "done"},
    ]}
    parked = {"turns": [
        {"actions": [{"bash": "ov mail send --to operator --subject 'step 1 done' --body ok"}], "result": "step 1"},
        {"actions": [{"expect_in_prompt": "go on"}, {"bash": REPORT}], "result": "done"},
    ]}
    done = {"turns": [{"actions": [{"bash": REPORT}], "result": "done"}]}
    # A sixth, which cannot be recovered: its retries are used up when the crash hits its turn.
    doomed = {"turns": [{"actions": [{"bash": once(shared(tmp_path) / "doomed-slept", "sleep 300")}, {"bash": REPORT}],
                         "result": "done"}]}
    return {
        "doomed": start_agent(project, conn, "doomed", doomed),
        "lead": start_agent(project, conn, "team", lead, capability="lead"),
        "idle": start_agent(project, conn, "idle", idle),
        "parked": start_agent(project, conn, "parked", parked),
        "done": start_agent(project, conn, "done", done),
    }


def _bring_to_crash_point(project: ProjectPaths, conn: t.Any, team: dict[str, str], tmp_path: Path) -> None:
    from overstory.store import mail

    wait_for(lambda: (shared(tmp_path) / "busy-slept").exists(), 120, "builder-busy to be mid-turn")
    team["busy"] = "builder-busy"
    wait_for(lambda: row(conn, team["idle"]).state == "between_turns" and row(conn, team["idle"]).turns == 1, 60,
             "the idle builder to wait for an answer")
    wait_for(lambda: row(conn, team["parked"]).state == "between_turns" and row(conn, team["parked"]).turns == 1, 60,
             "the parked builder's first step")
    parked = row(conn, team["parked"])
    assert sessions.transition(conn, parked.name, parked.generation, "parked", actor="test",
                               reason="approval: waiting for the operator").ok
    mail.send(conn, sender="operator", to=parked.name, subject="go on", body="go on")
    wait_for(lambda: row(conn, team["lead"]).state == "between_turns" and row(conn, team["lead"]).turns == 1, 60,
             "the lead to wait for its child")
    wait_for(lambda: row(conn, team["done"]).state == "completed", 60, "one agent to complete")
    wait_for(lambda: (shared(tmp_path) / "doomed-slept").exists(), 60, "the doomed builder to be mid-turn")
    doomed = row(conn, team["doomed"])
    assert sessions.update_fields(conn, doomed.name, doomed.generation, retries=3)  # turns.max_retries
    assert row(conn, team["busy"]).state == "in_turn"


def _finish(project: ProjectPaths, conn: t.Any, team: dict[str, str]) -> None:
    from overstory.store import mail

    parked = wait_for(lambda: (r := row(conn, team["parked"])).state == "parked" and r, 30, "parked to stay parked")
    wait_for(lambda: bool(project_processes(project)), 30, "the loops to come back")
    question = conn.execute("SELECT id FROM mail WHERE sender = ? AND type = 'question'", (team["idle"],)).fetchone()
    mail.reply(conn, question[0], sender="operator", body="go left")
    # The operator un-parks it (what `ov resume AGENT` does once budgets land).
    assert sessions.transition(conn, parked.name, parked.generation, "between_turns", actor="operator",
                               reason="approved").ok
    wait_for(lambda: row(conn, team["busy"]).state == "completed", 120, "builder-busy to finish")
    merged = run_ov("merge", team["busy"], cwd=project.root, timeout=120)  # the lead reports once it is merged
    assert merged.returncode == 0, merged.stdout + merged.stderr
    wait_for(lambda: all(a.is_terminal for a in sessions.list_sessions(conn)), 180, "every agent to finish")


def _resume_all(project: ProjectPaths, *command: str) -> subprocess.CompletedProcess[str]:
    done = run_ov(*(command or ("resume", "--all")), cwd=project.root, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


@pytest.mark.parametrize("recover", [("resume", "--all"), ("watchdog", "--once")], ids=["resume", "watchdog"])
def test_kill_9_of_the_whole_project_then_one_recovery(durable: tuple[ProjectPaths, Path], state_db: t.Any,
                                                       tmp_path: Path, recover: tuple[str, ...]) -> None:
    project, log = durable
    team = _team(project, state_db, tmp_path)
    _bring_to_crash_point(project, state_db, team, tmp_path)
    assert kill_everything(project) >= 5
    assert project_processes(project) == []
    report = _resume_all(project, *recover)
    for agent in ("busy", "idle", "lead", "parked"):
        assert f"{team[agent]}: readopted" in report.stdout, report.stdout
    assert f"{team['doomed']}: zombie" in report.stdout
    assert f"{team['done']}:" not in report.stdout
    if recover[0] == "resume":
        second = _resume_all(project)
        assert "nothing to re-adopt" in second.stdout, "a second recovery finds every loop alive"
    _finish(project, state_db, team)
    assert_invariants(project, state_db, completed=set(team.values()) - {team["doomed"]})
    assert row(state_db, team["doomed"]).state == "zombie"  # and its parent got exactly one worker_died
    assert pushes(log) == {"refs/heads/ov/builder-busy": 1}
    busy = row(state_db, team["busy"])
    assert busy.failed_turns == 1 and busy.turns == 1
    assert calls_of(state_db, team["busy"], "git push")[-1][1] == "skipped_duplicate"


def test_a_reboot_from_a_copy_of_the_project_recovers(durable: tuple[ProjectPaths, Path], state_db: t.Any,
                                                      tmp_path: Path) -> None:
    """A power cut: everything is frozen, the files are copied as they are, every process is gone, and
    the project comes back from the copy, where no recorded pid, process group or lock means anything."""
    project, log = durable
    team = _team(project, state_db, tmp_path)
    _bring_to_crash_point(project, state_db, team, tmp_path)
    frozen = [pid for pid in project_processes(project)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    snapshot = tmp_path / "snapshot"
    # The agents' endpoint sockets are not data (shutil cannot copy a socket); a recovered loop binds its own.
    shutil.copytree(project.root, snapshot, symlinks=True, ignore=shutil.ignore_patterns("ov.sock"))
    state_db.close()
    kill_everything(project)
    for pid in frozen:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(project.root)
    shutil.move(str(snapshot), str(project.root))
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        before = {a.name: a.loop_pid for a in sessions.list_sessions(conn)}
        assert all(before.values()), "the copy still records the dead loops' pids"
        _resume_all(project)
        _finish(project, conn, team)
        assert_invariants(project, conn, completed=set(team.values()) - {team["doomed"]})
        assert row(conn, team["doomed"]).state == "zombie"
        assert pushes(log) == {"refs/heads/ov/builder-busy": 1}
    finally:
        conn.close()


# ---- fault injection -------------------------------------------------------------------------------

WORK = [
    {"write": {"path": "${OVERSTORY_AGENT_NAME}.txt", "content": "work\n"}},
    {"bash": "git add -A && git commit -qm work || true"},
    {"bash": "git push origin ov/${OVERSTORY_AGENT_NAME}"}, {"bash": "git push origin ov/${OVERSTORY_AGENT_NAME}"},
    {"bash": "sleep 0.4"},
    {"bash": "ov mail send --type merge_ready --subject 'ready ${OVERSTORY_AGENT_NAME}' --body pushed"},
    {"bash": "ov mail send --type merge_ready --subject 'ready ${OVERSTORY_AGENT_NAME}' --body pushed"},
    {"bash": "sleep 0.4"},
    {"bash": REPORT}, {"bash": REPORT},
]
# The lead reports once both workers did: `ov mail list` counts the worker_done mail its turns were given.
LEAD_STEP = ("n=$(ov mail list --to ${OVERSTORY_AGENT_NAME} --type worker_done | grep -v '(unread' | grep -c worker_done); "
             "test $n -ge 2 && " + REPORT + " || echo waiting")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fault_injection_kills_everything_at_random_points(durable: tuple[ProjectPaths, Path], state_db: t.Any,
                                                           tmp_path: Path, seed: int) -> None:
    """Every process of the project is SIGKILLed at random points of the work (2 to 4 times, sometimes
    again while `ov resume --all` runs), then recovered; the scripted agents repeat a call that was held back as
    "may already have happened", as a model would after checking. Same invariants as above, and each
    branch is pushed exactly once."""
    rng = random.Random(seed)
    project, log = durable
    write_local_config(project, guards={"push_remotes": ["origin"]},
                       turns={"retry_backoff": 0.1, "kill_grace": 1, "stall_timeout": 120, "max_retries": 6,
                              "max_concurrent": 8},
                       watchdog={"interval": 0.3, "stale_after": 300, "zombie_after": 900},
                       sandbox={"writable": [str(shared(tmp_path))]})
    lead = start_agent(project, state_db, "lead", {"turns": [{"actions": [{"bash": LEAD_STEP}, {"bash": LEAD_STEP}],
                                                              "result": "checked"}] * 8}, capability="lead")
    workers = [start_agent(project, state_db, task, {"turns": [{"actions": WORK, "result": "done"}]}, parent=lead)
               for task in ("w1", "w2")]
    def calls() -> int:
        return int(state_db.execute("SELECT count(*) FROM tool_calls").fetchone()[0])

    for _ in range(rng.randint(2, 4)):
        # A random point of the work: after a random number of further tool calls, plus a random delay.
        target = calls() + rng.randint(1, 10)
        wait_for(lambda goal=target: calls() >= goal or all(a.is_terminal for a in sessions.list_sessions(state_db)),
                 120, "more work", interval=0.02)
        time.sleep(rng.uniform(0, 0.4))
        kill_everything(project)
        if rng.random() < 0.4:  # die again while recovering
            recovering = subprocess.Popen([*ov_command(), "resume", "--all"], cwd=project.root,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.05, 0.8))
            kill_everything(project)
            recovering.wait(timeout=30)
        _resume_all(project)
    # A lead reports last: its worker_done is refused while a builder's commit is unmerged, so the operator merges
    # each builder once it has finished (the `merged` mail wakes the lead).
    for worker in workers:
        wait_for(lambda w=worker: sessions.get(state_db, w).is_terminal, 240, f"{worker} to finish")
        merged = run_ov("merge", worker, cwd=project.root, timeout=120)
        assert merged.returncode == 0, merged.stdout + merged.stderr
    wait_for(lambda: all(a.is_terminal for a in sessions.list_sessions(state_db)), 240, "every agent to finish")
    assert_invariants(project, state_db, completed={lead, *workers})
    # Each branch reached the remote, and no ref changed twice. The remote's post-receive hook logs a push
    # after the ref moved, so a kill in between loses the line, not the push: the remote's refs are the truth.
    assert remote_refs(log.parent / "remote.git") >= {f"refs/heads/ov/{w}" for w in workers}
    assert all(count == 1 for count in pushes(log).values()), pushes(log)
    ready = [r[0] for r in state_db.execute("SELECT sender FROM mail WHERE type = 'merge_ready' ORDER BY sender")]
    assert ready == sorted(workers)
    interrupted = state_db.execute("SELECT count(*) FROM turns WHERE status IN ('failed', 'interrupted', 'transient')"
                                   ).fetchone()[0]
    held = {s: n for s, n in state_db.execute("SELECT status, count(*) FROM tool_calls GROUP BY status")}
    print(f"seed {seed}: {interrupted} interrupted turn(s), ledger {held}")
