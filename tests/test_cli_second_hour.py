"""Issue 32's command-line items, through `ov`'s own entry point: "did you mean", JSON errors, the
`ov status`/`ov tree` filters, `ov wait`'s code for a stopped agent, what counts as pending mail,
and the budget limits `ov init` writes.

Most rows are written straight into a real state.db and the commands run in-process through
``cli.fast.main`` (what the `ov` script runs); the stopped-agent case runs a real scripted agent.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import typing as t
from pathlib import Path

import click
import pytest
import yaml

from agent_helpers import agent_state, wait_for, write_scenario
from conftest import make_repo
from overstory.cli import fast
from overstory.config.model import load_config
from overstory.paths import ProjectPaths
from overstory.store import budgets, lifecycle, mail, runs, sessions
from overstory.views.waiting import EXIT_APPROVAL, EXIT_OK, EXIT_STOPPED, EXIT_ZOMBIE, code_of, outcome_code


def ov(project: ProjectPaths | None, *args: str, code: int | None = None) -> tuple[int, str, str]:
    """`ov ARGS` in-process through the `ov` script's entry point: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    prefix = ["--project", str(project.root)] if project is not None else []
    got = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            fast.main([*prefix, *args])
        except SystemExit as exit_:
            got = exit_.code or 0
    if code is not None:
        assert got == code, (args, got, out.getvalue(), err.getvalue())
    return got, out.getvalue(), err.getvalue()


def add_agent(conn: t.Any, name: str, capability: str = "builder", *, parent: str = "operator",
              state: str = "between_turns", run_id: str | None = None, reason: str | None = None) -> sessions.Session:
    depth = 0 if parent == "operator" else 1 + (sessions.get(conn, parent).depth)  # type: ignore[union-attr]
    generation = sessions.create_session(conn, name=name, capability=capability, task_id=f"t-{name}",
                                         runtime="scripted", actor="test", parent=parent, depth=depth, run_id=run_id)
    created = sessions.get(conn, name)
    assert created is not None
    if state == "zombie":
        assert lifecycle.declare_zombie(conn, created, "test", actor="test").ok
    elif state == "parked":
        lifecycle.park(conn, created, "budget", "budget: x", actor="test", escalate=False)
    elif state != "booting":
        assert sessions.transition(conn, name, generation, state, actor="test", reason=reason).ok
    found = sessions.get(conn, name)
    assert found is not None
    return found


@pytest.fixture
def team(project: ProjectPaths, state_db: t.Any) -> tuple[ProjectPaths, str]:
    """lead-1 with builder-greet (in a turn), builder-green (completed) and a parked builder; a zombie scout
    under the operator; a reviewer of a run. Returns the project and the run's id."""
    run, _ = runs.open_or_join(state_db, "coordinator")
    add_agent(state_db, "lead-1", "lead")
    add_agent(state_db, "builder-greet", parent="lead-1", state="in_turn")
    add_agent(state_db, "builder-green", parent="lead-1", state="completed", reason="terminal mail sent")
    add_agent(state_db, "builder-stuck", parent="lead-1", state="parked")
    add_agent(state_db, "scout-x", "scout", state="zombie")
    add_agent(state_db, "reviewer-r", "reviewer", run_id=run.id)
    return project, run.id


# ---- 1. did you mean ------------------------------------------------------------------------------


def test_a_mistyped_command_names_the_closest_ones(project: ProjectPaths) -> None:
    _, _, err = ov(project, "stauts", code=2)
    assert "No such command 'stauts'. Did you mean 'status'?" in err
    assert "Did you mean 'send'?" in ov(project, "mail", "sedn", code=2)[2]
    assert "Did you mean 'start'" in ov(project, "coordinator", "strat", code=2)[2]
    assert "Did you mean 'list'?" in ov(project, "run", "lst", code=2)[2]
    far = ov(project, "xyzzy", code=2)[2]
    assert "No such command 'xyzzy'." in far and "Did you mean" not in far
    assert "guard" not in ov(project, "gaurd", code=2)[2], "a hidden command is not offered"


def test_an_unknown_agent_name_names_the_closest_agents(team: tuple[ProjectPaths, str]) -> None:
    project, _ = team
    one = "(did you mean 'builder-greet'?)"
    for args in (["diff", "greet"], ["wait", "greet"], ["stop", "gret"], ["trace", "greet"], ["budget", "greet"],
                 ["logs", "greet"], ["resume", "greet"], ["merge", "greet"]):
        code, _, err = ov(project, *args)
        assert code == 1 and f"no agent named '{args[1]}' {one}" in err, (args, err)
    assert "(did you mean 'builder-green' or 'builder-greet'?)" in ov(project, "wait", "builder-gren", code=1)[2]
    for args in (["mail", "send", "--to", "lead", "--subject", "s"], ["nudge", "lead"]):
        assert "no agent named 'lead' (did you mean 'lead-1'?)" in ov(project, *args, code=1)[2], args
    assert "did you mean" not in ov(project, "diff", "zzz", code=1)[2]


# ---- 2. errors as JSON -------------------------------------------------------------------------------


def _json_commands() -> list[tuple[str, ...]]:
    from overstory.cli.main import COMMANDS, cli

    found = []

    def walk(path: tuple[str, ...], command: click.Command) -> None:
        if any(isinstance(p, click.Option) and "--json" in p.opts for p in command.params):
            found.append(path)
        if isinstance(command, click.Group):
            ctx = click.Context(command, info_name=path[-1])
            for name in command.list_commands(ctx):
                walk((*path, name), command.get_command(ctx, name))  # type: ignore[arg-type]

    ctx = click.Context(cli, info_name="ov")
    for name in COMMANDS:
        walk((name,), cli.get_command(ctx, name))  # type: ignore[arg-type]
    return found


def _error_document(err: str) -> dict[str, t.Any]:
    lines = err.splitlines()
    assert len(lines) == 1, err
    document = json.loads(lines[0])
    assert set(document) == {"error"} and set(document["error"]) == {"kind", "message"}, document
    return document["error"]  # type: ignore[no-any-return]


def test_every_command_with_json_reports_a_usage_error_as_json(project: ProjectPaths) -> None:
    paths = _json_commands()
    assert len(paths) > 20 and ("status",) in paths and ("mail", "send") in paths
    for path in paths:
        code, out, err = ov(project, *path, "--no-such-option", "--json")
        text_code, _, text_err = ov(project, *path, "--no-such-option")
        assert (code, out) == (2, "") and text_code == 2 and text_err.startswith("Usage: ov "), (path, err)
        error = _error_document(err)
        assert error == {"kind": "usage_error", "message": text_err.splitlines()[-1].removeprefix("Error: ")}, path
        assert "--no-such-option" in error["message"] or "Missing argument" in error["message"], path


def test_a_command_without_a_json_form_still_answers_json_with_json(project: ProjectPaths) -> None:
    """`--json` on a command that has no JSON output (ov diff, ov watch, ov schedule remove, ...) is a usage
    error, and it too comes as JSON: a script that always passes --json never has to parse text."""
    from overstory.cli.main import COMMANDS, cli

    ctx = click.Context(cli, info_name="ov")
    leaves = []
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        if isinstance(command, click.Group):
            sub = click.Context(command, info_name=name)
            leaves += [(name, n) for n in command.list_commands(sub)]
        elif command is not None and not command.hidden:
            leaves.append((name,))
    with_json = set(_json_commands())
    without = [path for path in leaves if path not in with_json]
    assert ("diff",) in without and ("schedule", "remove") in without and ("watch",) in without
    for path in without:
        code, out, err = ov(project, *path, "--json")
        assert (code, out) == (2, ""), (path, code, out, err)
        assert _error_document(err)["kind"] == "usage_error", (path, err)


@pytest.mark.parametrize("args, kind, code", [
    (["wait", "nobody"], "agent_not_found", 1),
    (["wait"], "usage_error", 2),
    (["status", "--state", "bogus"], "usage_error", 2),
    (["status", "--parent", "nobody"], "agent_not_found", 1),
    (["tree", "--capability", "wizard"], "usage_error", 2),
    (["run", "show", "no-such-run"], "run_not_found", 1),
    (["mail", "send", "--to", "nobody", "--subject", "s"], "mail_error", 1),
    (["mail", "send", "--subject", "s", "--payload", "{nope"], "usage_error", 2),
    (["stauts"], "usage_error", 2),
])
def test_errors_after_parsing_are_json_with_the_same_exit_code(project: ProjectPaths, args: list[str], kind: str,
                                                               code: int) -> None:
    text_code, _, text_err = ov(project, *args)
    got, out, err = ov(project, *args, "--json")
    assert (got, out) == (text_code, "") and got == code
    error = _error_document(err)
    assert error["kind"] == kind
    first = text_err.splitlines()[-1].removeprefix("ov: error: ").removeprefix("Error: ")
    assert error["message"] == first, "the message is the text form's"


def test_json_after_a_double_dash_is_an_argument(project: ProjectPaths) -> None:
    """`--json` after `--` is no request for JSON (nothing after `--` is an option)."""
    _, _, err = ov(project, "wait", "--", "--json", code=1)
    assert err == "ov: error: no agent named '--json'; `ov status --all` lists them\n"


# ---- 3. filters of ov status and ov tree -------------------------------------------------------------


def test_status_filters_select_agents_and_everything_about_them(team: tuple[ProjectPaths, str],
                                                                state_db: t.Any) -> None:
    project, run_id = team
    mail.send(state_db, sender="operator", to="builder-greet", subject="for greet")
    mail.send(state_db, sender="operator", to="lead-1", subject="for lead")

    def names(*args: str) -> list[str]:
        document = json.loads(ov(project, "status", *args, "--json", code=0)[1])
        return sorted(a["name"] for a in document["agents"])

    assert names("--capability", "builder") == ["builder-greet", "builder-stuck"], "completed hidden without --all"
    assert names("--capability", "builder", "--all") == ["builder-green", "builder-greet", "builder-stuck"]
    assert names("--state", "parked,zombie") == ["builder-stuck", "scout-x"]
    assert names("--state", "completed") == ["builder-green"], "--state completed shows them without --all"
    assert names("--parent", "lead-1", "--state", "in_turn") == ["builder-greet"]
    assert names("--parent", "operator") == ["lead-1", "reviewer-r", "scout-x"]
    assert names("--run", run_id[:10]) == ["reviewer-r"]
    assert names("--capability", "reviewer,scout", "--state", "zombie") == ["scout-x"]
    document = json.loads(ov(project, "status", "--parent", "lead-1", "--json", code=0)[1])
    assert document["mail"] == {"pending": 1, "by_agent": {"builder-greet": 1}}
    assert document["totals"]["agents"] == 3 and document["totals"]["by_state"] == {
        "completed": 1, "in_turn": 1, "parked": 1}
    only_run = json.loads(ov(project, "status", "--run", run_id, "--json", code=0)[1])
    assert [r["id"] for r in only_run["runs"]] == [run_id]
    text = ov(project, "status", "--capability", "merger", code=0)[1]
    assert text.startswith("no agents match")


def test_an_agents_status_filters_go_through_its_endpoint(team: tuple[ProjectPaths, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a sandboxed turn `ov status` asks the agent's endpoint: the filters travel with the request."""
    from overstory.endpoint.routes import ROUTES
    from overstory.endpoint.server import AgentEndpoint

    project, _ = team
    endpoint = AgentEndpoint(project, "builder-greet", 1, ROUTES).start()
    try:
        env = endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": "t-filter", "OVERSTORY_ATTEMPT": "0"})
        for name, value in {**env, "OVERSTORY_AGENT_NAME": "builder-greet", "OVERSTORY_GENERATION": "1",
                            "OVERSTORY_PROJECT_ROOT": str(project.root)}.items():
            monkeypatch.setenv(name, value)
        document = json.loads(ov(None, "status", "--parent", "lead-1", "--state", "parked", "--json", code=0)[1])
        assert [a["name"] for a in document["agents"]] == ["builder-stuck"]
        assert "(did you mean 'lead-1'?)" in ov(None, "status", "--parent", "leed-1", code=1)[2]
        assert "unknown state 'asleep'" in ov(None, "status", "--state", "asleep", code=2)[2]
    finally:
        endpoint.close()


def test_status_and_tree_refuse_an_unknown_state_or_capability_in_one_line(team: tuple[ProjectPaths, str]) -> None:
    project, _ = team
    for command in ("status", "tree"):
        _, out, err = ov(project, command, "--state", "parked,sleeping", code=2)
        assert out == "" and err == ("ov: error: --state: unknown state 'sleeping'; choose from booting, in_turn, "
                                     "between_turns, working, stalled, parked, completed, zombie\n")
        _, _, err = ov(project, command, "--capability", "wizard", code=2)
        assert err.count("\n") == 1 and "unknown capability 'wizard'; choose from coordinator, lead, scout," in err
        assert "(did you mean 'lead-1'?)" in ov(project, command, "--parent", "leed-1", code=1)[2]
        assert "no run 'nope'" in ov(project, command, "--run", "nope", code=1)[2]


def test_tree_filters_keep_the_agents_above_the_matches(team: tuple[ProjectPaths, str]) -> None:
    project, run_id = team
    assert ov(project, "tree", "--state", "parked", code=0)[1].splitlines() == [
        "operator", "└── lead-1  lead · between_turns · 0 turns",
        "    └── builder-stuck  builder · parked · 0 turns"]
    below = json.loads(ov(project, "tree", "--parent", "lead-1", "--json", code=0)[1])
    assert below["name"] == "lead-1"
    assert sorted(c["name"] for c in below["children"]) == ["builder-green", "builder-greet", "builder-stuck"]
    none = ov(project, "tree", "--parent", "lead-1", "--capability", "scout", code=0)[1]
    assert none == "lead-1\n(no agents match)\n"
    only_run = json.loads(ov(project, "tree", "--run", run_id, "--json", code=0)[1])
    assert [c["name"] for c in only_run["children"]] == ["reviewer-r"]
    zombies = ov(project, "tree", "--capability", "scout", "--state", "zombie", code=0)[1]
    assert zombies.splitlines()[1].startswith("└── scout-x  scout · zombie")


# ---- 4. ov wait: stopped before finishing -----------------------------------------------------------


def test_wait_says_an_agent_stopped_before_finishing_with_its_own_code(project: ProjectPaths, tmp_path: Path) -> None:
    """A real scripted agent, stopped by the operator in its first turn (0 turns finished): not exit 0."""
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.store.db import open_state

    scenario = write_scenario(tmp_path / "slow.json", [{"actions": [{"text": "thinking"}, {"sleep": 60}]}])
    conn = open_state(project.state_db)
    try:
        sling(project, load_config(project.config_file, project.local_config_file, environ=os.environ), conn,
              SlingRequest(capability="builder", task_id="slow", runtime="scripted", scenario=scenario), os.environ)
    finally:
        conn.close()
    wait_for(lambda: (a := agent_state(project, "builder-slow")) and a.state == "in_turn", 60, message="its turn")
    assert ov(project, "stop", "builder-slow", code=0)
    code, out, _ = ov(project, "wait", "builder-slow", "--timeout", "10")
    assert code == EXIT_STOPPED == 8
    assert out == "builder-slow: completed: stopped by the operator\n"
    assert agent_state(project, "builder-slow").turns == 0  # type: ignore[union-attr]
    document = json.loads(ov(project, "wait", "builder-slow", "--json")[1])
    assert document["exit_code"] == 8 and document["agents"][0]["exit_code"] == 8


def test_the_stop_code_ranks_below_every_other_problem(project: ProjectPaths, state_db: t.Any) -> None:
    done = add_agent(state_db, "done", state="completed", reason="terminal mail sent")
    stopped = add_agent(state_db, "stopped", state="completed", reason="stopped by the operator")
    by_parent = add_agent(state_db, "by-parent", state="completed", reason="stopped by lead-1 (--force)")
    coordinator = add_agent(state_db, "coordinator", "coordinator", state="completed",
                            reason="stopped by the operator")
    dead = add_agent(state_db, "dead", state="zombie")
    waiting = add_agent(state_db, "waiting")
    lifecycle.park(state_db, waiting, "approval", "approval apr-1", actor="test", escalate=False)
    waiting = sessions.get(state_db, "waiting")  # type: ignore[assignment]
    assert [code_of(a) for a in (done, stopped, by_parent, coordinator)] == [EXIT_OK, 8, 8, EXIT_OK]
    assert outcome_code([done, stopped]) == EXIT_STOPPED
    assert outcome_code([stopped, dead]) == EXIT_ZOMBIE and outcome_code([waiting, stopped, dead]) == EXIT_APPROVAL
    assert outcome_code([done, coordinator]) == EXIT_OK


def test_the_documented_exit_codes_are_the_codes_ov_wait_uses() -> None:
    """The README's table is the contract: one row per code the code knows, 8 for a stop, 9 for an error park;
    and every `ov wait` exit code a docs page names for a park kind is the one ov wait gives it."""
    import re

    from conftest import REPO_ROOT
    from overstory.views import waiting

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("### Exit codes of the commands that wait", 1)[1].split("\n\n", 2)[2]
    rows = dict(re.findall(r"^\| (\d+) \| (.+) \|$", table.split("\n\n", 1)[0], flags=re.M))
    codes = {value for name, value in vars(waiting).items() if name.startswith("EXIT_")}
    assert {int(code) for code in rows} == codes
    assert "stopped before it finished" in rows[str(EXIT_STOPPED)]
    assert "runtime error" in rows[str(waiting.EXIT_ERROR_PARKED)]
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (REPO_ROOT / "docs").glob("*.md"))
    for kind, code in re.findall(r"`parked:(\w+)`, `ov wait` exits? (\d+)", " ".join(pages.split())):
        assert int(code) == waiting.PARK_EXIT[kind], (kind, code)


# ---- 5. pending mail ---------------------------------------------------------------------------------


def test_pending_mail_leaves_out_the_operators_own_reports_and_mail_nobody_will_read(
        project: ProjectPaths, state_db: t.Any) -> None:
    from overstory.merge.announce import announce

    ending = add_agent(state_db, "builder-done", state="between_turns")
    mail.send(state_db, sender="operator", to="builder-done", subject="one more thing")  # never read: it ends
    assert sessions.transition(state_db, "builder-done", ending.generation, "completed", actor="test").ok
    gone = add_agent(state_db, "builder-gone", state="completed", reason="terminal mail sent")
    assert announce(state_db, project.root, gone, merged=True, branch="ov/builder-gone", target="main",
                    source_commit="abc123", reason="clean merge", tier=1, commit="def456")  # `ov merge`'s report
    mail.send(state_db, sender="builder-gone", to="operator", subject="a question", type="question")
    document = json.loads(ov(project, "status", "--json", code=0)[1])
    assert document["mail"] == {"pending": 1, "by_agent": {"operator": 1}}
    assert "mail: 1 pending (operator 1)" in ov(project, "status", code=0)[1]
    unread = [m.subject for m in mail.unread(state_db, "operator", peek=True)]
    assert any(s.startswith("merged ov/builder-gone") for s in unread), "the report is still mail: not counted"


# ---- 6. ov init writes budget limits -------------------------------------------------------------------


def test_init_writes_prints_and_applies_default_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.agents.budgeting import agent_limits
    from overstory.store.db import open_state

    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    _, out, _ = ov(None, "init", code=0)
    assert ("  budgets: each agent $5.00, 50 turns, 4h of wall clock; each run $25.00, 300 turns, 8h of wall clock"
            in out.splitlines())
    project = ProjectPaths(repo)
    config = load_config(project.config_file, None, environ={})
    assert config.budgets.agent.model_dump() == {"max_usd": 5, "max_turns": 50, "max_tool_calls": None,
                                                 "max_wallclock": 4 * 3600}
    assert config.budgets.run.model_dump() == {"max_usd": 25, "max_turns": 300, "max_tool_calls": None,
                                               "max_wallclock": 8 * 3600}
    conn = open_state(project.state_db)
    try:
        assert agent_limits(conn, config, None, None)[0]["max_usd"] == 5
        run, _ = runs.open_or_join(conn, "coordinator")
        budgets.ensure_run(conn, run.id, started_at=run.started_at, limits=config.budgets.run.model_dump())
        # A run's coordinator lives as long as the run: the run's limits, not one task agent's.
        coordinator, _ = agent_limits(conn, config, run.id, None, capability="coordinator")
        assert coordinator["max_usd"] == 25 and coordinator["max_turns"] == 300
        assert agent_limits(conn, config, run.id, None, capability="builder")[0]["max_usd"] == 5
    finally:
        conn.close()
    # A budgets section that names one key keeps the other defaults; null is no limit.
    project.config_file.write_text("budgets:\n  agent:\n    max_usd: 2\n    max_turns: null\n")
    partial = load_config(project.config_file, None, environ={}).budgets
    assert (partial.agent.max_usd, partial.agent.max_turns, partial.agent.max_wallclock) == (2, None, 4 * 3600)
    assert partial.run.max_usd == 25


def test_init_no_limits_writes_them_as_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    _, out, _ = ov(None, "init", "--no-limits", code=0)
    assert "  budgets: each agent no limits; each run no limits" in out.splitlines()
    text = (repo / ".overstory" / "config.yaml").read_text()
    assert "`ov init --no-limits`: you chose no limits" in text
    written = yaml.safe_load(text)["budgets"]
    assert written == {scope: dict.fromkeys(("max_usd", "max_turns", "max_tool_calls", "max_wallclock"))
                       for scope in ("agent", "run")}
    document = json.loads(ov(None, "init", "--force", "--json", code=0)[1])
    assert document["budgets"]["agent"]["max_usd"] == 5, "--force without --no-limits writes the defaults again"
