"""`ov`'s fast entry point (cli.fast): the hot commands without click, with click's behaviour.

Every case below runs twice on the same starting databases: through ``cli.fast.main`` (what
the `ov` script runs) and through ``cli.main.main`` (click alone). Output, error output, exit
code and what the databases hold afterwards must be the same. Each case also says whether the
fast path should take it or hand it to click, so the fast path cannot pass by delegating
everything.
"""

from __future__ import annotations

import ast
import gc
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import typing as t
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_repo
from overstory.cli import fast, hot
from overstory.paths import ProjectPaths
from overstory.store import budgets, mail, sessions
from overstory.store.db import open_events, open_state

DAY_MS = 86_400_000


class World:
    """One project whose databases are put back before every run."""

    def __init__(self, root: Path) -> None:
        self.project = ProjectPaths(root)
        self.saved = root.parent / "saved"
        self.saved.mkdir()
        self.body_file = root.parent / "body.txt"
        self.body_file.write_text("from a file\nsecond line\n")
        self.bad_utf8_file = root.parent / "bad.txt"
        self.bad_utf8_file.write_bytes(b"caf\xe9\n")
        self.worktree = self.project.worktree("builder-a")
        self.worktree.mkdir(parents=True)

    def save(self) -> None:
        for name in ("state.db", "events.db"):
            conn = sqlite3.connect(self.project.ov_dir / name)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.close()
            shutil.copy(self.project.ov_dir / name, self.saved / name)

    def restore(self, *, without_state_db: bool = False) -> None:
        for name in ("state.db", "events.db"):
            for suffix in ("-wal", "-shm"):
                (self.project.ov_dir / (name + suffix)).unlink(missing_ok=True)
            shutil.copy(self.saved / name, self.project.ov_dir / name)
        if without_state_db:
            (self.project.ov_dir / "state.db").unlink()

    def dump(self) -> list[t.Any]:
        """What the databases hold, without the timestamps."""
        if not self.project.state_db.exists():
            return ["no state.db"]
        state = sqlite3.connect(self.project.state_db)
        events = sqlite3.connect(self.project.events_db)
        try:
            rows = state.execute("SELECT id, thread_id, reply_to, sender, recipient, type, priority, subject, body, "
                                 "payload, read_at IS NULL, claimed_by FROM mail ORDER BY id").fetchall()
            kinds = events.execute("SELECT kind, agent, summary FROM events ORDER BY id").fetchall()
            counts = state.execute("SELECT scope, name, tool_calls, refused_tool_calls FROM budgets ORDER BY name")
            kinds += counts.fetchall()
        finally:
            state.close()
            events.close()
        return [rows, kinds]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return build_world(tmp_path_factory)


def build_world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """A project with a lead, two builders (one with budget left), a finished scout and some mail."""
    from overstory.project.init import init_project

    with pytest.MonkeyPatch.context() as patch:
        for name in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
            patch.setenv(name, "ov tests")
        for name in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
            patch.setenv(name, "tests@ov.invalid")
        root = make_repo(tmp_path_factory.mktemp("fast") / "repo")
        init_project(root)
    world = World(root)
    state, events = open_state(world.project.state_db), open_events(world.project.events_db)
    try:
        for name, capability, parent, state_name in (("lead-1", "lead", "operator", "between_turns"),
                                                      ("builder-a", "builder", "lead-1", "in_turn"),
                                                      ("builder-b", "builder", "lead-1", "between_turns"),
                                                      ("scout-done", "scout", "lead-1", "completed")):
            generation = sessions.create_session(state, name=name, capability=capability, task_id=f"t-{name}",
                                                 runtime="scripted", actor="test", parent=parent,
                                                 branch=f"ov/{name}", worktree=str(world.project.worktree(name)))
            sessions.transition(state, name, generation, state_name, actor="test")
            sessions.update_fields(state, name, generation, last_activity=sessions.now_ms() - 2 * DAY_MS,
                                   turns=3, input_tokens=1000, output_tokens=200, cost_usd=0.125)
            if name in ("builder-a", "builder-b"):  # `ov guard` counts calls against these; builder-b has none left
                budgets.create_agent(state, name, generation, run_id=None,
                                     limits={"max_tool_calls": 5 if name == "builder-a" else 0})
        mail.send(state, sender="operator", to="builder-a", subject="first", body="plain body", events=events)
        mail.send(state, sender="lead-1", to="builder-a", subject="\x1b[31mred\x1b[0m subject", priority="urgent",
                  body="styled \x1b[1mbody\x1b[0m", payload={"k": [1, 2]}, events=events)
        mail.send(state, sender="builder-b", to="operator", subject="for you", body="x" * 3000, events=events)
    finally:
        state.close()
        events.close()
    world.save()
    return world


AGENT_ENV = {"OVERSTORY_AGENT_NAME": "builder-a", "OVERSTORY_CAPABILITY": "builder", "OVERSTORY_TASK_ID": "t-builder-a",
             "OVERSTORY_BRANCH": "ov/builder-a", "OVERSTORY_PARENT": "lead-1", "OVERSTORY_PROJECT_ROOT": "{root}",
             "OVERSTORY_GENERATION": "1"}
SCOUT_ENV = {**AGENT_ENV, "OVERSTORY_AGENT_NAME": "scout-x", "OVERSTORY_CAPABILITY": "scout"}


class Case(t.NamedTuple):
    name: str
    args: tuple[str, ...]
    fast: bool  # the fast path takes it (True) or hands it to click (False)
    env: tuple[tuple[str, str], ...] = ()
    stdin: bytes = b""
    where: str = "root"  # root | worktree | outside
    no_state_db: bool = False


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(name: str, args: t.Sequence[str], fast_path: bool, **extra: t.Any) -> None:
        env = extra.pop("env", {})
        cases.append(Case(name, tuple(args), fast_path, env=tuple(sorted(env.items())), **extra))

    send = ["mail", "send", "--to", "builder-b", "--subject", "hello"]
    bodies: list[tuple[str, list[str], bool, bytes]] = [
        ("no-body", [], True, b""), ("body", ["--body", "some text"], True, b""),
        ("body=", ["--body=some text"], True, b""), ("body-stdin", ["--body", "-"], True, "from stdin ✓\n".encode()),
        ("body-file", ["--body-file", "{body_file}"], True, b""),
        ("body-and-file", ["--body", "x", "--body-file", "{body_file}"], True, b""),
        ("stdin-not-utf8", ["--body", "-"], True, b"\xff\xfe"), ("file-not-utf8", ["--body-file", "{bad_file}"], True, b""),
        ("body-file-missing", ["--body-file", "/nonexistent/x"], False, b""),
        ("body-file-dir", ["--body-file", "{root}"], False, b""),
        ("body-ansi", ["--body", "\x1b[32mgreen\x1b[0m"], True, b""),
    ]
    for label, extra, fast_path, stdin in bodies:
        for as_json in ([], ["--json"]):
            add(f"send-{label}{'-json' if as_json else ''}", [*send, *extra, *as_json], fast_path, stdin=stdin)
    for label, extra, fast_path in [
        ("type", ["--type", "question"], True), ("type=", ["--type=result"], True), ("bad-type", ["--type", "bogus"], False),
        ("priority", ["--priority", "urgent"], True), ("bad-priority", ["--priority", "URGENT"], False),
        ("payload", ["--payload", '{"k": 1}'], True), ("bad-payload", ["--payload", "{nope"], True),
        ("protocol-payload", ["--type", "worker_done", "--payload", '{"task_id": "t", "branch": "b", "agent": "a"}'], True),
        ("protocol-missing-fields", ["--type", "merged", "--payload", "{}"], True),
        ("reply-to", ["--reply-to", "1"], True), ("reply-to-missing", ["--reply-to", "999"], True),
        ("reply-to-not-int", ["--reply-to", "one"], False), ("reply-to-spaced", ["--reply-to", " 2 "], True),
        ("from", ["--from", "someone"], True), ("twice", ["--subject", "again", "--priority", "low", "--priority", "high"], True),
        ("option-like-value", ["--body", "--json"], True), ("unknown-option", ["--bogus"], False),
        ("help", ["--help"], False), ("short-help", ["-h"], False), ("extra-argument", ["extra"], False),
        ("double-dash", ["--"], False), ("flag-with-value", ["--json=1"], False), ("missing-value", ["--body"], False),
        ("empty-subject", ["--subject", " "], True),
    ]:
        add(f"send-{label}", [*send, *extra], fast_path)
    add("send-no-subject", ["mail", "send", "--to", "builder-b"], False)
    add("send-no-to", ["mail", "send", "--subject", "s"], True)
    add("send-unknown", ["mail", "send", "--to", "nobody", "--subject", "s"], True)
    add("send-allow-unknown", ["mail", "send", "--to", "nobody", "--subject", "s", "--allow-unknown", "--json"], True)
    add("send-broadcast", ["mail", "send", "--to", "@builders", "--subject", "s", "--json"], True)
    add("send-all", ["mail", "send", "--to", "@all", "--subject", "s"], True)
    add("send-to-finished", ["mail", "send", "--to", "scout-done", "--subject", "s"], True)
    add("send-as-agent-protocol", ["mail", "send", "--type", "worker_done", "--subject", "done", "--body", "b"], True,
        env=AGENT_ENV, where="worktree")
    add("send-as-agent", ["mail", "send", "--to", "lead-1", "--subject", "q", "--json"], True, env=AGENT_ENV,
        where="worktree")
    for label, prefix, fast_path, where in [
        ("project", ["--project", "{root}"], True, "outside"), ("project=", ["--project={root}"], True, "outside"),
        ("project-missing", ["--project", "/nonexistent/p"], True, "root"),
        ("project-file", ["--project", "{body_file}"], False, "root"), ("project-no-value", ["--project"], False, "root"),
        ("verbose", ["-v"], True, "root"), ("verbose-long", ["--verbose"], True, "root"),
        ("outside", [], True, "outside"), ("version", ["--version"], False, "root"),
    ]:
        add(f"global-{label}", [*prefix, *send], fast_path, where=where)
        add(f"global-{label}-check", [*prefix, "mail", "check", "--peek"], fast_path, where=where)
    add("global-env-project", send, True, where="outside", env={"OVERSTORY_PROJECT_ROOT": "{root}"})
    add("global-env-project-file", send, False, where="root", env={"OVERSTORY_PROJECT_ROOT": "{body_file}"})
    add("completion", send, False, env={"_OV_COMPLETE": "bash_complete", "COMP_WORDS": "ov mail se", "COMP_CWORD": "2"})

    for agent in ([], ["--agent", "builder-a"], ["--agent=operator"], ["--agent", "nobody"]):
        for peek in ([], ["--peek"]):
            for inject in ([], ["--inject"]):
                for as_json in ([], ["--json"]):
                    words = [*agent, *peek, *inject, *as_json]
                    add("check" + "".join(w.split("=")[0] for w in words if w.startswith("--")) + "-" + "-".join(
                        w for w in words if not w.startswith("--")), ["mail", "check", *words], True)
    add("check-as-agent", ["mail", "check"], True, env=AGENT_ENV, where="worktree")
    add("check-as-agent-inject", ["mail", "check", "--inject"], True, env=AGENT_ENV, where="worktree")
    add("check-agent-no-value", ["mail", "check", "--agent"], False)
    add("check-unknown", ["mail", "check", "--all"], False)
    add("check-debounce", ["mail", "check", "--peek", "--debounce", "0", "--json"], True)  # 0: each run shows it
    add("check-debounce-not-a-number", ["mail", "check", "--debounce", "soon"], False)
    add("check-debounce-negative", ["mail", "check", "--debounce=-1"], False)
    add("check-help", ["mail", "check", "--help"], False)
    add("mail-other", ["mail", "list", "--json"], False)
    add("mail-typo", ["mail", "sned"], False)
    add("mail-group-help", ["mail", "--help"], False)

    for flags in ([], ["--all"], ["--json"], ["--all", "--json"], ["--json", "--json"]):
        add("status" + "".join(flags), ["status", *flags], True)
    add("status-no-state-db", ["status", "--json"], True, no_state_db=True)
    add("status-no-state-db-text", ["status"], True, no_state_db=True)
    add("status-bogus", ["status", "--bogus"], False)
    add("status-bogus-json", ["status", "--bogus", "--json"], False)
    add("status-help", ["status", "-h"], False)
    for label, extra in [("capability", ["--capability", "builder"]), ("states", ["--state", "in_turn,completed"]),
                         ("parent", ["--parent", "lead-1", "--json"]), ("parent=", ["--parent=operator", "--all"]),
                         ("all-filters", ["--capability", "builder", "--state", "between_turns", "--parent",
                                          "lead-1", "--json"]),
                         ("no-match", ["--capability", "reviewer"]), ("parent-typo", ["--parent", "leed-1"]),
                         ("parent-typo-json", ["--parent", "leed-1", "--json"]), ("bad-state", ["--state", "bogus"]),
                         ("bad-state-json", ["--state", "parked,bogus", "--json"]),
                         ("bad-capability-json", ["--capability", "nope", "--json"]), ("run-unknown", ["--run", "r"]),
                         ("run-unknown-json", ["--run", "r", "--json"]), ("state-no-value", ["--state"])]:
        add(f"status-{label}", ["status", *extra], label != "state-no-value")
    add("status-filter-no-state-db", ["status", "--state", "parked", "--json"], True, no_state_db=True)
    add("status-bad-state-no-state-db", ["status", "--state", "nope"], True, no_state_db=True)
    add("send-unknown-json", ["mail", "send", "--to", "nobody", "--subject", "s", "--json"], True)
    add("send-typo-json", ["mail", "send", "--to", "builder-c", "--subject", "s", "--json"], True)
    add("send-bad-payload-json", [*send, "--payload", "{nope", "--json"], True)
    add("send-bad-type-json", [*send, "--type", "bogus", "--json"], False)
    add("mail-typo-json", ["mail", "sned", "--json"], False)
    add("command-typo-json", ["stauts", "--json"], False)

    bash = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": "{worktree}",
                       "tool_input": {"command": "python -m pytest -q && git status"}}).encode()
    push = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash", "cwd": "{worktree}",
                       "tool_input": {"command": "git push origin HEAD"}}).encode()
    write = json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Write", "cwd": "{worktree}",
                        "tool_input": {"file_path": "{worktree}/x.py", "content": "x"}}).encode()
    for label, stdin in (("bash", bash), ("push", push), ("write", write), ("garbage", b"{not json"), ("empty", b""),
                         ("binary", b"\xff\xfe\x00")):
        add(f"guard-builder-{label}", ["guard"], True, stdin=stdin, env=AGENT_ENV, where="worktree")
        add(f"guard-scout-{label}", ["guard"], True, stdin=stdin, env=SCOUT_ENV, where="worktree")
        add(f"guard-operator-{label}", ["guard"], True, stdin=stdin)
    add("guard-builder-over-budget", ["guard"], True, stdin=bash, where="worktree",
        env={**AGENT_ENV, "OVERSTORY_AGENT_NAME": "builder-b"})
    add("guard-argument", ["guard", "extra"], False, stdin=bash, env=AGENT_ENV)
    add("guard-help", ["guard", "--help"], False)
    add("root-help", ["--help"], False)
    add("no-arguments", [], False)
    add("other-command", ["config", "--json"], False)

    # `ov sling` lines that stop before anything is made (a real spawn is compared in test_fast_sling.py): the fast
    # path's errors after parsing, and the lines it hands to click.
    sling = ["sling", "builder", "t-1"]
    for label, extra, fast_path in [
        ("prompt-and-spec", ["--prompt", "p", "--spec", "{body_file}"], True),
        ("provider-without-model", ["--provider", "ollama"], True),
        ("provider-prefixed-model", ["--provider", "ollama", "--model=ollama/qwen"], True),
        ("bad-approve", ["--approve", "Bash(git push*)", "--approve", "Bash("], True),
        ("files-outside", ["--files", "src/a.py", "--files=../x"], True),
        ("unknown-group", ["--group", "nosuch", "--runtime", "scripted"], True),
        ("unknown-group-json", ["--group", "nosuch", "--runtime", "scripted", "--json"], True),
        ("bad-name", ["--name", "Not A Name", "--runtime", "scripted"], True),
        ("bogus", ["--bogus"], False), ("help", ["--help"], False), ("short-help", ["-h"], False),
        ("help-after-value", ["--prompt", "x", "-h"], False), ("extra-argument", ["extra"], False),
        ("double-dash", ["--", "--prompt"], False), ("negative-usd", ["--max-usd", "-1"], False),
        ("usd-not-a-number", ["--max-usd=lots"], False), ("negative-turns", ["--max-turns", "-3"], False),
        ("bad-wallclock", ["--max-wallclock", "soon"], False), ("bad-runtime", ["--runtime", "Claude"], False),
        ("bad-executor", ["--executor", "k8s"], False), ("spec-directory", ["--spec", "{root}"], False),
        ("flag-with-value", ["--json=yes"], False), ("tmux-with-value", ["--headless=1"], False),
        ("missing-value", ["--prompt"], False), ("bad-json", ["--bogus", "--json"], False),
    ]:
        add(f"sling-{label}", [*sling, *extra], fast_path)
    add("sling-bad-task-id", ["sling", "builder", "Bad Task", "--prompt", "p"], True)
    add("sling-unknown-capability", ["sling", "wizard", "t-1", "--prompt", "p", "--json"], True)
    add("sling-missing-task", ["sling", "builder"], False)
    add("sling-nothing", ["sling"], False)
    return cases


CASES = _cases()
TIMES = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
IDLE = re.compile(r'"idle_seconds": [0-9.]+')
WALLCLOCK = re.compile(r'("wallclock": \{\s*"limit": [^,]+,\s*"used": )[0-9.]+')  # seconds since the budget began


def _fill(text: str, world: World) -> str:
    return (text.replace("{root}", str(world.project.root)).replace("{body_file}", str(world.body_file))
            .replace("{bad_file}", str(world.bad_utf8_file)).replace("{worktree}", str(world.worktree)))


def _run(world: World, case: Case, entry: t.Callable[[list[str]], t.Any], capsys: pytest.CaptureFixture[str],
         monkeypatch: pytest.MonkeyPatch) -> tuple[t.Any, str, str, list[t.Any]]:
    world.restore(without_state_db=case.no_state_db)
    where = {"root": world.project.root, "worktree": world.worktree, "outside": world.project.root.parent}[case.where]
    with monkeypatch.context() as patch:
        patch.chdir(where)
        for name, value in case.env:
            patch.setenv(name, _fill(value, world))
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(_fill(case.stdin.decode("latin-1"), world)
                                                                .encode("latin-1"))))
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            entry([_fill(arg, world) for arg in case.args])
        out, err = capsys.readouterr()
    normal = [WALLCLOCK.sub(r"\1<n>", TIMES.sub("<time>", IDLE.sub('"idle_seconds": <n>', text))) for text in (out, err)]
    return exited.value.code or 0, normal[0], normal[1], world.dump()


def _click_main(args: list[str]) -> t.NoReturn:
    from overstory.cli.main import main

    main(args)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fast_path_and_click_agree(world: World, case: Case, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        for name, value in case.env:
            patch.setenv(name, _fill(value, world))
        patch.chdir({"root": world.project.root, "worktree": world.worktree,
                     "outside": world.project.root.parent}[case.where])
        planned = fast.parse([_fill(arg, world) for arg in case.args])
    assert (planned is not None) == case.fast, "the fast path should " + ("take" if case.fast else "hand over") + " it"
    through_fast = _run(world, case, fast.main, capsys, monkeypatch)
    through_click = _run(world, case, _click_main, capsys, monkeypatch)
    assert through_fast == through_click


def test_the_cases_cover_both_outcomes_of_every_hot_command() -> None:
    """The table above is not vacuous: each hot command has runs that succeed, fail and are handed over."""
    for path in fast.HOT_COMMANDS:
        mine = [c for c in CASES if c.args[:len(path)] == path or c.args[2:2 + len(path)] == path]
        assert any(c.fast for c in mine) and any(not c.fast for c in mine), path


# ---- the option tables are the click commands' -----------------------------------------------


def _click_command(path: tuple[str, ...]) -> click.Command:
    from overstory.cli.main import cli

    ctx = click.Context(cli, info_name="ov")
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(ctx, name)
        assert found is not None
        command = found
    return command


def _kind_of(param: click.Option) -> t.Any:
    """The fast table's kind for a click option (its first name; a flag pair's second name is FLAG_OFF)."""
    if param.is_flag:
        return fast.FLAG
    if param.multiple:
        assert isinstance(param.type, click.types.StringParamType), param
        return fast.TEXTS
    if isinstance(param.type, click.Choice):
        return "choice", tuple(param.type.choices)  # compared with what the table's source resolves to
    if isinstance(param.type, click.FloatRange):
        assert (param.type.min, param.type.max, param.type.min_open, param.type.clamp) == (0, None, False, False)
        return fast.NON_NEGATIVE
    if isinstance(param.type, click.IntRange):
        bounds = (param.type.min, param.type.max, param.type.min_open, param.type.max_open, param.type.clamp)
        if bounds == (1, 2**63 - 1, False, False, False):
            return fast.ROW_ID
        assert bounds == (0, None, False, False, False), param
        return fast.COUNT
    if isinstance(param.type, click.Path):
        assert not param.type.dir_okay and param.type.file_okay and param.type.readable, param
        assert not (param.type.writable or param.type.executable or param.type.resolve_path), param
        if param.type.exists:
            assert param.type.type is None, param  # --body-file: the body takes the string
            return fast.FILE
        assert param.type.type is Path, param
        return fast.PATH
    from overstory.cli.budget import DURATION

    if param.type is DURATION:
        return fast.DURATION
    assert isinstance(param.type, click.types.StringParamType), param
    return fast.TEXT


@pytest.mark.parametrize("path", list(fast.HOT_COMMANDS), ids=" ".join)
def test_the_fast_option_table_is_the_click_commands(path: tuple[str, ...]) -> None:
    import inspect

    body, options, required, arguments = fast.HOT_COMMANDS[path]
    command = _click_command(path)
    declared: dict[str, tuple[str, t.Any]] = {}
    click_required = set()
    click_arguments = []
    for param in command.params:
        if isinstance(param, click.Argument):
            assert param.required and param.nargs == 1 and param.envvar is None, param
            click_arguments.append(param.name)
            continue
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        assert len(param.opts) == 1 and param.nargs == 1 and param.envvar is None, param
        assert not param.secondary_opts or (param.is_flag and param.default is None and len(param.secondary_opts) == 1)
        declared[param.opts[0]] = (param.name, _kind_of(param))
        if param.secondary_opts:
            declared[param.secondary_opts[0]] = (param.name, fast.FLAG_OFF)
        if param.required:
            click_required.add(param.name)
    resolved = {option: (name, ("choice", tuple(fast.choices(kind))) if isinstance(kind, tuple) else kind)
                for option, (name, kind) in options.items()}
    assert declared == resolved
    assert click_required == required
    assert tuple(click_arguments) == arguments
    # What click hands the command when an option is not given is the body's default.
    defaults = command.make_context(path[-1], ["x"] * len(arguments), resilient_parsing=True).params
    signature = inspect.signature(fast.body_of(body))
    assert set(signature.parameters) == {"project_option", *defaults}
    for name, default in defaults.items():
        if name not in required and name not in arguments:
            assert signature.parameters[name].default == default, name


def test_the_root_group_options_are_the_ones_the_fast_path_knows() -> None:
    from overstory.cli.main import cli

    ctx = click.Context(cli, info_name="ov", **cli.context_settings)
    opts = sorted(opt for param in cli.get_params(ctx) for opt in param.opts)
    assert opts == ["--help", "--project", "--verbose", "--version", "-V", "-h", "-v"]
    project = next(p for p in cli.params if p.name == "project")
    assert project.envvar == "OVERSTORY_PROJECT_ROOT" and isinstance(project.type, click.Path)
    assert not project.type.file_okay and not project.type.exists


# ---- in a real process, the fast path stays light -------------------------------------------------

# The probe imports nothing itself before the command runs (not even json: it would hide the command's own).
PROBE = textwrap.dedent("""
    import sys
    from overstory.cli import fast
    split = sys.argv.index("--wanted--")
    try:
        fast.main(sys.argv[1:split])
    except SystemExit as exc:
        code = exc.code
    # A module still deferred (cli.fast's stand-in) does not count as loaded.
    real = [name for name, module in sys.modules.items() if type(module).__name__ != "_Deferred"]
    names = {name.split(".")[0] for name in real} | set(real)  # top-level packages, and whole dotted names
    print(repr({"code": code, "loaded": sorted(names & set(sys.argv[split + 1:]))}))
""")
UNWANTED = ["click", "pydantic", "yaml", "rich", "git", "libtmux", "anthropic", "typing", "pathlib", "inspect",
            "http", "urllib", "asyncio", "subprocess"]
# What the hot commands also leave out since issue 20's second round: each costs 1-5 ms of a process whose target is
# twice an empty interpreter's start (re with enum, json, which imports re, the sqlite3 package with datetime ...).
STDLIB_UNWANTED = ["re", "enum", "json", "sqlite3", "datetime", "dataclasses", "contextlib", "socket", "signal",
                   "collections", "functools", "difflib"]  # difflib: "did you mean" is computed on the error path only


def _run_probe(world: World, args: list[str], wanted: list[str], env: dict[str, str] | None = None,
               stdin: bytes = b"") -> dict[str, t.Any]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}
    full_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", PROBE, *args, "--wanted--", *wanted], input=stdin,
                          capture_output=True, env=full_env, cwd=world.project.root, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, t.Any] = ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])
    return result


def _probe(world: World, args: list[str], env: dict[str, str] | None = None, stdin: bytes = b"") -> dict[str, t.Any]:
    return _run_probe(world, args, UNWANTED, env, stdin)


@pytest.mark.parametrize("args", [
    ["mail", "send", "--to", "builder-b", "--subject", "s", "--body", "b", "--priority", "high"],
    ["mail", "check", "--json"], ["mail", "check", "--inject", "--agent", "builder-a"], ["mail", "check"],
    ["status", "--json"], ["status", "--all"],
], ids=" ".join)
def test_hot_commands_import_nothing_heavy(world: World, args: list[str]) -> None:
    world.restore()
    assert _probe(world, args) == {"code": 0, "loaded": []}


def test_the_guard_imports_nothing_heavy(world: World) -> None:
    stdin = json.dumps({"tool_name": "Bash", "tool_input": {"command": "git push"}, "cwd": str(world.worktree)})
    assert _probe(world, ["guard"], env=AGENT_ENV, stdin=stdin.encode()) == {"code": 0, "loaded": []}


# What `ov guard` leaves out since issue 34's last round (about 1.5 ms of its CPU): the json package (jsontext does the
# same work), shlex (only a command that looks like apply_patch needs it) and fnmatch (a rule's glob becomes a regex
# only when a call starts like it).
GUARD_UNWANTED = ["json", "shlex", "fnmatch"]


def test_the_guard_writes_its_ledger_row_without_json_shlex_or_fnmatch(world: World) -> None:
    world.restore()
    command = "python -m pytest -q tests/test_parser.py && git status --short && ls -la src"
    stdin = json.dumps({"tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": "toolu_light",
                        "cwd": str(world.worktree)})
    env = {**AGENT_ENV, "OVERSTORY_PROJECT_ROOT": str(world.project.root), "OVERSTORY_TURN_ID": "t-light",
           "OVERSTORY_DISPATCH": "1"}
    assert _run_probe(world, ["guard"], GUARD_UNWANTED, env=env, stdin=stdin.encode()) == {"code": 0, "loaded": []}
    conn = sqlite3.connect(world.project.state_db)
    try:
        rows = conn.execute("SELECT class FROM tool_calls WHERE tool_use_id = 'toolu_light'").fetchall()
    finally:
        conn.close()
    assert len(rows) == 1  # judged, classified and recorded


def test_the_guard_counts_and_records_a_call_on_one_connection(world: World) -> None:
    """The budget count and the ledger row share state.db's one connection (each opening parses the schema)."""
    world.restore()
    code = textwrap.dedent("""
        import sys, _sqlite3
        opened = []
        real = _sqlite3.connect
        _sqlite3.connect = lambda *args, **kwargs: opened.append(args[0]) or real(*args, **kwargs)
        from overstory.cli import fast
        try:
            fast.main(["guard"])
        except SystemExit:
            pass
        print(len(opened))
    """)
    call = {"tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_use_id": "toolu_one", "cwd": str(world.worktree)}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}, **AGENT_ENV,
           "OVERSTORY_PROJECT_ROOT": str(world.project.root), "OVERSTORY_TURN_ID": "t-one", "OVERSTORY_DISPATCH": "1"}
    done = subprocess.run([sys.executable, "-c", code], input=json.dumps(call).encode(), capture_output=True, env=env,
                          cwd=world.project.root, timeout=60, check=False)
    assert (done.returncode, done.stdout.decode().split(), done.stderr) == (0, ["1"], b"")
    conn = sqlite3.connect(world.project.state_db)
    try:
        counted = conn.execute("SELECT tool_calls FROM budgets WHERE name = 'builder-a'").fetchone()[0]
        rows = conn.execute("SELECT status FROM tool_calls WHERE tool_use_id = 'toolu_one'").fetchall()
    finally:
        conn.close()
    assert (counted, rows) == (1, [("started",)])


# Since issue 34's last target (hot commands at 2x) the guard's lexer, walker and handlers test characters without
# regular expressions (guards.chars) and import collections.abc's names only for the type checker: re, with the enum,
# functools and collections it imports, was about a quarter of `ov guard`'s CPU time.
ORDINARY_COMMANDS = [
    "python -m pytest -q tests/test_parser.py && git status --short && ls -la src",
    "cd src && cp a.py b.py; mv b.py c.py 2>/dev/null || rm -f c.py",
    'rg -n "def main" src | head -5; sed -n 1,20p README.md | sort | uniq -c',
    'echo $HOME ~/x ${X:-y} "$(git log -1 --format=%H)" `date` $((1+2)) > /tmp/out.txt',
    "bash -c 'ls; env A=1 timeout 5 grep -r x .' && mkdir -p build/{a,b} && touch build/a/x",
    "for f in *.py; do wc -l $f; done; cat <<EOF > /tmp/notes\nhello $(whoami)\nEOF\n",
    "python -m pytest -x -k parser --maxfail=2 tests/ && ruff check --select E src && mypy src",  # testopts' tables
]


@pytest.mark.parametrize("capability", ["builder", "scout"])
@pytest.mark.parametrize("command", ORDINARY_COMMANDS)
def test_the_guard_judges_ordinary_commands_without_the_costly_standard_modules(world: World, command: str,
                                                                                 capability: str) -> None:
    world.restore()
    call = {"tool_name": "Bash", "tool_input": {"command": command}, "tool_use_id": "toolu_plain",
            "cwd": str(world.worktree)}
    env = {**(AGENT_ENV if capability == "builder" else SCOUT_ENV), "OVERSTORY_PROJECT_ROOT": str(world.project.root),
           "OVERSTORY_TURN_ID": "t-plain", "OVERSTORY_DISPATCH": "1"}
    assert _run_probe(world, ["guard"], STDLIB_UNWANTED, env=env, stdin=json.dumps(call).encode()) == {
        "code": 0, "loaded": []}
    for response in ({"tool_response": {"stdout": "ok", "stderr": ""}},
                     {"hook_event_name": "PostToolUseFailure", "error": "Exit code 1\nfailed"}):
        post = {"hook_event_name": "PostToolUse", **call, **response}
        assert _run_probe(world, ["guard", "--post"], STDLIB_UNWANTED, env=env, stdin=json.dumps(post).encode()) == {
            "code": 0, "loaded": []}


# Modules of ov's own that the hot commands need only when something is wrong: the 48 error classes (raised where
# they are made) and the migration lists (a database behind them). Since issue 34's last target.
OV_UNWANTED = ["overstory.errors", "overstory.store.migrations", "overstory.store.events_migrations"]


@pytest.mark.parametrize("args", [["status", "--json"], ["status", "--all"], ["guard"], ["guard", "--post"]],
                         ids=" ".join)
def test_status_and_the_guard_load_no_error_classes_or_migrations(world: World, args: list[str]) -> None:
    world.restore()
    call = {"tool_name": "Bash", "tool_input": {"command": "ls -la"}, "tool_use_id": "toolu_calm",
            "cwd": str(world.worktree), "tool_response": {"stdout": "x"}}
    env = {**AGENT_ENV, "OVERSTORY_PROJECT_ROOT": str(world.project.root), "OVERSTORY_TURN_ID": "t-calm"}
    probed = _run_probe(world, args, OV_UNWANTED, env=env if args[0] == "guard" else None,
                        stdin=json.dumps(call).encode() if args[0] == "guard" else b"")
    assert probed == {"code": 0, "loaded": []}


def test_outside_a_sandbox_the_endpoint_client_is_not_loaded(world: World) -> None:
    stdin = json.dumps({"tool_name": "Bash", "tool_input": {"command": "git push"}, "cwd": str(world.worktree)})
    world.restore()
    client = "overstory.endpoint.client"
    assert _probe(world, ["guard"], env=AGENT_ENV, stdin=stdin.encode())["loaded"] == []
    assert _run_probe(world, ["guard"], [client, "socket", "_socket"], env=AGENT_ENV,
                      stdin=stdin.encode())["loaded"] == []


def test_inside_a_sandboxed_turn_the_hot_commands_go_through_the_endpoint_lightly(world: World) -> None:
    """With a turn's endpoint secret in the environment (as in its sandbox, where state.db is
    read-only), `ov guard`, `ov guard --post` and `ov mail check` ask the agent's endpoint: the client
    loads, but still no typing, http or urllib; the call is counted and its ledger rows written."""
    from overstory.endpoint.routes import ROUTES
    from overstory.endpoint.server import AgentEndpoint

    world.restore()
    endpoint = AgentEndpoint(world.project, "builder-a", 1, ROUTES).start()
    try:
        env = {**AGENT_ENV, "OVERSTORY_PROJECT_ROOT": str(world.project.root), "OVERSTORY_TURN_ID": "t-sbx",
               **endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": "t-sbx", "OVERSTORY_ATTEMPT": "0"})}
        call = {"tool_name": "Read", "tool_input": {"file_path": str(world.worktree / "a.txt")},
                "tool_use_id": "toolu_sbx", "cwd": str(world.worktree)}
        wanted = [*UNWANTED, "overstory.endpoint.client"]
        for args, stdin in ((["guard"], call), (["guard", "--post"], {**call, "tool_response": "text"})):
            done = subprocess.run([sys.executable, "-c", PROBE, *args, "--wanted--", *wanted],
                                  input=json.dumps(stdin).encode(), capture_output=True, cwd=world.project.root,
                                  timeout=60, check=False,
                                  env={**{k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")},
                                       **env})
            assert done.returncode == 0, done.stderr.decode()
            assert ast.literal_eval(done.stdout.decode().splitlines()[-1]) == {
                "code": 0, "loaded": ["overstory.endpoint.client"]}, args
            assert done.stderr == b"", args  # the ledger was written: no warning
        state = open_state(world.project.state_db)
        try:
            counted = state.execute("SELECT tool_calls FROM budgets WHERE name = 'builder-a'").fetchone()[0]
            rows = state.execute("SELECT status FROM tool_calls WHERE agent = 'builder-a' AND tool_use_id = "
                                 "'toolu_sbx'").fetchall()
        finally:
            state.close()
        assert counted == 1
        assert [r[0] for r in rows] == ["succeeded"]  # one row: begun by ov guard, finished by ov guard --post
        conn = open_state(world.project.state_db)
        try:
            unread = [m.as_dict() for m in mail.unread(conn, "builder-a", peek=True)]
        finally:
            conn.close()
        assert unread, "the world has mail for builder-a"
        plain = {**{k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}, **env}

        def ov(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-c", "from overstory.cli import fast; fast.main()", *args],
                                  capture_output=True, text=True, cwd=world.project.root, timeout=60, env=plain,
                                  check=False)

        peeked = ov("mail", "check", "--json", "--peek")
        assert (peeked.returncode, json.loads(peeked.stdout)) == (0, unread), peeked.stderr
        assert _probe(world, ["mail", "check", "--peek"], env=env) == {"code": 0, "loaded": []}
        shown = ov("mail", "check")
        # rendered from the endpoint's as_dict() documents, timestamps included
        assert shown.returncode == 0 and all(f"Sent: {m['created_at']}" in shown.stdout for m in unread), shown.stderr
        assert "No new mail for builder-a." in ov("mail", "check").stdout  # the endpoint marked them read
    finally:
        endpoint.close()


def test_the_probe_sees_what_click_loads(world: World) -> None:
    """Control: a command the fast path hands over does load click (and typing, inspect ...)."""
    world.restore()
    loaded = _probe(world, ["mail", "list"])["loaded"]
    assert "click" in loaded and "typing" in loaded and "inspect" in loaded


def test_a_deferred_module_loads_on_first_use() -> None:
    code = ("import sys\nfrom overstory.cli import fast\nsys.modules.pop('colorsys', None)\nfast.defer('colorsys')\n"
            "import colorsys\nassert type(sys.modules['colorsys']).__name__ == '_Deferred'\n"
            "print(colorsys.rgb_to_hsv(1, 0, 0))\nfrom colorsys import hsv_to_rgb\n"
            "assert type(sys.modules['colorsys']).__name__ == 'module'\nprint(hsv_to_rgb(0, 1, 1))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    import colorsys

    assert done.stdout.splitlines() == [str(colorsys.rgb_to_hsv(1, 0, 0)), str(colorsys.hsv_to_rgb(0, 1, 1))]


def test_a_hot_command_runs_without_the_cyclic_collector_and_click_gets_it_back(world: World) -> None:
    """The `ov` process of a hot command switches Python's cyclic garbage collector off (its passes cost about
    0.5 ms and find nothing in a process this short); a command handed to click has it; a caller of main() with
    its own arguments (as here) keeps its own."""
    world.restore()
    code = ("import atexit, gc, sys\nfrom overstory.cli import fast\n"
            "atexit.register(lambda: sys.stderr.write(f'collector on: {gc.isenabled()}'))\nfast.main()")
    seen = []
    for args in (["status", "--json"], ["mail", "check", "--agent", "builder-a"], ["--help"]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              cwd=world.project.root, timeout=60, check=False,
                              env={k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")})
        assert done.returncode == 0, done.stderr
        seen.append(done.stderr.splitlines()[-1])
    assert seen == ["collector on: False", "collector on: False", "collector on: True"]  # the handler ran too
    with pytest.raises(SystemExit):
        fast.main(["--project", str(world.project.root), "status", "--json"])
    assert gc.isenabled()


def test_a_hot_commands_process_ends_at_once_with_its_output_and_status(world: World) -> None:
    """With no exit handler registered, a hot command's process skips the interpreter's finalization
    (``os._exit``) after flushing: its whole output and its exit status are still there."""
    world.restore()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}
    ov = [sys.executable, "-c", "from overstory.cli import fast; fast.main()"]
    status = subprocess.run([*ov, "status", "--json"], capture_output=True, text=True, cwd=world.project.root,
                            env=env, timeout=60, check=False)
    assert status.returncode == 0 and json.loads(status.stdout)["totals"]["agents"] == 4, status.stderr
    refused = subprocess.run([*ov, "guard"], input=json.dumps({"tool": "bash", "args": {"command": "sudo ls"}}),
                             capture_output=True, text=True, cwd=world.project.root, timeout=60, check=False,
                             env={**env, **AGENT_ENV, "OVERSTORY_PROJECT_ROOT": str(world.project.root)})
    assert refused.returncode == 2 and "sudo" in refused.stderr and refused.stdout == ""  # OpenCode's dialect
    bad = subprocess.run([*ov, "status", "--capability", "nope", "--json"], capture_output=True, text=True,
                         cwd=world.project.root, env=env, timeout=60, check=False)
    assert bad.returncode == 2 and json.loads(bad.stderr)["error"]["kind"] == "usage_error"


def test_the_ov_script_starts_in_the_fast_path() -> None:
    """`ov` is scripts/ov, installed as it is: a generated entry-point script imports `re` before anything
    else (two thirds of `python -c pass`, for every hot command)."""
    import tomllib

    from conftest import REPO_ROOT

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "scripts" not in project["project"]
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-scripts"] == {"scripts/ov": "ov"}
    script = (REPO_ROOT / "scripts" / "ov").read_text()
    assert script.startswith("#!python\n") and os.access(REPO_ROOT / "scripts" / "ov", os.X_OK)
    code = [line for line in script.splitlines() if line and not line.startswith("#")]
    assert code == ["from overstory.cli.fast import main", "main()"]
    assert "overstory.cli.fast import main" in (REPO_ROOT / "src" / "overstory" / "__main__.py").read_text()


@pytest.mark.parametrize("args", [["--version"], ["-V"], ["mail", "check", "--json"]], ids=" ".join)
def test_the_installed_ov_imports_neither_re_nor_click_for_a_hot_command(world: World, args: list[str]) -> None:
    """The script pip installed next to this Python (reinstall with `pip install -e .` after pulling)."""
    world.restore()
    ov = Path(sys.executable).parent / "ov"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))},
           "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run([str(ov), *args], capture_output=True, text=True, env=env, cwd=world.project.root,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "overstory.cli.fast" in imported  # the probe sees the imports
    assert imported & {"re", "click", "enum"} == set()
    if args[0] != "mail":
        assert done.stdout == "ov 0.1.0\n"


@pytest.mark.parametrize("args", [["--version"], ["-V"]])
def test_the_version_is_what_click_would_print(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    outputs = []
    for entry in (fast.main, _click_main):
        with pytest.raises(SystemExit) as exited:
            entry(args)
        outputs.append((exited.value.code or 0, *capsys.readouterr()))
    assert outputs[0] == outputs[1] == (0, f"ov {__import__('overstory').__version__}\n", "")


def test_the_store_takes_string_paths_as_the_hot_path_passes_them(tmp_path: Path) -> None:
    from overstory.errors import StoreError

    conn = open_state(str(tmp_path / "state.db"))
    conn.close()
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(b"this is not an SQLite database at all, just bytes" * 100)
    with pytest.raises(StoreError, match="damaged.db"):
        open_events(str(damaged))


DB_COMMANDS = [["mail", "send", "--to", "builder-b", "--subject", "s", "--body", "b", "--payload", '{"k": [1]}'],
               ["mail", "check", "--json"], ["mail", "check"], ["status", "--json"], ["status", "--all"]]


@pytest.mark.parametrize("args", DB_COMMANDS, ids=" ".join)
def test_the_operators_hot_commands_leave_out_the_costly_standard_modules(world: World, args: list[str]) -> None:
    """On the database too: SQLite's C module comes without the functools it would import (store.sqlite_module)."""
    world.restore()
    assert _run_probe(world, args, STDLIB_UNWANTED) == {"code": 0, "loaded": []}


@pytest.mark.parametrize("args", [*DB_COMMANDS[:-1], ["guard"], ["guard", "--post"]], ids=" ".join)
def test_an_agents_hot_commands_are_light_clients_of_its_endpoint(world: World, args: list[str]) -> None:
    """Inside a turn (its endpoint's variables set) every hot command is a client of the agent's loop: no SQLite,
    no guard modules, none of the costly standard modules. (`ov status` as text still loads ``status``, whose
    formatting shares modules with the database side: not a hot form.)"""
    from overstory.endpoint.routes import ROUTES
    from overstory.endpoint.server import AgentEndpoint

    world.restore()
    endpoint = AgentEndpoint(world.project, "builder-a", 1, ROUTES).start()
    try:
        env = {**AGENT_ENV, "OVERSTORY_PROJECT_ROOT": str(world.project.root),
               **endpoint.open_turn(turn_env={"OVERSTORY_TURN_ID": "t-light", "OVERSTORY_ATTEMPT": "0"})}
        call = {"tool_name": "Bash", "tool_input": {"command": "git status"}, "tool_use_id": "toolu_light",
                "cwd": str(world.worktree), **({"tool_response": "ok"} if "--post" in args else {})}
        wanted = [*STDLIB_UNWANTED, "_sqlite3", "overstory.guards", "overstory.store.db"]
        assert _run_probe(world, args, wanted, env=env, stdin=json.dumps(call).encode()) == {"code": 0, "loaded": []}
    finally:
        endpoint.close()


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet=["\x1b", "[", "0", "9", ";", "?", " ", "/", "@", "m", "~", "a", "\x7f", "\n", "é"], max_size=16))
def test_styles_are_stripped_as_clicks_pattern_strips_them(text: str) -> None:
    import re

    assert hot._strip_ansi(text) == re.sub(r"\033\[[0-?]*[ -/]*[@-~]", "", text)
