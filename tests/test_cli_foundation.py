"""The `ov` command line: version/help, init, doctor, error reporting and --json.

Each behaviour is checked in process with click's CliRunner (on the `cli` group, and
through `main`, which owns the error boundary) and as a real `ov` subprocess.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import typing as t
from contextlib import closing
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conftest import make_repo, ov_command, run_git, run_ov
from overstory import __version__
from overstory.cli.main import COMMANDS, cli, main
from overstory.config.model import DEFAULT_CONFIG_YAML
from overstory.errors import AlreadyInitialized, NotAGitRepository, ProjectNotFound
from overstory.paths import ProjectPaths
from overstory.project.init import OV_GITIGNORE
from overstory.resources import shipped_agents_dir, shipped_templates_dir

# Commands that start agents, loops or dashboards: never run blind with only --json.
STARTS_THINGS = {"watch", "watchdog", "agent-loop", "demo", "attach", "sling", "coordinator", "merge", "stop",
                 "nudge"}


def call_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run ``main`` in process; it always ends in SystemExit."""
    with pytest.raises(SystemExit) as caught:
        main(args)
    captured = capsys.readouterr()
    code = caught.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), captured.out, captured.err


def walk_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> t.Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command reachable from ``group`` (lazy ones included), as (argv path, command)."""
    ctx = click.Context(group, info_name="ov")
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"{' '.join(prefix + (name,))} is listed but cannot be loaded"
        yield prefix + (name,), command
        if isinstance(command, click.Group):
            yield from walk_commands(command, prefix + (name,))


def assert_one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one error line, got: {stderr!r}"
    assert lines[0].startswith("ov: error: "), lines[0]
    assert "Traceback" not in stderr
    return lines[0]


def shipped_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file())


# ---- version and help -----------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"ov {__version__}"
    assert call_main(["--version"], capsys) == (0, f"ov {__version__}\n", "")
    process = run_ov("--version", cwd=tmp_path)
    assert (process.returncode, process.stdout.strip()) == (0, f"ov {__version__}")


def test_help_lists_the_available_commands(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in ("init", "doctor", "config"):
        assert f"  {name} " in result.output
    assert "agent-loop" not in result.output, "internal commands stay out of the help"
    code, out, _ = call_main(["-h"], capsys)
    assert code == 0 and out.startswith("Usage: ov ") and "  init " in out
    process = run_ov("--help", cwd=tmp_path)
    assert process.returncode == 0 and "Commands:" in process.stdout


def test_help_does_not_import_the_commands() -> None:
    """`ov --help` lists commands from the table alone: no command module is imported."""
    import subprocess
    import sys

    probe = ("import sys; from click.testing import CliRunner; from overstory.cli.main import cli; "
             "r = CliRunner().invoke(cli, ['--help']); assert r.exit_code == 0; "
             "print(sorted(m for m in sys.modules if m.startswith('overstory.cli.') and m not in "
             "('overstory.cli.main',)))")
    output = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_help_of_every_command_exits_0(tmp_path: Path) -> None:
    commands = list(walk_commands())
    assert {path[0] for path, _ in commands} >= {"init", "doctor", "config"}
    runner = CliRunner()
    for path, _ in commands:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, f"ov {' '.join(path)} --help: {result.output}{result.exception!r}"
        assert "Usage:" in result.output
    for path, _ in commands:
        if len(path) == 1:  # and once more through a real process, the way users run them
            process = run_ov(*path, "--help", cwd=tmp_path)
            assert process.returncode == 0, f"ov {path[0]} --help: {process.stderr}"


def test_listed_commands_match_the_table() -> None:
    ctx = click.Context(cli, info_name="ov")
    listed = cli.list_commands(ctx)
    assert set(listed) <= set(COMMANDS)
    for name in listed:
        assert cli.get_command(ctx, name).name == name, f"COMMANDS[{name!r}] points at a command named otherwise"  # type: ignore[union-attr]


def test_python_dash_m(tmp_path: Path) -> None:
    import subprocess
    import sys

    process = subprocess.run([sys.executable, "-m", "overstory", "--version"], capture_output=True, text=True,
                             cwd=tmp_path)
    assert (process.returncode, process.stdout.strip()) == (0, f"ov {__version__}")


# ---- init -----------------------------------------------------------------------


def assert_initialized(root: Path) -> None:
    ov = root / ".overstory"
    assert (ov / "config.yaml").read_text() == DEFAULT_CONFIG_YAML
    assert (ov / ".gitignore").read_text() == OV_GITIGNORE
    for name in ("state.db", "events.db"):
        conn = sqlite3.connect(str(ov / name))
        try:
            assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            conn.close()
    for shipped, copied in ((shipped_agents_dir(), ov / "agents"), (shipped_templates_dir(), ov / "templates")):
        names = shipped_files(shipped)
        if names:
            assert shipped_files(copied) == names
            for name in names:
                assert (copied / name).read_text() == (shipped / name).read_text()


def test_init_as_subprocess(git_repo: Path) -> None:
    result = run_ov("init", cwd=git_repo)
    assert result.returncode == 0, result.stderr
    assert ".overstory" in result.stdout
    assert_initialized(git_repo)


def test_init_with_cli_runner(git_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(git_repo)
    result = CliRunner().invoke(cli, ["init", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert Path(report["root"]) == git_repo.resolve()
    assert {".overstory/config.yaml", ".overstory/.gitignore", ".overstory/state.db",
            ".overstory/events.db"} <= set(report["created"])
    assert report["overwritten"] == [] and report["kept"] == []
    assert_initialized(git_repo)


def test_init_from_a_subdirectory_initializes_the_repository_root(git_repo: Path) -> None:
    sub = git_repo / "src" / "deep"
    sub.mkdir(parents=True)
    result = run_ov("init", cwd=sub)
    assert result.returncode == 0, result.stderr
    assert_initialized(git_repo)
    assert not (sub / ".overstory").exists()


def test_gitignore_keeps_runtime_state_out_of_git(git_repo: Path) -> None:
    assert run_ov("init", cwd=git_repo).returncode == 0
    ov = git_repo / ".overstory"
    for relative in ("logs/a/t1/stdout.ndjson", "worktrees/builder-1/file.py", "run/x.pid", "locks/merge.lock",
                     "config.local.yaml"):
        (ov / relative).parent.mkdir(parents=True, exist_ok=True)
        (ov / relative).write_text("x")
    tracked = run_git(git_repo, "status", "--porcelain", "--untracked-files=all", ".overstory").splitlines()
    paths = sorted(line[3:] for line in tracked)
    assert ".overstory/config.yaml" in paths and ".overstory/.gitignore" in paths
    leaked = [p for p in paths if p.endswith((".db", "-wal", "-shm")) or
              p.split("/")[1] in ("logs", "worktrees", "run", "locks", "config.local.yaml")]
    assert leaked == []


def test_second_init_says_already_initialized(git_repo: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run_ov("init", cwd=git_repo).returncode == 0
    second = run_ov("init", cwd=git_repo)
    assert second.returncode != 0
    assert "already" in assert_one_error_line(second.stderr)
    assert "--force" in second.stderr

    monkeypatch.chdir(git_repo)
    result = CliRunner().invoke(cli, ["init"])
    assert result.exit_code == 1 and isinstance(result.exception, AlreadyInitialized)
    code, out, err = call_main(["init"], capsys)
    assert code == 1 and out == "" and "already" in assert_one_error_line(err)


def test_force_restores_and_overwrites_while_plain_init_keeps_edits(git_repo: Path) -> None:
    assert run_ov("init", cwd=git_repo).returncode == 0
    ov = git_repo / ".overstory"
    conn = sqlite3.connect(str(ov / "state.db"))
    conn.execute("INSERT INTO generations(name, generation) VALUES ('keep-me', 4)")
    conn.commit()
    conn.close()

    # Plain init (the project looks uninitialized: config.yaml is gone) restores what is
    # missing but keeps a file the user edited.
    (ov / "config.yaml").unlink()
    (ov / ".gitignore").write_text("# my own rules\n*.db\n")
    plain = run_ov("init", "--json", cwd=git_repo)
    assert plain.returncode == 0, plain.stderr
    report = json.loads(plain.stdout)
    assert ".overstory/config.yaml" in report["created"]
    assert report["kept"] == [".overstory/.gitignore"]
    assert (ov / ".gitignore").read_text() == "# my own rules\n*.db\n"
    assert (ov / "config.yaml").read_text() == DEFAULT_CONFIG_YAML

    # --force restores a deleted file and overwrites an edited one …
    (ov / "config.yaml").write_text("turns:\n  stall_timeout: 1\n")
    forced = run_ov("init", "--force", cwd=git_repo)
    assert forced.returncode == 0, forced.stderr
    assert "overwrote" in forced.stdout
    assert_initialized(git_repo)
    (ov / ".gitignore").unlink()
    assert run_ov("init", "--force", cwd=git_repo).returncode == 0
    assert (ov / ".gitignore").read_text() == OV_GITIGNORE
    # … but never throws away the databases.
    conn = sqlite3.connect(str(ov / "state.db"))
    assert conn.execute("SELECT generation FROM generations WHERE name='keep-me'").fetchone()[0] == 4
    conn.close()


def test_init_outside_a_git_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    result = run_ov("init", cwd=plain, env={"GIT_CEILING_DIRECTORIES": str(tmp_path)})
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr)
    assert "not inside a git repository" in line and "git init" in line
    assert not (plain / ".overstory").exists()

    monkeypatch.chdir(plain)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    runner_result = CliRunner().invoke(cli, ["init"])
    assert runner_result.exit_code == 1 and isinstance(runner_result.exception, NotAGitRepository)
    code, _, err = call_main(["init"], capsys)
    assert code == 1 and "git repository" in assert_one_error_line(err)


def test_init_in_a_repository_without_a_commit(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run_git(empty, "init", "-q", "-b", "main")
    result = run_ov("init", cwd=empty)
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr)
    assert "no commit" in line
    assert not (empty / ".overstory").exists()


# ---- doctor ---------------------------------------------------------------------


def test_doctor_json(project: ProjectPaths, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_ov("doctor", "--json", cwd=project.root)
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert document["ok"] is True
    names = [check["name"] for check in document["checks"]]
    assert {"python", "git", "tmux", "claude", "config", "state.db", "events.db"} <= set(names)
    for check in document["checks"]:
        assert set(check) >= {"name", "status", "detail", "hint"}
        assert check["status"] in ("ok", "warn", "fail")

    code, out, _ = call_main(["--project", str(project.root), "doctor", "--json"], capsys)
    assert code == 0 and json.loads(out)["ok"] is True


@pytest.mark.parametrize(("version", "status"), [("2.1.197 (Claude Code)", "warn"), ("2.1.295 (Claude Code)", "ok"),
                                                ("2.1.330 (Claude Code)", "ok")])
def test_doctor_warns_about_a_claude_older_than_ov_supports(project: ProjectPaths, tmp_path: Path,
                                                             version: str, status: str) -> None:
    fake = tmp_path / "claude"
    fake.write_text(f"#!/bin/sh\necho '{version}'\n")
    fake.chmod(0o755)
    result = run_ov("doctor", "--json", cwd=project.root,
                    env={"OV_RUNTIME_CLAUDE_BIN": str(fake), "ANTHROPIC_API_KEY": "sk-ant-test"})
    (claude,) = [check for check in json.loads(result.stdout)["checks"] if check["name"] == "claude"]
    assert claude["status"] == status, claude
    if status == "warn":
        assert "older than 2.1.295" in claude["detail"] and "HTTP hooks" in claude["detail"]
        assert "2.1.295" in claude["hint"]


def test_doctor_says_whether_claude_has_a_key_or_a_login(project: ProjectPaths, tmp_path: Path) -> None:
    fake = tmp_path / "claude"
    fake.write_text("#!/bin/sh\necho '2.1.330 (Claude Code)'\n")
    fake.chmod(0o755)
    bare = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN",
                                                            "CLAUDE_CODE_OAUTH_TOKEN")}
    bare.update({"OV_RUNTIME_CLAUDE_BIN": str(fake), "CLAUDE_CONFIG_DIR": str(tmp_path / "no-login")})
    done = subprocess.run([*ov_command(), "doctor", "--json"], cwd=project.root, env=bare, capture_output=True,
                          text=True, timeout=60)
    (claude,) = [check for check in json.loads(done.stdout)["checks"] if check["name"] == "claude"]
    assert claude["status"] == "warn" and "no login found" in claude["detail"] and "ANTHROPIC_API_KEY" in claude["hint"]
    (tmp_path / "login").mkdir()
    (tmp_path / "login" / ".credentials.json").write_text("{}")
    done = subprocess.run([*ov_command(), "doctor", "--json"], cwd=project.root, capture_output=True, text=True,
                          env={**bare, "CLAUDE_CONFIG_DIR": str(tmp_path / "login")}, timeout=60)
    (claude,) = [check for check in json.loads(done.stdout)["checks"] if check["name"] == "claude"]
    assert claude["status"] == "ok" and "logged in" in claude["detail"]


def test_doctor_text_has_a_line_per_check(project: ProjectPaths) -> None:
    result = run_ov("doctor", cwd=project.root)
    assert result.returncode == 0
    assert "[ok  ] state.db" in result.stdout and "[ok  ] config" in result.stdout


def test_doctor_fails_on_a_corrupt_database(project: ProjectPaths) -> None:
    project.events_db.write_bytes(b"garbage " * 4096)
    result = run_ov("doctor", "--json", cwd=project.root)
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["ok"] is False
    events = next(check for check in document["checks"] if check["name"] == "events.db")
    assert events["status"] == "fail" and events["hint"]
    state = next(check for check in document["checks"] if check["name"] == "state.db")
    assert state["status"] == "ok"
    text = run_ov("doctor", cwd=project.root)
    assert text.returncode == 1 and "FAIL" in text.stdout and "fix:" in text.stdout


def test_doctor_fails_on_a_bad_config(project: ProjectPaths) -> None:
    project.local_config_file.write_text("turns:\n  stall_timeout: soon\n")
    result = run_ov("doctor", "--json", cwd=project.root)
    assert result.returncode == 1
    config = next(check for check in json.loads(result.stdout)["checks"] if check["name"] == "config")
    assert config["status"] == "fail" and "stall_timeout" in config["detail"]


def test_doctor_outside_a_project_still_reports(tmp_path: Path) -> None:
    result = run_ov("doctor", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    project = next(check for check in json.loads(result.stdout)["checks"] if check["name"] == "project")
    assert project["status"] == "warn"


def test_doctor_states_prints_the_transition_table(tmp_path: Path) -> None:
    from overstory.store.sessions import ALLOWED_FROM

    result = run_ov("doctor", "--states", "--json", cwd=tmp_path)
    assert result.returncode == 0
    assert {to: set(sources) for to, sources in json.loads(result.stdout).items()} == \
        {to: set(sources) for to, sources in ALLOWED_FROM.items()}


# ---- the error boundary --------------------------------------------------------


def test_user_errors_are_one_line_on_stderr_with_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    result = run_ov("config", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert "no ov project found" in assert_one_error_line(result.stderr)

    monkeypatch.chdir(tmp_path)
    code, out, err = call_main(["config"], capsys)
    assert (code, out) == (1, "")
    assert_one_error_line(err)
    runner_result = CliRunner().invoke(cli, ["config"])
    assert runner_result.exit_code == 1 and isinstance(runner_result.exception, ProjectNotFound)


def test_a_multi_line_error_is_folded_into_one_line(project: ProjectPaths) -> None:
    project.local_config_file.write_text("turns:\n  stall_timeout: soon\n  bogus: 1\n")
    result = run_ov("config", cwd=project.root)
    assert result.returncode == 1
    line = assert_one_error_line(result.stderr)
    assert "config.local.yaml" in line and "stall_timeout" in line and "bogus" in line


@pytest.mark.parametrize("args", [["nosuch"], ["init", "--bogus"], ["doctor", "extra"], ["--project"]])
def test_usage_errors_exit_2(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_ov(*args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Error:" in result.stderr and result.stdout == ""
    code, out, err = call_main(args, capsys)
    assert (code, out) == (2, "") and "Error:" in err
    assert CliRunner().invoke(cli, args).exit_code == 2


@pytest.mark.parametrize("how", ["-v", "--verbose", "OV_DEBUG=1"])
def test_debug_shows_the_traceback(how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    args, env = (["config"], {"OV_DEBUG": "1"}) if how.startswith("OV_") else ([how, "config"], {})
    result = run_ov(*args, cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert "ProjectNotFound" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("ov: error: ")

    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, _, err = call_main(args, capsys)
    assert code == 1 and "Traceback" in err


def test_no_traceback_without_debug(tmp_path: Path) -> None:
    result = run_ov("config", cwd=tmp_path, env={"OV_DEBUG": "0"})
    assert result.returncode == 1
    assert_one_error_line(result.stderr)


# ---- --json everywhere ------------------------------------------------------------


def json_option_of(command: click.Command) -> click.Parameter | None:
    return next((param for param in command.params if "--json" in getattr(param, "opts", [])), None)


def json_commands() -> list[tuple[tuple[str, ...], click.Command]]:
    """Commands with a --json flag and no required parameter (they can run with --json alone)."""
    found = []
    for path, command in walk_commands():
        if isinstance(command, click.Group) or path[0] in STARTS_THINGS:
            continue
        if json_option_of(command) is not None and not any(param.required for param in command.params):
            found.append((path, command))
    return found


def assert_json_output(label: str, stdout: str, *, ndjson: bool) -> None:
    """One JSON document; or, for a --json whose help declares NDJSON, one document per line."""
    try:
        if ndjson:
            for line in stdout.splitlines():
                json.loads(line)
        else:
            json.loads(stdout)
    except ValueError:
        kind = "NDJSON" if ndjson else "one JSON document"
        pytest.fail(f"{label} printed something that is not {kind}: {stdout[:300]!r}")


def test_every_json_output_parses(project: ProjectPaths) -> None:
    from overstory.store import events, sessions
    from overstory.store.db import open_events, open_state

    # Something to show: one agent with a little history and one event.
    with closing(open_state(project.state_db)) as state, closing(open_events(project.events_db)) as event_store:
        generation = sessions.create_session(state, name="builder-json", capability="builder", task_id="task-json",
                                             runtime="scripted", actor="test")
        sessions.transition(state, "builder-json", generation, "in_turn", actor="test")
        sessions.transition(state, "builder-json", generation, "completed", actor="test", reason="done")
        events.record(event_store, "turn_end", agent="builder-json", generation=generation, summary="ok")
    checked = []
    for path, command in json_commands():
        result = run_ov(*path, "--json", cwd=project.root, timeout=30)
        label = f"ov {' '.join(path)} --json"
        ndjson = "NDJSON" in (getattr(json_option_of(command), "help", "") or "")
        if result.returncode == 0:
            assert_json_output(label, result.stdout, ndjson=ndjson)
        else:
            assert result.returncode in (1, 2), f"{label}: exit {result.returncode}: {result.stderr}"
            if result.stdout.strip():
                assert_json_output(label, result.stdout, ndjson=ndjson)
            # With --json an error is JSON too: one line, {"error": {"kind", "message"}} (issue 32).
            error = json.loads(result.stderr.strip().splitlines()[-1])["error"]
            assert set(error) == {"kind", "message"} and error["message"], result.stderr
        checked.append(path)
    assert {("doctor",), ("config",), ("init",)} <= set(checked)


def test_config_json_variants(project: ProjectPaths) -> None:
    from overstory.config.model import Config

    effective = run_ov("config", "--json", cwd=project.root, env={"OV_TURNS_STALL_TIMEOUT": "30"})
    assert effective.returncode == 0, effective.stderr
    assert json.loads(effective.stdout)["turns"]["stall_timeout"] == 30
    defaults = run_ov("config", "--defaults", "--json", cwd=project.root)
    assert defaults.returncode == 0
    assert json.loads(defaults.stdout) == Config().model_dump()
    plain_defaults = run_ov("config", "--defaults", cwd=project.root)
    assert plain_defaults.stdout == DEFAULT_CONFIG_YAML


def test_init_json_in_a_fresh_repository(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "fresh")
    result = run_ov("init", "--json", cwd=repo)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["created"]


def test_doctor_warns_but_passes_when_a_database_is_not_created_yet(project) -> None:
    """A fresh clone of a repository that commits .overstory/ has no databases (they are git-ignored)."""
    import json as _json

    from conftest import run_ov

    project.events_db.unlink()
    result = run_ov("doctor", "--json", cwd=project.root)
    assert result.returncode == 0, result.stdout
    check = next(c for c in _json.loads(result.stdout)["checks"] if c["name"] == "events.db")
    assert check["status"] == "warn" and "does not exist yet" in check["detail"]
