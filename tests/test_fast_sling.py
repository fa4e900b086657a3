"""`ov sling` in the fast entry point (cli.fast, body in cli.sling_body): parsed by hand, checked against click.

The hand parser replaces click for speed, so it is fuzzed against click: for generated `ov sling` command lines
it must either produce exactly the parameters click's command would get, or hand the line to click. Then real
slings through both entry points must print the same, and the fast one must not load click, rich or pydantic.
The body starts the agent's loop early (agents.warm_loop); the last tests check that loop is the one used, and
that every way of not using it ends it.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import math
import os
import random
import re
import subprocess
import sys
import typing as t
from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_repo, stop_project_processes
from overstory.cli import fast, sling_body
from overstory.paths import ProjectPaths

# ---- the parser against click ------------------------------------------------------------------------


class Places(t.NamedTuple):
    file: str
    directory: str
    missing: str


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Places:
    root = tmp_path_factory.mktemp("places")
    (root / "spec.md").write_text("do it\n")
    return Places(str(root / "spec.md"), str(root), str(root / "nope" / "spec.md"))


OPTIONS = list(fast.HOT_COMMANDS[("sling",)][1])
# Values chosen to land on both sides of every check: choices in and out (case), numbers negative, fractional,
# not finite, with spaces or underscores, durations with and without units, option-like words, paths that are a
# file, a directory or missing, and words with spaces, `=` and quotes.
VALUES = ["builder", "scout", "wizard", "t-1", "task 42", "", "-", "--", "=", "a=b", "--json", "-h", "--help",
          "--prompt", "--headless", "-x", "scripted", "claude", "Claude", "local", "ray", "RAY", "0", "3", "-1",
          "1.5", " 7 ", "1_0", "1e3", "nan", "inf", "-0", "90", "90m", "4h", "2d", "1.5h", "bad", "h", "10 m",
          "Bash(git push*)", "Bash(", "src/**", "../x", "a,b", "{file}", "{dir}", "{missing}", "it's \"quoted\""]
NOT_OPTIONS = ["--bogus", "--jso", "-p", "--json=1", "--tmux=yes", "--no-tmux", "--prompt=", "--max-usd=-2",
               "--max-wallclock=90m", "--runtime=scripted", "--files=a,b", "--spec={file}", "--name=x y", "-hv"]


def _fill(argv: list[str], places: Places) -> list[str]:
    return [word.replace("{file}", places.file).replace("{dir}", places.directory)
            .replace("{missing}", places.missing) for word in argv]


def _sling_command() -> tuple[click.Command, click.Context]:
    from overstory.cli.main import cli

    parent = click.Context(cli, info_name="ov", **cli.context_settings)
    command = cli.get_command(parent, "sling")
    assert command is not None
    return command, parent


def _click_parses(argv: list[str]) -> dict[str, t.Any] | str:
    """The parameters click's `ov sling` gets from ``argv``, or how it refused it ("usage", "exit" for help)."""
    command, parent = _sling_command()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return command.make_context("sling", list(argv), parent=parent).params
        except click.exceptions.Exit:
            return "exit"
        except click.ClickException:
            return "usage"


def _defaults() -> dict[str, t.Any]:
    command, parent = _sling_command()
    return command.make_context("sling", ["c", "t"], parent=parent, resilient_parsing=True).params


def _compare(argv: list[str]) -> str:
    """Check one command line; say which way it went: "fast", "handed over" or "click refuses"."""
    plan = fast.parse(["sling", *argv], environ={})
    by_click = _click_parses(argv)
    if plan is not None:
        assert plan.body == "sling_body.sling"
        assert by_click == {**_defaults(), **plan.params}, argv
        return "fast"
    if isinstance(by_click, str):
        return "click refuses"
    # Click accepts it and the fast path handed it over: only for what the hand parser leaves alone on purpose.
    usd = by_click["max_usd"]
    assert ("--" in argv or "-" in (by_click["capability"], by_click["task_id"])
            or (usd is not None and not math.isfinite(usd))), (argv, by_click)
    return "handed over"


def _random_argv(rng: random.Random) -> list[str]:
    """A command line: mostly well-formed (two arguments among options with values of their kind), some noise."""
    words: list[str] = []
    if rng.random() < 0.9:
        words += [rng.choice(["builder", "scout", "lead", "wizard"]), rng.choice(["t-1", "task-42", "x y"])]
    for _ in range(rng.randrange(0, 7)):
        roll = rng.random()
        option = rng.choice(OPTIONS)
        if roll < 0.55:
            kind = fast.HOT_COMMANDS[("sling",)][1][option][1]
            if kind in (fast.FLAG, fast.FLAG_OFF):
                words.append(option)
            else:
                value = _good_value(rng, kind)
                words += [f"{option}={value}"] if rng.random() < 0.3 else [option, value]
        elif roll < 0.8:
            words += [option, rng.choice(VALUES)]
        elif roll < 0.9:
            words.append(rng.choice(NOT_OPTIONS))
        else:
            words.append(rng.choice(VALUES))
    if rng.random() < 0.3:
        rng.shuffle(words)  # options before, between and after the arguments
    return words


def _good_value(rng: random.Random, kind: t.Any) -> str:
    if isinstance(kind, tuple):
        return rng.choice(list(fast.choices(kind)))
    return rng.choice({
        fast.TEXT: ["x", "task 42", "", "--json", "a=b"], fast.TEXTS: ["src/a.py", "a,b", "Bash(git push*)"],
        fast.NON_NEGATIVE: ["0", "2", "0.25", "1e2", " 3 "], fast.COUNT: ["0", "30", "+4", " 5"],
        fast.DURATION: ["90", "90m", "4h", "1.5h", "30s", "2d"], fast.PATH: ["{file}", "{missing}", "rel/x.md"],
    }[kind])


FUZZ_CASES = 4000


def test_generated_sling_lines_parse_as_click_parses_them_or_go_to_click(places: Places) -> None:
    """4,000 command lines from a fixed seed; every outcome is seen often enough to mean something."""
    rng = random.Random(34)
    seen: dict[str, int] = {}
    for _ in range(FUZZ_CASES):
        outcome = _compare(_fill(_random_argv(rng), places))
        seen[outcome] = seen.get(outcome, 0) + 1
    assert seen["fast"] > FUZZ_CASES // 5 and seen["click refuses"] > FUZZ_CASES // 5, seen
    assert seen.get("handed over", 0) > 0, seen


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.sampled_from([*OPTIONS, *NOT_OPTIONS, *VALUES]), max_size=9))
def test_any_word_soup_parses_as_click_parses_it_or_goes_to_click(places: Places, words: list[str]) -> None:
    _compare(_fill(words, places))


@pytest.mark.parametrize("argv", [
    ["builder", "t-1", "--prompt", "--help"],  # a value that looks like help: click takes it as the value
    ["--prompt=a=b", "builder", "--files", "a", "t-1", "--files=b,c", "--approve", "Bash(x)"],
    ["builder", "t-1", "--tmux", "--headless", "--max-usd", "2", "--max-usd", "3"],  # the last one wins
    ["builder", "t-1", "--max-turns", "0", "--max-tool-calls", "٣", "--max-wallclock", "1.5h"],
    ["builder", "t-1", "--spec", "{missing}", "--scenario", "{file}", "--executor", "ray", "--json"],
    ["builder", "t-1", "-h"], ["builder", "t-1", "--", "x"], ["builder", "-", "--max-usd", "nan"],
    ["builder"], [], ["builder", "t-1", "--spec", "{dir}"], ["builder", "t-1", "--max-wallclock", "90x"],
], ids=repr)
def test_chosen_sling_lines(places: Places, argv: list[str]) -> None:
    _compare(_fill(argv, places))


def test_the_fast_parser_takes_an_ordinary_sling() -> None:
    plan = fast.parse(["--project", "/tmp", "-v", "sling", "builder", "task-42", "--prompt", "add a --json flag",
                       "--files", "src/status.py", "--max-wallclock", "90m"], environ={})
    assert plan is not None and plan.project == "/tmp"
    assert plan.params == {"capability": "builder", "task_id": "task-42", "prompt": "add a --json flag",
                           "files": ("src/status.py",), "max_wallclock": 5400.0}


# ---- real slings through both entry points ------------------------------------------------------------

FAST = "from overstory.cli import fast; fast.main()"
CLICK = "from overstory.cli.main import main; main()"


@pytest.fixture
def two_projects(tmp_path: Path) -> t.Iterator[tuple[ProjectPaths, ProjectPaths]]:
    """Two identical fresh projects: one for each entry point, so both slings start from the same state."""
    from overstory.project.init import init_project

    made = []
    for side in ("fast", "click"):
        root = make_repo(tmp_path / side / "repo")
        init_project(root)
        made.append(ProjectPaths(root))
    yield made[0], made[1]
    for project in made:
        stop_project_processes(project)


def _ov(entry: str, project: ProjectPaths, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
    done = subprocess.run([sys.executable, "-c", entry, *args], capture_output=True, text=True, cwd=project.root,
                          env=env, timeout=120, check=False)
    root = str(project.root)
    normal = [re.sub(r'"loop_pid": \d+', '"loop_pid": <pid>', text.replace(root, "<root>"))
              for text in (done.stdout, done.stderr)]
    return done.returncode, normal[0], normal[1]


SLINGS = [
    ["sling", "builder", "t-1", "--runtime", "scripted", "--prompt", "say hello", "--files", "src/a.py,docs/**"],
    ["sling", "scout", "t-2", "--runtime=scripted", "--json", "--max-usd", "2", "--max-wallclock", "90m",
     "--max-turns", "7", "--approve", "Bash(git push*)", "--headless"],
    ["sling", "builder", "t-3", "--runtime", "scripted", "--name", "builder-three"],  # no prompt: a warning
    ["sling", "builder", "t-4", "--runtime", "scripted", "--bogus"],
    ["sling", "builder", "t-5", "--runtime", "scripted", "--max-usd", "-1", "--json"],
    ["sling", "builder", "t-6", "--runtime", "scripted", "--prompt", "p", "--provider", "nowhere"],
    ["sling", "builder", "t-1", "--runtime", "scripted", "--prompt", "again"],  # the agent exists already
]


def test_real_slings_print_the_same_through_both_entry_points(two_projects: tuple[ProjectPaths, ProjectPaths]) -> None:
    fast_project, click_project = two_projects
    for args in SLINGS:
        taken = fast.parse(args, environ={}) is not None
        assert taken == ("--bogus" not in args and "-1" not in args), args  # the fast path does run these
        through_fast = _ov(FAST, fast_project, *args)
        through_click = _ov(CLICK, click_project, *args)
        assert through_fast == through_click, args
    assert _ov(FAST, fast_project, *SLINGS[0][:3])[0] == 1  # (the last one did fail: the name is taken)


def test_a_bad_option_is_clicks_one_line_usage_error(two_projects: tuple[ProjectPaths, ProjectPaths]) -> None:
    code, out, err = _ov(FAST, two_projects[0], "sling", "builder", "t-1", "--max-turns", "-2")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == "Error: Invalid value for '--max-turns': -2 is not in the range x>=0."
    assert "Traceback" not in err


PROBE = """
import sys
from overstory.cli import fast
try:
    fast.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
real = {name.split(".")[0] for name, module in sys.modules.items() if type(module).__name__ != "_Deferred"}
print(repr({"code": code, "loaded": sorted(real & {"click", "rich", "pydantic", "yaml"})}))
"""


def test_a_sling_through_the_fast_path_loads_neither_click_rich_nor_pydantic(project: ProjectPaths) -> None:
    from overstory.config.load import load

    load(project.config_file, project.local_config_file)  # the snapshot a second command reads (as any sling after
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}  # the first one)
    done = subprocess.run([sys.executable, "-c", PROBE, "sling", "builder", "t-1", "--runtime", "scripted",
                           "--prompt", "p", "--json"], capture_output=True, text=True, cwd=project.root, env=env,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert ast.literal_eval(done.stdout.splitlines()[-1]) == {"code": 0, "loaded": []}


# ---- the loop started early --------------------------------------------------------------------------


class WarmLoops:
    """Every WarmLoop made in this test, and what each ``go`` answered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from overstory.agents.warm_loop import WarmLoop

        self.made: list[t.Any] = []
        self.answers: list[t.Any] = []
        real_init, real_go = WarmLoop.__init__, WarmLoop.go

        def init(loop: t.Any, *args: t.Any, **kwargs: t.Any) -> None:
            real_init(loop, *args, **kwargs)
            self.made.append(loop)

        def go(loop: t.Any, *args: t.Any, **kwargs: t.Any) -> t.Any:
            answer = real_go(loop, *args, **kwargs)
            self.answers.append(answer)
            return answer

        monkeypatch.setattr(WarmLoop, "__init__", init)
        monkeypatch.setattr(WarmLoop, "go", go)


def test_the_loop_started_early_serves_the_agent(project: ProjectPaths, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    loops = WarmLoops(monkeypatch)
    sling_body.sling(str(project.root), capability="builder", task_id="t-1", runtime="scripted", prompt="p",
                     as_json=True)
    document = json.loads(capsys.readouterr().out)
    assert len(loops.made) == 1 and loops.made[0].proc is not None  # the body's; spawn.sling started none of its own
    assert loops.answers == [(loops.made[0].proc.pid, t.cast(t.Any, loops.answers[0])[1])]
    assert document["loop_pid"] == loops.made[0].proc.pid


@pytest.mark.parametrize("extra", [{"prompt": "p", "spec_file": Path("/nonexistent")}, {"approve": ("Bash(",)},
                                   {"group": "nosuch"}, {"base_branch": "no-such-branch"}], ids=repr)
def test_a_sling_that_fails_ends_the_loop_it_started_early(project: ProjectPaths, monkeypatch: pytest.MonkeyPatch,
                                                           extra: dict[str, t.Any]) -> None:
    from overstory.errors import OrchestratorError

    loops = WarmLoops(monkeypatch)
    with pytest.raises(OrchestratorError):
        sling_body.sling(str(project.root), capability="builder", task_id="t-1", runtime="scripted", **extra)
    assert len(loops.made) == 1
    assert loops.made[0].proc.poll() is not None  # ended and reaped, having been told nothing


def test_no_early_loop_for_tmux_a_bad_name_or_a_project_that_cannot_be_read(project: ProjectPaths,
                                                                            tmp_path: Path) -> None:
    early = sling_body._start_early(str(project.root), "builder", "t-1", None, "scripted", tmux=True)
    assert early is not None and early[2] is None
    for capability, task_id, name in (("wizard", "t-1", None), ("builder", "Bad Id", None), ("builder", "t", "X Y")):
        early = sling_body._start_early(str(project.root), capability, task_id, name, "scripted", None)
        assert early is not None and early[2] is None
    assert sling_body._start_early(str(tmp_path / "not-a-project"), "builder", "t-1", None, "scripted", None) is None


def test_an_agent_slinging_through_its_endpoint_starts_no_loop(project: ProjectPaths,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    sent = []

    class Remote:
        def call(self, route: str, document: dict[str, t.Any]) -> dict[str, t.Any]:
            sent.append((route, document["task_id"]))
            return {"name": "builder-t-1", "capability": "builder", "task_id": "t-1", "runtime": "scripted",
                    "branch": None, "worktree": None, "parent": "lead-1", "mode": "headless"}

    loops = WarmLoops(monkeypatch)
    monkeypatch.setattr(sling_body, "agent_channel", lambda: Remote())
    sling_body.sling(str(project.root), capability="builder", task_id="t-1", prompt="p")
    assert (sent, loops.made) == ([("sling", "t-1")], [])
    assert capsys.readouterr().out.splitlines()[0] == "slung builder-t-1 (builder on t-1, runtime scripted)"


@pytest.mark.parametrize("environ", [{"PATH": "/bin"}, {"PATH": "/bin", "OVERSTORY_AGENT_NAME": "lead-1"}], ids=repr)
def test_the_early_loops_environment_is_the_spawns(project: ProjectPaths, environ: dict[str, str]) -> None:
    from overstory.agents.spawn_steps import launch_env

    assert sling_body.launch_env(project, dict(environ)) == launch_env(project, dict(environ))
