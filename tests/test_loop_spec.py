"""Pure parts of `ov loop`: the spec, gates, limits, failure fingerprints, the message, the phase allow-list."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from overstory import guards
from overstory.agents.iterations.checks import LoopChecker, fingerprint, progress_summary
from overstory.agents.iterations.prompt import iteration_message
from overstory.agents.iterations.spec import build_definition, limit_reached, parse_gate, read_spec
from overstory.errors import LoopError
from overstory.store.loops import Loop


def definition(spec=None, **flags):
    args = {"prompt": None, "until": None, "check": None, "max_iterations": None}
    args.update(flags)
    return build_definition(spec, default_max_iterations=20, **args)


def make_loop(spec=None, **fields):
    values = dict(name="builder-t1", generation=1, definition=definition(spec, prompt="do it"), status="running",
                  iterations=0, max_iterations=5, phase_index=0, phase_round=0, phase_started=0,
                  extra_phase_iterations=0, extra_phase_usd=0.0, same_failures=0, last_fingerprint=None,
                  last_check_exit=None, last_check_tail=None, critic_agent=None, critic_since=None, critic_notes=None,
                  created_at=0, updated_at=0)
    values.update(fields)
    return Loop(**values)


@pytest.mark.parametrize("text, expected", [
    ("files: src/*.py >= 3", {"kind": "files", "glob": "src/*.py", "min": 3}),
    ("files:docs/**/*.md>=1", {"kind": "files", "glob": "docs/**/*.md", "min": 1}),
    ("python -m pytest -q", {"kind": "command", "command": "python -m pytest -q"}),
    ({"files": "a/*", "min": 2}, {"kind": "files", "glob": "a/*", "min": 2}),
    ({"command": "make test"}, {"kind": "command", "command": "make test"}),
])
def test_gates(text, expected):
    assert parse_gate(text, "gate") == expected


@pytest.mark.parametrize("bad, message", [
    ("files: src/*.py > 3", "files: <glob> >= N"),
    ("files: ../x/* >= 1", "inside the worktree"),
    ({"min": 1}, "needs `files`"),
    ("files: a >= -1", "files: <glob> >= N"),
])
def test_bad_gates_are_refused_with_the_form_to_use(bad, message):
    with pytest.raises(LoopError, match="gate") as caught:
        parse_gate(bad, "gate")
    assert message in str(caught.value)


def test_a_loop_without_phases_is_one_phase_gated_by_its_check():
    loop = definition(None, prompt="make it pass", check="pytest -q", max_iterations=7)
    assert loop["until"] == "LOOP_DONE" and loop["max_iterations"] == 7 and not loop["phased"]
    assert loop["phases"] == [{"name": "main", "objective": "make it pass", "max_iterations": None, "max_usd": None,
                               "tools": None, "gate": {"kind": "command", "command": "pytest -q"}}]
    assert loop["final_check"] is None


def test_a_spec_with_phases_keeps_the_check_for_the_end_and_flags_win():
    spec = read_spec("objective: o\nconstraints: keep the API\nuntil: FINI\ncheck: make test\nmax_iterations: 9\n"
                     "critic: reviewer\nphases:\n  - {name: a, objective: A, gate: 'files: *.md >= 1', tools: [Read]}\n"
                     "  - {name: b, objective: B, gate: make b, max_iterations: 2, max_usd: 1.5}\n", "spec")
    loop = definition(spec, until="DONE!", max_iterations=4)
    assert loop["until"] == "DONE!" and loop["max_iterations"] == 4 and loop["phased"]
    assert loop["constraints"] == ["keep the API"] and loop["critic"]["capability"] == "reviewer"
    assert [p["name"] for p in loop["phases"]] == ["a", "b"] and loop["phases"][0]["tools"] == ["Read"]
    assert loop["phases"][1]["max_usd"] == 1.5 and loop["final_check"] == {"kind": "command", "command": "make test"}


def test_a_plain_text_spec_is_the_objective():
    assert read_spec("Make every test pass.\nDo not skip any.\n", "spec") == {
        "objective": "Make every test pass.\nDo not skip any."}


@pytest.mark.parametrize("spec, message", [
    ({"phases": []}, "a loop needs an objective"),
    ({"objective": "o", "phases": [{"name": "a", "objective": "x"}, {"name": "a", "objective": "y"}]}, "two phases"),
    ({"objective": "o", "phases": [{"name": "a"}]}, "phases[0].objective"),
    ({"objective": "o", "phases": [{"name": "a", "objective": "x", "tools": "Read"}]}, "list of tool names"),
    ({"objective": "o", "phases": [{"name": "a", "objective": "x", "color": 1}]}, "unknown key"),
    ({"objective": "o", "critic": "builder"}, "read-only"),
    ({"objective": "o", "max_iterations": 0}, "whole number >= 1"),
])
def test_bad_specs_are_refused_in_one_line(spec, message):
    with pytest.raises(LoopError) as caught:
        definition(spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_spec_keys_are_named():
    with pytest.raises(LoopError, match="unknown key.*obiective"):
        read_spec("obiective: typo\n", "spec")


def test_limits():
    loop = make_loop({"objective": "o", "phases": [{"name": "p", "objective": "x", "max_iterations": 2,
                                                    "max_usd": 1.0}]})
    assert limit_reached(loop, 1, 0, 0.0) is None
    assert "max_iterations 5 reached" in limit_reached(loop, 6, 0, 0.0)
    assert "phase 'p' reached its max_iterations 2" in limit_reached(loop, 3, 2, 0.0)
    assert "phase 'p' spent its max_usd 1.00" in limit_reached(loop, 3, 1, 1.2)
    more = make_loop(loop.definition, extra_phase_iterations=1, extra_phase_usd=1.0)
    assert limit_reached(more, 3, 2, 1.2) is None


def test_a_failure_fingerprint_ignores_times_and_addresses_but_not_the_failure():
    one = "FAILED test_x.py::test_a - AssertionError at 0x7f3a2b1c in 0.12s (12:01:02)\n1 failed in 0.31s"
    two = "FAILED test_x.py::test_a - AssertionError at 0x7f99aa00 in 3.5s (13:44:10)\n1 failed in 1.02s"
    other = "FAILED test_x.py::test_b - AssertionError at 0x7f3a2b1c in 0.12s\n1 failed in 0.31s"
    assert fingerprint(1, one) == fingerprint(1, two)
    assert fingerprint(1, one) != fingerprint(1, other)
    assert fingerprint(1, one) != fingerprint(2, one)


def test_protected_paths_come_from_the_config_and_the_spec_and_stay_inside_the_repository():
    made = definition({"objective": "x", "protected_paths": ["tests/", "conftest.py"], "allow_protected": "tests/new.py"},
                      protected=["conftest.py"], allow_protected=("pyproject.toml",))
    assert made["protected_paths"] == ["conftest.py", "tests/"]
    assert made["allow_protected"] == ["tests/new.py", "pyproject.toml"]
    assert definition(prompt="x")["protected_paths"] == [] and definition(prompt="x")["allow_protected"] == []
    for bad in (["/etc/passwd"], ["../up"], [":(top)x"], [""], [3], "tests/../.."):
        with pytest.raises(LoopError, match="protected_paths"):
            definition({"objective": "x", "protected_paths": bad})
    with pytest.raises(LoopError, match="--allow-protected"):
        definition(prompt="x", allow_protected=("../x",))


def root_checker(project, env=None):
    """A LoopChecker of an agent at the project root (no branch): it checks the root's last commit."""
    from types import SimpleNamespace

    from test_watchdog import load

    agent = SimpleNamespace(name="builder-x", branch=None, base_branch=None, spec={}, worktree=None,
                            capability="builder", runtime="scripted")
    return LoopChecker(project, load(project), agent, {}, env=env or {"PATH": "/usr/bin:/bin"})


def test_gates_run_over_the_last_commit(project):
    from conftest import run_git

    (project.root / "src").mkdir()
    (project.root / "src" / "a.py").write_text("")
    run_git(project.root, "add", "src")
    run_git(project.root, "commit", "-q", "-m", "a")
    (project.root / "src" / "b.py").write_text("")  # not committed: not checked
    gate = {"kind": "files", "glob": "src/*.py", "min": 2}
    with root_checker(project) as checker:
        files = checker.run(gate)
    assert not files.passed and files.fingerprint and "1 file(s) match `src/*.py`" in files.tail
    run_git(project.root, "add", "src")
    run_git(project.root, "commit", "-q", "-m", "b")
    with root_checker(project, {"PATH": "/usr/bin:/bin", "OVERSTORY_AGENT_NAME": "builder-x"}) as checker:
        assert checker.run(gate).passed
        ran = checker.run({"kind": "command", "command": "ls src; echo OVERSTORY=$OVERSTORY_AGENT_NAME; exit 3"})
        tree = checker.tree
    assert ran.exit_code == 3 and "a.py" in ran.tail and "OVERSTORY=\n" in ran.tail, "ov's check is not the agent's"
    assert tree is not None and not tree.exists(), "the checkout goes with the checker"


def test_a_check_runs_in_the_projects_own_virtual_environment(project):
    from conftest import run_git

    fake = project.root / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho the project python\n")
    fake.chmod(0o755)
    run_git(project.root, "commit", "-q", "--allow-empty", "-m", "x")
    with root_checker(project, {"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": "/somewhere/ov/venv"}) as checker:
        ran = checker.run({"kind": "command", "command": "python; echo VENV=$VIRTUAL_ENV"})
    assert ran.passed and "the project python" in ran.tail and f"VENV={project.root.resolve() / '.venv'}" in ran.tail


def test_a_hung_check_is_stopped_whole(project):
    from test_watchdog import write_local_config

    write_local_config(project, loop={"check_timeout": 1})
    started = time.monotonic()
    with root_checker(project) as checker:
        hung = checker.run({"kind": "command", "command": "sleep 30 & sleep 30; echo never"})
    assert hung.exit_code == 124 and "stopped after 1s" in hung.tail and time.monotonic() - started < 20
    assert subprocess.run(["pgrep", "-f", "sleep 30 & sleep 30"], capture_output=True).stdout == b""


def test_the_progress_summary_is_its_first_line():
    assert progress_summary("\n# Tests: 40/42 green\n\n- done: parser\n") == "Tests: 40/42 green"
    assert progress_summary(None) is None and progress_summary("\n\n") is None


def test_the_message_carries_everything_a_fresh_session_needs():
    loop = make_loop({"objective": "Migrate to v2.", "constraints": ["no new deps"],
                      "phases": [{"name": "scan", "objective": "List call sites.", "gate": "files: notes/*.md >= 1",
                                  "tools": ["Read", "Grep"]},
                                 {"name": "port", "objective": "Port them.", "gate": "make test"}]},
                     phase_index=1, phase_round=1, iterations=3, last_check_exit=2, last_check_tail="$ make test\nE boom",
                     critic_notes="port the CLI too")
    text = iteration_message(loop, number=4, attempt=2, progress="# 3 of 5 ported\n",
                             finished=[{"phase": "scan", "progress": "12 call sites", "commit_sha": "a" * 40}],
                             mail_text="=== BEGIN MESSAGE #9 ===")
    for piece in ("Iteration 4 of at most 5 (attempt 2", "Migrate to v2.", "- no new deps",
                  "Phase 2 of 2: port (run 2", "`make test` exits 0", "- scan: 12 call sites (checkpoint aaaaaaaaaaaa)",
                  "port the CLI too", "# 3 of 5 ported", "## Last check (exit 2)", "E boom", "MESSAGE #9",
                  "end your last message with LOOP_DONE", "Do not send worker_done"):
        assert piece in text, piece


def test_the_guard_refuses_tools_outside_the_phase_allow_list(tmp_path):
    env = {"OVERSTORY_AGENT_NAME": "builder-t1", "OVERSTORY_CAPABILITY": "builder",
           "OVERSTORY_WORKTREE": str(tmp_path), "OVERSTORY_LOOP_PHASE": "scan", "OVERSTORY_PHASE_TOOLS": "Read,Grep"}
    read = guards.decide({"tool_name": "Read", "tool_input": {"file_path": str(tmp_path / "a")}}, env)
    write = guards.decide({"tool_name": "Write", "tool_input": {"file_path": str(tmp_path / "a"), "content": ""}}, env)
    bash = guards.decide({"tool_name": "Bash", "tool_input": {"command": "ls"}}, env)
    assert read.allow and not write.allow and not bash.allow
    assert "Write is not allowed in phase 'scan'" in write.reason and "Read, Grep" in write.reason
    assert not guards.decide({"tool_name": "Read", "tool_input": {}}, {**env, "OVERSTORY_PHASE_TOOLS": ""}).allow
    without = {k: v for k, v in env.items() if k != "OVERSTORY_PHASE_TOOLS"}
    assert guards.decide({"tool_name": "Bash", "tool_input": {"command": "ls"}}, without).allow
    gemini = {"hook_event_name": "BeforeTool", "tool_name": "run_shell_command", "tool_input": {"command": "ls"}}
    out, _err, _code = guards.guard_reply(json.dumps(gemini), env)
    assert "deny" in out and "Bash is not allowed" in out, "other CLIs' tools are judged by Claude's names"


def test_the_scripted_runtime_plays_one_script_per_iteration(tmp_path):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps({"turns": [{"result": "mail turn"}],
                                    "iterations": [{"result": "first"}, {"result": "second"}]}))
    code = ("import sys; from pathlib import Path; from overstory.runtimes.scripted.player import load_scenario; "
            "print(load_scenario(Path(sys.argv[1])))")

    def played(iteration):
        env = {"PATH": "/usr/bin:/bin", **({"OVERSTORY_LOOP_ITERATION": iteration} if iteration else {})}
        return subprocess.run([sys.executable, "-c", code, str(scenario)], env=env, capture_output=True,
                              text=True).stdout.strip()

    assert played("") == "[{'result': 'mail turn'}]"
    assert played("2") == "[{'result': 'second'}]"
    assert played("3") == "[]"


@pytest.mark.parametrize("command, allowed", [
    ("ov loop status builder-x --json", True),
    ("ov loop builder t2 --prompt 'fix it' --check 'pytest -q' --max-iterations 5", True),  # `ov loop` checks who
    ("ov schedule add n --cron '0 2 * * *' -- sling builder x", False),
    ("ov schedule list", False),
])
def test_agents_may_read_loops_but_only_the_operator_schedules(tmp_path, command, allowed):
    env = {"OVERSTORY_AGENT_NAME": "lead-1", "OVERSTORY_CAPABILITY": "lead", "OVERSTORY_WORKTREE": str(tmp_path)}
    decision = guards.decide({"tool_name": "Bash", "tool_input": {"command": command}}, env)
    assert decision.allow is allowed, decision.reason
    if not allowed:
        assert "only the operator runs it" in decision.reason
