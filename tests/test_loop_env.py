"""`ov loop` as a new user meets it (issue 32): docs/loops-and-schedules.md's example, offline, in the project's venv.

The check runs in the project's Python environment, never ov's: ov's own virtual environment is
taken off the check's PATH (the tests put it first on the PATH `ov` is run with, and set
VIRTUAL_ENV to it, as an activated venv does), and the project's `.venv` goes first when there is
one. `ov loop status` and the escalation of a parked loop show the end of each failed check and
where its whole output is. A loop agent's own worker_done is held: the loop reports once. The
scripted runtime's built-in scenario plays the model (it says the promise in a loop); the loops,
bubblewrap, git, SQLite, the virtual environment and pytest are real.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import typing as t
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from agent_helpers import agent_state, mail_rows, wait_for
from conftest import REPO_ROOT, run_git, run_ov
from overstory import procs
from overstory.paths import ProjectPaths
from overstory.store.db import open_state
from test_loop import records, settled
from test_watchdog import make_watchdog, write_local_config

DOCUMENTED_LOOP = ["loop", "builder", "green", "--prompt", "make the whole test suite pass", "--check",
               "python -m pytest -q", "--max-usd", "10"]
NAME = "builder-green"
OWN_BIN = os.path.dirname(sys.executable)  # ov's own virtual environment (the one running these tests)


def test_the_docs_show_this_loop_example() -> None:
    page = (REPO_ROOT / "docs" / "loops-and-schedules.md").read_text(encoding="utf-8")
    shown = [shlex.split(line) for line in page.splitlines() if line.startswith("ov loop builder green ")]
    assert shown == [["ov", *DOCUMENTED_LOOP]]


def green_project(project: ProjectPaths) -> ProjectPaths:
    """A project whose test suite passes, when pytest can be imported, and says which Python ran it."""
    tests = project.root / "tests"
    tests.mkdir()
    (tests / "test_green.py").write_text(
        "import sys\n\nimport pytest\n\n\ndef test_where():\n"
        "    print('PYTEST FROM', pytest.__file__, 'PREFIX', sys.prefix)\n"
        f"    assert sys.prefix == {str(project.root / '.venv')!r}\n"
        "    assert pytest.__file__.startswith(sys.prefix)\n")
    (project.root / ".gitignore").write_text(".venv/\n.bin/\n")
    run_git(project.root, "add", "-A")
    run_git(project.root, "commit", "-q", "-m", "a green test suite")
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2}, loop={"same_failure_limit": 2})
    return project


def own_venv_env(extra: t.Sequence[Path] = ()) -> dict[str, str]:
    """The environment of an operator whose shell has ov's virtual environment activated."""
    parts = [OWN_BIN, *map(str, extra), "/usr/local/bin", "/usr/bin", "/bin"]
    return {"PATH": os.pathsep.join(parts), "VIRTUAL_ENV": sys.prefix}


def _distributions(name: str, seen: dict[str, metadata.Distribution]) -> None:
    from packaging.requirements import Requirement

    dist = metadata.distribution(name)
    key = dist.metadata["Name"].lower()
    if key in seen:
        return
    seen[key] = dist
    for text in dist.requires or ():
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            _distributions(requirement.name, seen)


def make_project_venv(root: Path) -> Path:
    """A real virtual environment at ROOT/.venv (no pip: fast) with pytest and what it needs copied in, so
    pytest is imported from there and from nowhere else."""
    venv = root / ".venv"
    done = __import__("subprocess").run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                                        capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    found: dict[str, metadata.Distribution] = {}
    _distributions("pytest", found)
    for dist in found.values():
        for file in dist.files or ():
            source = Path(str(dist.locate_file(file)))
            if source.is_file() and "__pycache__" not in file.parts and not str(file).startswith(".."):
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
    return venv


def python_without_pytest(root: Path) -> Path:
    """A `python` that has no third-party packages (the machine's Python, without its site directories)."""
    folder = root / ".bin"
    folder.mkdir()
    python = folder / "python"
    python.write_text(f"#!/bin/sh\nexec {getattr(sys, '_base_executable', sys.executable)} -I -S \"$@\"\n")
    python.chmod(0o755)
    return folder


def status(project: ProjectPaths) -> tuple[str, dict[str, t.Any]]:
    text = run_ov("loop", "status", NAME, cwd=project.root)
    document = run_ov("loop", "status", NAME, "--json", cwd=project.root)
    assert text.returncode == 0 and document.returncode == 0, text.stderr + document.stderr
    return text.stdout, json.loads(document.stdout)


def test_the_readme_loop_runs_offline_in_the_projects_venv(project: ProjectPaths):
    green = green_project(project)
    venv = make_project_venv(green.root)
    done = run_ov(*DOCUMENTED_LOOP, "--runtime", "scripted", cwd=green.root, env=own_venv_env())
    assert done.returncode == 0, done.stderr
    assert f"  checks:   `python` is {venv / 'bin' / 'python'} (virtual environment {venv})" in done.stdout
    agent = settled(green, NAME)
    assert agent.state == "completed", agent.state_reason
    rows = records(green, NAME)
    assert [(r["number"], r["promise_seen"], r["check_exit"]) for r in rows] == [(1, 1, 0)]
    used = json.loads(rows[0]["check_env"])
    assert used["venv"] == str(venv) and used["python"] == str(venv / "bin" / "python")
    assert used["commit"] and used["cwd"].startswith(str(green.ov_dir / "tmp"))
    assert "1 passed" in Path(rows[0]["check_log"]).read_text()  # its asserts: run by the project's venv
    text, document = status(green)
    assert f"`python` is {venv / 'bin' / 'python'} (virtual environment {venv})" in text
    assert document["last_check_env"]["venv"] == str(venv) and "failed checks" not in text
    assert f"last check: in .overstory/tmp/check-{NAME}-" in text and document["last_check_env"]["commit"][:12] in text
    reports = mail_rows(green, type="worker_done")
    assert len(reports) == 1 and reports[0]["sender"] == NAME and reports[0]["recipient"] == "operator"


def test_the_readme_loop_without_a_venv_fails_clearly_and_shows_the_output(project: ProjectPaths):
    green = green_project(project)
    bare = python_without_pytest(green.root)
    done = run_ov(*DOCUMENTED_LOOP, "--runtime", "scripted", cwd=green.root, env=own_venv_env([bare]))
    assert done.returncode == 0, done.stderr
    assert f"  checks:   `python` is {bare / 'python'} (no project virtual environment" in done.stdout
    agent = settled(green, NAME)
    assert agent.state == "parked" and agent.park_kind == "loop", agent.state_reason
    assert agent.state_reason.startswith("loop: the same check failure 2 times in a row")
    rows = records(green, NAME)
    assert [(r["promise_seen"], r["check_exit"]) for r in rows] == [(1, 1), (1, 1)]
    used = json.loads(rows[-1]["check_env"])
    assert used["venv"] is None and used["python"] == str(bare / "python"), "never ov's own venv"
    log = green.logs_dir / NAME / "loop" / "check-2-1-0.txt"
    assert rows[-1]["check_log"] == str(log) and "No module named pytest" in log.read_text()

    text, document = status(green)
    assert "failed checks (the end of each):" in text
    relative = str(log.relative_to(green.root))
    assert f"iterations 1, 2: `python -m pytest -q` exit 1; whole output: {relative}" in text
    assert "| " in text and "No module named pytest" in text
    assert "no project virtual environment: no .venv at the project root" in text
    assert document["records"][-1]["check_log"] == relative

    escalations = mail_rows(green, type="escalation")
    assert len(escalations) == 1
    body = escalations[0]["body"]
    assert "No module named pytest" in body and relative in body and "make one, or name one with loop.check_env" in body
    second = (green.logs_dir / NAME / rows[1]["turn_id"] / "prompt.txt").read_text()
    assert "No module named pytest" in second and "no project virtual environment" in second
    assert mail_rows(green, type="worker_done") == [], "a parked loop has not reported done"


def test_loop_check_env_names_the_venv_and_one_that_is_none_is_refused_at_the_start(project: ProjectPaths):
    green = green_project(project)
    write_local_config(green, loop={"same_failure_limit": 1, "check_env": "envs/tools"},
                       turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3})
    refused = run_ov(*DOCUMENTED_LOOP, "--runtime", "scripted", cwd=green.root, env=own_venv_env())
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "loop.check_env envs/tools: " in refused.stderr and "is not a virtual environment (no bin/python)" \
        in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert agent_state(green, NAME) is None and run_git(green.root, "branch", "--list", "ov/*") == ""

    (green.root / "envs").mkdir()
    make_project_venv(green.root).rename(green.root / "envs" / "tools")
    tools = green.root / "envs" / "tools"
    (green.root / "tests" / "test_green.py").write_text(
        (green.root / "tests" / "test_green.py").read_text().replace(str(green.root / ".venv"), str(tools)))
    run_git(green.root, "commit", "-q", "-am", "the tests run in envs/tools")
    done = run_ov(*DOCUMENTED_LOOP, "--runtime", "scripted", cwd=green.root, env=own_venv_env())
    assert done.returncode == 0, done.stderr
    assert f"  checks:   `python` is {tools / 'bin' / 'python'} (virtual environment {tools}, loop.check_env)" \
        in done.stdout
    agent = settled(green, NAME)
    assert agent.state == "completed", agent.state_reason
    assert json.loads(records(green, NAME)[0]["check_env"])["configured"] is True


def test_a_loop_agents_own_worker_done_is_held_and_the_loop_reports_once_across_a_kill(project: ProjectPaths,
                                                                                         tmp_path: Path):
    """The agent reports done in its iteration; ov holds it (no mail) and the loop is killed (SIGKILL) after
    judging the iteration, before it reports. The restarted loop completes it: one worker_done, the loop's,
    quoting the held one."""
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2})
    plan = tmp_path / "plan.yaml"
    report = "ov mail send --type worker_done --subject 'all done' --body 'the notes are committed'"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [
        {"actions": [{"bash": f"{report} > held.txt 2>&1; cat held.txt"}], "result": "done. LOOP_DONE"}]}}}))
    done = run_ov("loop", "builder", "t1", "--prompt", "write notes", "--check", "true", "--runtime", "scripted",
                  "--scenario", str(plan), cwd=project.root, env={"OV_TEST_KILL_AT": "loop_judged"})
    assert done.returncode == 0, done.stderr
    marker = project.run_dir / "builder-t1" / "killed-at-loop_judged"
    first = wait_for(lambda: marker.exists() and (a := agent_state(project, "builder-t1")) and a, 60,
                     message="the loop to die after judging the iteration")
    wait_for(lambda: not procs.is_alive(first.loop_pid, first.loop_start_ticks), 30, message="the loop to be gone")
    assert mail_rows(project, type="worker_done") == [], "held: nothing reached the parent"
    conn = open_state(project.state_db)
    held = json.loads(conn.execute("SELECT held_report FROM loops WHERE name = 'builder-t1'").fetchone()[0])
    conn.close()
    assert held["subject"] == "all done" and held["body"] == "the notes are committed"
    said = (project.worktree("builder-t1") / "held.txt").read_text()
    assert "held, not sent" in said and "the loop reports to operator once" in said

    dog = make_watchdog(project)
    try:
        assert [(a.agent, a.kind) for a in dog.tick()] == [("builder-t1", "readopted")]
    finally:
        dog.close()
    agent = settled(project, "builder-t1")
    assert agent.state == "completed", agent.state_reason
    reports = mail_rows(project, type="worker_done")
    assert len(reports) == 1 and reports[0]["sender"] == "builder-t1" and reports[0]["recipient"] == "operator"
    assert "Its own last report (held while the loop ran): all done\nthe notes are committed" in reports[0]["body"]
    assert "loop complete after 1 iteration" in reports[0]["subject"]


def test_max_wallclock_parks_a_loop_through_its_budget(project: ProjectPaths, tmp_path: Path):
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2})
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [
        {"actions": [{"sleep": 2}], "result": "not yet"}, {"actions": [], "result": "LOOP_DONE"}]}}}))
    done = run_ov("loop", "builder", "t1", "--prompt", "wait", "--check", "true", "--runtime", "scripted",
                  "--scenario", str(plan), "--max-wallclock", "1s", "--max-usd", "3", cwd=project.root)
    assert done.returncode == 0, done.stderr
    assert "limit:    20 iterations, $3.00, 1s of wall clock" in done.stdout
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.park_kind == "budget", agent.state_reason
    assert agent.state_reason.startswith("budget: max_wallclock 1s reached"), agent.state_reason
    limits = json.loads(run_ov("budget", "builder-t1", "--json", cwd=project.root).stdout)["budgets"][0]["limits"]
    assert limits["wallclock"]["limit"] == 1 and limits["usd"]["limit"] == 3, limits
    assert len(mail_rows(project, type="escalation")) == 1
    refused = run_ov("loop", "builder", "t2", "--prompt", "x", "--max-wallclock", "soon", cwd=project.root)
    assert refused.returncode == 2 and "--max-wallclock" in refused.stderr and "Traceback" not in refused.stderr


def test_a_checks_environment_leaves_ovs_own_venv_out_and_puts_the_projects_first(project: ProjectPaths):
    from overstory.errors import SandboxError
    from overstory.sandbox.checks import check_env
    from test_watchdog import load

    config = load(project)
    operator = {"PATH": os.pathsep.join([OWN_BIN, "/usr/bin", "/bin"]), "VIRTUAL_ENV": sys.prefix,
                "OVERSTORY_AGENT_NAME": "builder-x", "HOME": "/home/someone"}
    env, used = check_env(operator, config, project.root)
    assert env["PATH"].split(os.pathsep) == ["/usr/bin", "/bin"] and "VIRTUAL_ENV" not in env
    assert "OVERSTORY_AGENT_NAME" not in env and env["HOME"] == "/home/someone"
    assert used.venv is None and used.python != sys.executable

    venv = make_project_venv(project.root)
    env, used = check_env(operator, config, project.root)
    assert env["PATH"].split(os.pathsep) == [str(venv / "bin"), "/usr/bin", "/bin"]
    assert env["VIRTUAL_ENV"] == str(venv) and used.python == str(venv / "bin" / "python") and not used.configured

    write_local_config(project, loop={"check_env": "envs/tools"})
    with pytest.raises(SandboxError, match="loop.check_env envs/tools: .* is not a virtual environment"):
        check_env(operator, load(project), project.root)
    (project.root / "envs").mkdir()
    (project.root / ".venv").rename(project.root / "envs" / "tools")
    env, used = check_env(operator, load(project), project.root)
    assert env["PATH"].split(os.pathsep)[0] == str(project.root / "envs" / "tools" / "bin") and used.configured


def test_a_loop_parked_by_its_dollar_budget_quotes_its_failed_checks(project: ProjectPaths, tmp_path: Path):
    write_local_config(project, turns={"retry_backoff": 0.05, "kill_grace": 1, "max_retries": 3},
                       watchdog={"interval": 0.2})
    bill = {"usage": {"input_tokens": 200_000, "output_tokens": 0, "model": "claude-opus-4-8", "cost_usd": 1.0}}
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"agents": {"builder-*": {"iterations": [
        {"actions": [bill], "result": "LOOP_DONE"}, {"actions": [bill], "result": "LOOP_DONE"}]}}}))
    done = run_ov("loop", "builder", "t1", "--prompt", "spend", "--check", "echo the-check-said-boom; exit 3",
                  "--runtime", "scripted", "--scenario", str(plan), "--max-usd", "3", cwd=project.root)
    assert done.returncode == 0, done.stderr
    agent = settled(project, "builder-t1")
    assert agent.state == "parked" and agent.park_kind == "budget", agent.state_reason
    escalations = mail_rows(project, type="escalation")
    assert len(escalations) == 1, escalations
    body = escalations[0]["body"]
    assert "iteration 1: `echo the-check-said-boom; exit 3` exit 3" in body and "| the-check-said-boom" in body
    assert ".overstory/logs/builder-t1/loop/check-1-1-0.txt" in body


def test_ov_mail_send_outside_a_sandbox_holds_a_looping_agents_worker_done_and_nothing_else(project: ProjectPaths):
    """The `ov mail send` that writes SQLite itself (no endpoint: the operator's shell, `sandbox.mode: off`)
    holds the same way; other mail of the agent, and mail once its loop completed, go out as usual."""
    from overstory.store import loops
    from test_mail import make_agent

    conn = open_state(project.state_db)
    try:
        generation = make_agent(conn, "builder-l", parent="lead-1", state="in_turn")
        make_agent(conn, "lead-1", capability="lead", state="between_turns")
        loops.ensure(conn, "builder-l", generation, {"max_iterations": 3, "phases": [{"name": "main"}]})
    finally:
        conn.close()
    done = run_ov("mail", "send", "--from", "builder-l", "--type", "worker_done", "--subject", "early",
                  "--body", "b", cwd=project.root)
    assert done.returncode == 0, done.stderr
    assert "held, not sent: builder-l works in an `ov loop`, and the loop reports to lead-1 once" in done.stdout
    assert mail_rows(project, type="worker_done") == []
    other = run_ov("mail", "send", "--from", "builder-l", "--to", "lead-1", "--subject", "progress", "--body", "b",
                   cwd=project.root)
    assert other.returncode == 0 and "sent #" in other.stdout
    conn = open_state(project.state_db)
    try:
        assert json.loads(conn.execute("SELECT held_report FROM loops").fetchone()[0])["subject"] == "early"
        loops.update(conn, "builder-l", generation, status="completed")
    finally:
        conn.close()
    after = run_ov("mail", "send", "--from", "builder-l", "--type", "worker_done", "--subject", "late", "--json",
                   cwd=project.root)
    assert after.returncode == 0 and json.loads(after.stdout)["to"] == ["lead-1"], after.stdout + after.stderr


def test_failed_checks_are_shown_once_per_kind_of_failure_the_newest_kinds_first_cut():
    from overstory.agents.iterations.start import failure_lines

    rows = [{"status": "done", "number": i, "attempt": 1, "check_exit": 1, "fingerprint": f"kind{i % 7}",
             "check_tail": "$ make test\n" + "".join(f"line {n} of {i}\n" for n in range(12)),
             "check_log": f"/p/.overstory/logs/b/loop/check-{i}-1-0.txt"} for i in range(1, 10)]
    rows.append({"status": "done", "number": 10, "attempt": 1, "check_exit": 0, "fingerprint": None,
                 "check_tail": "$ make test\nok", "check_log": "/p/x"})
    lines = failure_lines(rows, Path("/p"))
    assert lines[0] == ("(and 2 earlier failed check(s) of other kinds: iterations 3, 4; "
                        "`ov loop status NAME --json` has them all)")
    headers = [line for line in lines[1:] if not line.startswith("  | ")]
    assert headers == [f"iteration {i}: `make test` exit 1; whole output: .overstory/logs/b/loop/check-{i}-1-0.txt"
                       for i in (5, 6, 7)] + [
        f"iterations {a}, {b}: `make test` exit 1; whole output: .overstory/logs/b/loop/check-{b}-1-0.txt"
        for a, b in ((1, 8), (2, 9))]
    assert lines[-8:] == [f"  | line {n} of 9" for n in range(4, 12)], "the last 8 lines of the newest"
