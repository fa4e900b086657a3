"""A shim started ahead of its turn (``LocalExecutor.prepare``, issue 34): the same turn as a cold one, and
nothing left behind on any way it can go unused.

The ways a prepared shim's spec never comes: the executor discards it (the turn's plan or sandbox failed),
or the process that holds its pipe dies (an agent loop killed inside a turn step). Either way the shim reads
the end of its pipe and exits having started nothing and written nothing. Real processes; the loop tests run a
real agent loop with ``OV_TEST_KILL_AT=turn:<step>`` and see its shims through a ``sitecustomize`` that notes
every shim's pid as it starts (nothing in ov knows about it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import typing as t
from pathlib import Path

import pytest

from executor_cases import read_all, wait_until
from overstory import procs
from overstory.agents import turn_exec
from overstory.executors.base import TurnSpec
from overstory.executors.local import LocalExecutor
from overstory.paths import ProjectPaths
from overstory.store import sessions

# As test_executors_local's popen test: session and group, cwd, environment, signals, open fds, a pipeline.
POPEN_SCRIPT = ('ps -o sid=,pgid= -p $$; pwd; echo "[$ONLY]" "[${HOME:-none}]"; grep SigIgn /proc/self/status; '
                'ls /proc/self/fd | sort -n | tr "\\n" " "; echo; yes | head -1; cat; echo oops >&2; exit 3')


@pytest.fixture
def executor(tmp_path: Path) -> t.Iterator[LocalExecutor]:
    made = LocalExecutor(tmp_path / "turns")
    yield made
    made.discard_prepared()
    for folder in made.root.iterdir():  # nothing a test started outlives it
        procs.kill_turn(None, None, folder.name, force=True)


def _prepared_pid(executor: LocalExecutor) -> int:
    assert executor._prepared is not None
    return executor._prepared.process.pid


def _run(executor: LocalExecutor, turn_id: str, cwd: Path) -> tuple[list[str], t.Any, str]:
    executor.submit(TurnSpec(turn_id, ("sh", "-c", POPEN_SCRIPT), str(cwd), stdin=b"from stdin\n",
                             env={"PATH": os.environ["PATH"], "ONLY": "this"}))
    lines = read_all(executor, turn_id)[0]
    return lines, executor.wait(turn_id, timeout=30), executor.stderr_tail(turn_id)


def test_a_prepared_shim_runs_the_turn_as_a_cold_one_does(executor: LocalExecutor, tmp_path: Path) -> None:
    cold_lines, cold, cold_err = _run(executor, "t-cold", tmp_path)
    executor.prepare()
    warm_pid = _prepared_pid(executor)
    warm_lines, warm, warm_err = _run(executor, "t-warm", tmp_path)
    assert executor._prepared is None  # the submit took it
    assert json.loads((executor.root / "t-warm" / "proc.json").read_text())["shim_pid"] == warm_pid
    for lines, ended in ((cold_lines, cold), (warm_lines, warm)):
        sid, pgid = lines[0].split()
        assert sid == pgid == str(ended.pid)  # a session of its own, led by the command
    assert warm_lines[1:] == cold_lines[1:]
    assert warm_lines[1:] == [str(tmp_path), "[this] [none]", cold_lines[3], "0 1 2 3 ", "y", "from stdin"]
    assert (warm.state, warm.exit_code, warm_err) == (cold.state, cold.exit_code, cold_err) == ("finished", 3, "oops\n")
    assert sorted(p.name for p in (executor.root / "t-warm").iterdir()) == \
        sorted(p.name for p in (executor.root / "t-cold").iterdir())


def test_a_discarded_shim_exits_by_itself_having_started_nothing(executor: LocalExecutor) -> None:
    executor.prepare()
    assert executor._prepared is not None
    process = executor._prepared.process
    executor.discard_prepared()
    assert process.returncode == 0  # it read the end of its pipe and returned: not killed
    assert executor._prepared is None
    assert list(executor.root.iterdir()) == []


def test_a_prepared_shim_ends_with_the_process_that_holds_its_pipe(executor: LocalExecutor) -> None:
    """Its submitter killed (as a loop inside a turn step): the pipe ends, the shim exits, nothing is written."""
    code = textwrap.dedent("""
        import os, signal, sys
        from overstory.executors.local import LocalExecutor
        made = LocalExecutor(sys.argv[1], die_with_submitter=True)
        made.prepare()
        print(made._prepared.process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", code, str(executor.root)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL
    shim = int(done.stdout.split()[0])
    wait_until(lambda: not procs.is_alive(shim), 10, "the orphaned prepared shim never exited")
    assert list(executor.root.iterdir()) == []


def test_a_prepared_shim_that_died_waiting_is_replaced_by_a_cold_one(executor: LocalExecutor, tmp_path: Path) -> None:
    executor.prepare()
    dead = _prepared_pid(executor)
    os.kill(dead, signal.SIGKILL)
    wait_until(lambda: not procs.is_alive(dead), 10, "the prepared shim did not die")  # a zombie, not yet reaped
    lines, ended, _ = _run(executor, "t-replaced", tmp_path)
    assert (ended.state, ended.exit_code, lines[-1]) == ("finished", 3, "from stdin")
    assert json.loads((executor.root / "t-replaced" / "proc.json").read_text())["shim_pid"] != dead


def test_a_second_submit_of_a_claimed_turn_leaves_the_prepared_shim_for_its_owner(executor: LocalExecutor,
                                                                                 tmp_path: Path) -> None:
    _run(executor, "t-twice", tmp_path)
    executor.prepare()
    again = executor.submit(TurnSpec("t-twice", ("true",), str(tmp_path)))
    assert again.created is False and executor._prepared is not None
    executor.discard_prepared()


# ---- in an agent's turn ---------------------------------------------------------------------------------


def test_a_turn_whose_plan_fails_ends_its_prepared_shim(project: ProjectPaths, state_db: t.Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.agents.turns import run_turn
    from overstory.config.model import load_config
    from overstory.store.db import open_events

    prepared: list[t.Any] = []
    original = LocalExecutor.prepare

    def noting(self: LocalExecutor) -> None:
        original(self)
        prepared.append((self, self._prepared.process if self._prepared is not None else None))

    monkeypatch.setattr(LocalExecutor, "prepare", noting)
    sessions.create_session(state_db, name="builder-a", capability="builder", task_id="a", runtime="scripted",
                            actor="test", model="gone/x")  # a provider the configuration does not have
    agent = sessions.get(state_db, "builder-a")
    assert agent is not None
    events = open_events(project.events_db)
    try:
        result = run_turn(project, load_config(project.config_file, environ={}), state_db, events, agent, "hi",
                          "turn-1", resume_session_id=None, base_env={})
    finally:
        events.close()
    assert result.status == "permanent" and "provider 'gone'" in result.reason
    [(executor, process)] = prepared
    assert process is not None and process.returncode == 0  # discarded and reaped before run_turn returned
    assert executor._prepared is None and list(executor.root.iterdir()) == []


SHIM_NOTES = """
import os, sys
if "overstory.executors.shim" in sys.orig_argv and os.environ.get("OV_TEST_SHIM_NOTES"):
    with open(os.environ["OV_TEST_SHIM_NOTES"], "a") as notes:
        notes.write(f"{os.getpid()}\\n")
"""


@pytest.mark.parametrize("step", ["logs", "sandbox", "record"])
def test_a_loop_killed_inside_a_turn_leaves_no_shim_and_ran_nothing(project: ProjectPaths, state_db: t.Any,
                                                                    tmp_path: Path, step: str) -> None:
    from overstory.agents.loop import spawn_loop
    from test_watchdog import repeat_turns, row, start_agent, wait_for

    marker = tmp_path / "runtime-ran"
    name = start_agent(project, state_db, "t1", repeat_turns([{"bash": f"touch {marker}"}], count=1), start=False)
    generation = row(state_db, name).generation
    hooks = tmp_path / "site"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SHIM_NOTES, encoding="utf-8")
    notes = tmp_path / "shims"
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, procs.KILL_AT_ENV: f"turn:{step}", "PYTHONPATH": path, "OV_TEST_SHIM_NOTES": str(notes)}
    pid, ticks = spawn_loop(project, name, generation, env)
    sessions.update_fields(state_db, name, generation, loop_pid=pid, loop_start_ticks=ticks)
    wait_for(lambda: not procs.is_alive(pid, ticks), timeout=60, what="the loop to kill itself")
    shims = wait_for(lambda: notes.exists() and [int(p) for p in notes.read_text().split()], timeout=30,
                     what="the loop's prepared shim to start")
    assert len(shims) == 1  # the turn's, waiting for its spec when the loop died
    wait_for(lambda: not any(procs.is_alive(shim) for shim in shims), timeout=10, what="the shim to exit")
    turns = project.run_dir / name / turn_exec.LOCAL_TURNS_DIR
    assert not turns.exists() or list(turns.iterdir()) == []  # no turn was submitted
    assert not marker.exists()  # the runtime never ran


# ---- a shim started before the process knew its turn: a warm loop's (executors.local.start_early) -----------


@pytest.fixture
def early() -> t.Iterator[t.Any]:
    from overstory.executors import local

    yield local
    local.discard_early()


def _early_process(local: t.Any) -> subprocess.Popen[bytes]:
    assert local._early is not None
    return local._early[1].process


def test_the_first_prepare_takes_the_early_shim_and_runs_the_turn(early: t.Any, tmp_path: Path) -> None:
    early.start_early(die_with_submitter=True)
    process = _early_process(early)
    made = LocalExecutor(tmp_path / "turns", die_with_submitter=True)
    made.prepare()
    assert early._early is None and made._prepared is not None and made._prepared.process is process
    lines, ended, _ = _run(made, "t-early", tmp_path)
    assert (ended.state, ended.exit_code, lines[-1]) == ("finished", 3, "from stdin")
    assert json.loads((made.root / "t-early" / "proc.json").read_text())["shim_pid"] == process.pid


def test_an_early_shim_started_another_way_is_ended_and_not_used(early: t.Any, tmp_path: Path) -> None:
    early.start_early(die_with_submitter=True)  # watching this process; this executor's turns outlive it
    process = _early_process(early)
    made = LocalExecutor(tmp_path / "turns", die_with_submitter=False)
    made.prepare()
    assert process.returncode == 0  # read the end of its pipe, reaped
    assert made._prepared is not None and made._prepared.process is not process
    made.discard_prepared()


def test_a_discarded_early_shim_is_gone_and_a_second_start_is_one_shim(early: t.Any) -> None:
    early.start_early(die_with_submitter=True)
    process = _early_process(early)
    early.start_early(die_with_submitter=True)  # at most one waits
    assert _early_process(early) is process
    turn_exec.discard_early_shim()
    assert process.returncode == 0 and early._early is None
    turn_exec.discard_early_shim()  # none: nothing to do


def test_a_warm_loop_that_gets_no_word_leaves_no_shim(project: ProjectPaths, tmp_path: Path) -> None:
    """`ov sling` died before the word: the loop ends by itself, and the shim it started early with it."""
    from agent_helpers import agent_env
    from overstory.agents.warm_loop import WarmLoop

    hooks = tmp_path / "site"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SHIM_NOTES, encoding="utf-8")
    notes = tmp_path / "shims"
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    warm = WarmLoop(project, "builder-e1", {**agent_env(), "PYTHONPATH": path, "OV_TEST_SHIM_NOTES": str(notes)})
    assert warm.proc is not None
    wait_until(lambda: notes.exists() and notes.read_text().strip(), 30, "the warm loop never started its shim")
    [shim] = [int(p) for p in notes.read_text().split()]
    os.close(warm._go)  # as when `ov sling` dies: the pipe's end, without a word
    warm._go = -1
    assert warm.proc.wait(timeout=30) == 0
    wait_until(lambda: not procs.is_alive(shim), 10, "the early shim outlived its loop")


def test_a_slung_agent_runs_its_turns_in_one_shim_each_the_early_one_first(project: ProjectPaths,
                                                                          tmp_path: Path) -> None:
    """The shim a warm loop starts early runs its first turn (no second one is started for it); none is left."""
    from agent_helpers import agent_env, wait_terminal
    from conftest import run_ov

    hooks = tmp_path / "site"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SHIM_NOTES, encoding="utf-8")
    notes = tmp_path / "shims"
    path = os.pathsep.join(filter(None, [str(hooks), os.environ.get("PYTHONPATH")]))
    env = {**agent_env(), "PYTHONPATH": path, "OV_TEST_SHIM_NOTES": str(notes)}
    done = run_ov("sling", "scout", "e2", "--runtime", "scripted", "--prompt", "look", cwd=project.root, env=env)
    assert done.returncode == 0, done.stderr
    agent = wait_terminal(project, "scout-e2")
    assert agent.state == "completed", agent.state_reason
    shims = [int(p) for p in notes.read_text().split()]
    assert agent.turns >= 1 and len(shims) == agent.turns  # one per turn: the first turn's was the early one
    wait_until(lambda: not any(procs.is_alive(shim) for shim in shims), 30, "a shim outlived its turn")
