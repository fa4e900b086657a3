"""ov's own checks over agent-written code: loop checks, phase gates and merge gates (issue 28, items 2 and 13).

A check runs what the agent wrote (its tests, a ``conftest.py``, a ``pytest.py`` that shadows
pytest), so ov runs it inside the agent's kernel boundary, on a fresh checkout of the agent's
last commit, with ``loop.protected_paths`` pinned to the base: nothing it runs may write outside
that checkout, read an agent's secret, or fake the check by changing what the check depends on.
A check dies with the loop that started it. The scripted runtime stands in for the model; the
loops, bubblewrap, git, SQLite and pytest are real. The same with the real claude CLI is in
tests/e2e/test_loop_claude.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import typing as t
from pathlib import Path

import pytest
import yaml

from agent_helpers import agent_state, wait_for, wait_terminal, write_scenario
from conftest import run_git, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.sandbox.probe import probe
from sandbox_helpers import MISSING, requires_bwrap
from test_loop import records, settled
from test_watchdog import make_watchdog, write_local_config

SECRET = "sk-ant-check-secret-5e1d"
PYTEST = f"{sys.executable} -m pytest -q"
CALC = {"calc.py": "def add(a, b):\n    return a - b\n",
        "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(1, 1) == 2\n"}


def evil_code(targets: t.Sequence[Path]) -> str:
    """Python that tries to write each target, reports what happened and which secrets it sees, and exits 0.
    (``OVERSTORY_CHECK_ID`` is no secret: the tag by which ov finds a check's processes.)"""
    return (
        "import os\n"
        "report = []\n"
        f"for target in {[str(p) for p in targets]!r}:\n"
        "    try:\n"
        "        with open(target, 'w') as handle:\n"
        "            handle.write('pwned\\n')\n"
        "        report.append('WROTE ' + target)\n"
        "    except OSError as exc:\n"
        "        report.append('BLOCKED ' + target + ': ' + str(exc.strerror))\n"
        "leaked = sorted(k for k in os.environ if (k.startswith('OVERSTORY_') and k != 'OVERSTORY_CHECK_ID')\n"
        "                or k.endswith('API_KEY'))\n"
        "print('EVIL-RAN', '; '.join(report), 'LEAKED', leaked, flush=True)\n"
        "os._exit(0)\n")


@pytest.fixture
def calc(project: ProjectPaths) -> ProjectPaths:
    for name, text in CALC.items():
        (project.root / name).write_text(text)
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-q", "-m", "calc with a bug")
    return project


def targets_of(project: ProjectPaths, tmp_path: Path) -> list[Path]:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    return [project.root / "PWNED-main", project.ov_dir / "PWNED-ov", project.worktree("builder-t1") / "PWNED-worktree",
            outside / "PWNED-outside"]


def check_logs(project: ProjectPaths, name: str = "builder-t1") -> str:
    folder = project.logs_dir / name / "loop"
    return "\n".join(p.read_text() for p in sorted(folder.glob("check-*.txt"))) if folder.is_dir() else ""


def test_protected_paths_are_git_glob_pathspecs_and_a_checkout_pins_them(git_repo, tmp_path):
    from overstory.sandbox import check_tree

    files = {"tests/a.py": "base a\n", "conftest.py": "base conftest\n", "keep.txt": "base keep\n"}
    for name, text in files.items():
        (git_repo / name).parent.mkdir(parents=True, exist_ok=True)
        (git_repo / name).write_text(text)
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "base")
    base = run_git(git_repo, "rev-parse", "HEAD").strip()
    (git_repo / "tests" / "a.py").write_text("agent a\n")
    (git_repo / "tests" / "new.py").write_text("agent new\n")
    (git_repo / "pkg").mkdir()
    (git_repo / "pkg" / "conftest.py").write_text("agent conftest\n")
    (git_repo / "keep.txt").write_text("agent keep\n")
    run_git(git_repo, "rm", "-q", "conftest.py")
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "head")
    head = run_git(git_repo, "rev-parse", "HEAD").strip()

    changes = check_tree.protected_changes(git_repo, base, head, ["tests/", "**/conftest.py"], ["tests/new.py"])
    assert [(c.path, c.change, c.allowed) for c in changes] == [
        ("conftest.py", "deleted", False), ("pkg/conftest.py", "added", False), ("tests/a.py", "modified", False),
        ("tests/new.py", "added", True)]
    assert check_tree.protected_changes(git_repo, base, head, ["conftest.py"]) == [changes[0]], "top level only"
    assert check_tree.protected_changes(git_repo, base, head, []) == []

    dest = tmp_path / "scratch" / "check-x-0123abcd"
    check_tree.checkout(git_repo, head, dest, base=base, pinned=[c.path for c in changes if not c.allowed])
    seen = {str(p.relative_to(dest)): p.read_text() for p in dest.rglob("*") if p.is_file() and ".git" not in p.name}
    assert seen == {"conftest.py": "base conftest\n", "tests/a.py": "base a\n", "tests/new.py": "agent new\n",
                    "keep.txt": "agent keep\n", "README.md": "hello\n"}
    check_tree.remove(git_repo, dest)
    assert not dest.exists() and str(dest) not in run_git(git_repo, "worktree", "list")


def test_bad_protected_paths_are_one_line_errors(calc, tmp_path):
    done = run_ov("loop", "builder", "t1", "--prompt", "x", "--allow-protected", "../up", cwd=calc.root)
    assert done.returncode == 1 and "--allow-protected" in done.stderr and len(done.stderr.splitlines()) == 1
    write_local_config(calc, loop={"protected_paths": ["/etc"]})
    done = run_ov("loop", "builder", "t1", "--prompt", "x", cwd=calc.root)
    assert done.returncode != 0 and "protected path" in done.stderr and "Traceback" not in done.stderr
    assert run_git(calc.root, "branch", "--list", "ov/*") == "" and agent_state(calc, "builder-t1") is None


@requires_bwrap
def test_a_check_runs_the_branch_in_the_sandbox_with_protected_paths_pinned(calc, tmp_path):
    write_local_config(calc, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2}, sandbox={"mode": "bwrap"},
                       loop={"protected_paths": ["conftest.py", "tests/"]})
    targets = targets_of(calc, tmp_path)
    evil = evil_code(targets)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [
        # A conftest.py (protected) committed, and a pytest.py that shadows pytest, which git ignores.
        {"actions": [{"write": {"path": "conftest.py", "content": evil}},
                     {"bash": "git add conftest.py && git commit -q -m 'make the tests pass'"},
                     {"write": {"path": ".gitignore", "content": "pytest.py\n"}},
                     {"write": {"path": "pytest.py", "content": evil}}],
         "result": "All green. LOOP_DONE"},
        # Told about the protected path: it drops conftest.py and commits the pytest.py (not protected).
        {"actions": [{"expect_in_prompt": "protected path(s) changed: conftest.py (added)"},
                     {"bash": "git rm -q conftest.py && git add -f pytest.py && git commit -q -m 'shadow pytest'"}],
         "result": "Green now. LOOP_DONE"},
    ]}}}))
    started = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--prompt", "make the tests pass",
                     "--check", PYTEST, "--scenario", str(plan), cwd=calc.root, env={"ANTHROPIC_API_KEY": SECRET})
    assert started.returncode == 0, started.stderr
    agent = settled(calc)
    logs = check_logs(calc)
    for target in targets:
        assert not target.exists(), f"a check wrote {target}:\n{logs}"
    rows = records(calc)
    assert agent.state == "completed", (agent.state_reason, rows)
    assert [(r["number"], r["promise_seen"]) for r in rows] == [(1, 1), (2, 1)]
    first, second = rows
    assert first["check_exit"] != 0 and "protected path(s) changed: conftest.py (added)" in first["outcome"]
    assert "1 failed" in first["check_tail"], "the real pytest ran (conftest.py pinned away, pytest.py ignored)"
    assert "EVIL-RAN" not in first["check_tail"]
    # What the agent left uncommitted ov committed before its check (what git ignores stayed out).
    worktree = calc.worktree("builder-t1")
    committed = run_git(worktree, "log", "--format=%s", "--name-only", "--grep=ov loop builder-t1: iteration 1")
    assert committed.split() == ["ov", "loop", "builder-t1:", "iteration", "1", ".gitignore"], committed
    # Iteration 2's committed pytest.py did run: inside the sandbox, where every write outside its checkout failed.
    assert second["check_exit"] == 0 and "EVIL-RAN" in second["check_tail"]
    assert "WROTE" not in second["check_tail"] and second["check_tail"].count("BLOCKED") == len(targets)
    assert "LEAKED []" in second["check_tail"], "no agent secret in a check's environment"
    status = run_ov("loop", "status", "builder-t1", cwd=calc.root).stdout
    assert "protected path(s) changed: conftest.py (added)" in status
    assert (worktree / "pytest.py").exists() and run_git(worktree, "status", "--porcelain") == ""


@requires_bwrap
def test_an_allowed_protected_path_is_checked_as_the_agent_wrote_it(calc, tmp_path):
    write_local_config(calc, turns={"retry_backoff": 0.05}, watchdog={"interval": 0.2},
                       loop={"protected_paths": ["test_*.py"]})
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [
        {"actions": [{"edit": {"path": "test_calc.py", "old": "== 2", "new": "== 0"}},
                     {"bash": "git commit -q -am 'the test was wrong'"}], "result": "LOOP_DONE"},
    ]}}}))
    started = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--prompt", "fix the test",
                     "--check", PYTEST, "--allow-protected", "test_calc.py", "--scenario", str(plan), cwd=calc.root)
    assert started.returncode == 0, started.stderr
    agent = settled(calc)
    assert agent.state == "completed", (agent.state_reason, records(calc))
    document = json.loads(run_ov("loop", "status", "builder-t1", "--json", cwd=calc.root).stdout)
    assert document["protected"]["allowed"] == ["test_calc.py"]
    assert document["protected"]["changed"] == [{"path": "test_calc.py", "change": "modified", "allowed": True}]


def test_ov_never_commits_an_agents_leftovers_onto_a_branch_its_head_was_pointed_at(calc, tmp_path):
    """The worktree's admin dir is writable in the sandbox: an agent can point its HEAD at main. ov commits
    leftovers (before a check, at a checkpoint) from outside, so it must only ever commit onto ov/NAME."""
    write_local_config(calc, turns={"retry_backoff": 0.05}, watchdog={"interval": 0.2})
    main_before = run_git(calc.root, "rev-parse", "main")
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [
        {"actions": [{"bash": "python3 -c \"import subprocess; d = subprocess.check_output(['git', 'rev-parse', "
                              "'--git-dir'], text=True).strip(); open(d + '/HEAD', 'w').write('ref: refs/heads/main')\""},
                     {"write": {"path": "planted.txt", "content": "onto main\n"}}], "result": "LOOP_DONE"},
    ]}}}))
    started = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--prompt", "x", "--check", "true",
                     "--scenario", str(plan), cwd=calc.root)
    assert started.returncode == 0, started.stderr
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    assert run_git(calc.worktree("builder-t1"), "symbolic-ref", "HEAD").strip() == "refs/heads/main", "the plant"
    assert run_git(calc.root, "rev-parse", "main") == main_before, "main moved"
    assert "planted.txt" not in run_git(calc.root, "log", "--all", "--name-only", "--format=")


# ---- a check dies with its loop (item 13) ------------------------------------------------------------------


def need_bwrap() -> None:
    """As ``requires_bwrap``, inside a parametrized test."""
    if not probe().ok:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(MISSING + " (CI=true: sandbox tests must not be skipped)", pytrace=False)
        pytest.skip(MISSING)


def gate_copies(token: str) -> list[int]:
    """Live shells running the gate (found by a token in their command line)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            comm = Path(entry.path, "comm").read_text().strip()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        if comm == "bash" and token.encode() in cmdline and procs.is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("mode", ["bwrap", "off"])
def test_kill_9_of_the_loop_mid_gate_kills_the_gate_and_the_restart_runs_one_copy(calc, tmp_path, mode):
    if mode == "bwrap":
        need_bwrap()
    marks = tmp_path / "gate-marks"
    marks.mkdir()
    write_local_config(calc, turns={"retry_backoff": 0.05, "kill_grace": 1}, watchdog={"interval": 0.2},
                       sandbox={"mode": mode, "writable": [str(marks)]})
    token = f"{marks}/release"
    gate = (f"echo start >> {marks}/starts; while [ ! -f {token} ]; do sleep 0.05; done; "
            f"echo end >> {marks}/ends")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"objective": "wait for the gate",
                                    "phases": [{"name": "only", "objective": "nothing to do", "gate": gate}]}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [{"actions": [], "result": "LOOP_DONE"}]}}}))
    started = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--spec", str(spec), "--scenario", str(plan),
                     cwd=calc.root)
    assert started.returncode == 0, started.stderr
    starts = marks / "starts"
    wait_for(lambda: starts.exists() and gate_copies(token), 60, message="the gate to run")
    first = agent_state(calc, "builder-t1")
    assert first is not None and first.loop_pid
    os.kill(first.loop_pid, signal.SIGKILL)
    wait_for(lambda: not procs.is_alive(first.loop_pid, first.loop_start_ticks), message="the loop to die")
    wait_for(lambda: not gate_copies(token), 10, message="the gate to die with its loop")

    dog = make_watchdog(calc)
    try:
        assert [(a.agent, a.kind) for a in dog.tick()] == [("builder-t1", "readopted")]
    finally:
        dog.close()
    wait_for(lambda: starts.read_text().count("start") == 2, 60, message="the restarted loop to run the gate again")
    assert len(gate_copies(token)) == 1, "one copy of the gate, not two"
    Path(token).touch()
    agent = settled(calc)
    assert agent.state == "completed", agent.state_reason
    assert (marks / "ends").read_text().count("end") == 1, "the killed copy never finished"
    assert not gate_copies(token)


def test_ov_stop_mid_check_leaves_no_check_running(calc, tmp_path):
    """Without a sandbox too (sandbox.mode: off): once `ov stop` returns, nothing of the check runs."""
    marks = tmp_path / "gate-marks"
    marks.mkdir()
    write_local_config(calc, turns={"kill_grace": 1}, sandbox={"mode": "off"})
    token = f"{marks}/release"
    check = f"echo start >> {marks}/starts; (while [ ! -f {token} ]; do sleep 0.05; done) & wait"
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [{"actions": [], "result": "LOOP_DONE"}]}}}))
    started = run_ov("loop", "builder", "t1", "--runtime", "scripted", "--prompt", "wait", "--check", check,
                     "--scenario", str(plan), cwd=calc.root)
    assert started.returncode == 0, started.stderr
    wait_for(lambda: (marks / "starts").exists() and len(gate_copies(token)) == 2, 60,
             message="the check (a shell and its background loop) to run")
    stopped = run_ov("stop", "builder-t1", cwd=calc.root)
    assert stopped.returncode == 0, stopped.stderr
    assert gate_copies(token) == [], "a check outlived `ov stop`"
    assert list((calc.ov_dir / "tmp").glob("check-*")) == [], "its checkout went with it"
    assert "check-" not in run_git(calc.root, "worktree", "list")


# ---- merge gates ------------------------------------------------------------------------------------------


@requires_bwrap
def test_merge_gates_run_in_the_sandbox_and_refuse_a_protected_change_until_allowed(calc, tmp_path):
    write_local_config(calc, merge={"gates": [PYTEST]}, loop={"protected_paths": ["conftest.py"]},
                       sandbox={"mode": "bwrap"})
    outside = tmp_path / "outside"
    outside.mkdir()
    targets = [calc.root / "PWNED-main", calc.ov_dir / "PWNED-ov", outside / "PWNED-outside"]
    evil = evil_code(targets)
    fix = {"edit": {"path": "calc.py", "old": "a - b", "new": "a + b"}}
    scenario = write_scenario(tmp_path / "builder.json", [{"actions": [
        fix, {"write": {"path": "conftest.py", "content": "# harmless\n"}},
        {"write": {"path": "pytest.py", "content": evil}},
        {"bash": "git add -A && git commit -q -m 'fix add; a conftest and a pytest of my own'"},
        {"bash": 'ov mail send --type worker_done --subject done --body "committed"'},
    ]}])
    done = run_ov("sling", "builder", "m1", "--runtime", "scripted", "--scenario", str(scenario), cwd=calc.root,
                  env={"ANTHROPIC_API_KEY": SECRET})
    assert done.returncode == 0, done.stderr
    assert wait_terminal(calc, "builder-m1").state == "completed"
    before = run_git(calc.root, "rev-parse", "main")

    refused = run_ov("merge", "builder-m1", cwd=calc.root)
    assert refused.returncode == 1 and "protected path(s) changed: conftest.py (added)" in refused.stdout, refused
    assert "--allow-protected" in refused.stdout
    assert run_git(calc.root, "rev-parse", "main") == before
    for target in targets:
        assert not target.exists(), refused.stdout

    merged = run_ov("merge", "builder-m1", "--allow-protected", "--json", cwd=calc.root)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    for target in targets:
        assert not target.exists(), f"the gate wrote {target}"
    assert run_git(calc.root, "rev-parse", "main") != before


def test_only_the_operator_allows_a_protected_change(calc):
    done = run_ov("merge", "builder-nobody", "--allow-protected", cwd=calc.root,
                  env={"OVERSTORY_ENDPOINT": str(calc.root / "nowhere.sock"), "OVERSTORY_ENDPOINT_TOKEN": "x"})
    assert done.returncode == 2 and "only the operator" in done.stderr, done.stderr
