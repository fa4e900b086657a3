"""The docs cannot drift from the commands: help text with examples, the README table, CI."""

from __future__ import annotations

import importlib.util
import re
import shlex

import click
import pytest

from conftest import REPO_ROOT
from overstory.cli.main import COMMANDS, cli

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")

# Every command of the table; one whose module is missing fails test_every_command_has_its_module.
EXISTING = sorted(COMMANDS)


@pytest.mark.parametrize("name", EXISTING)
def test_every_command_has_its_module(name: str) -> None:
    module = COMMANDS[name][0]
    assert importlib.util.find_spec(module) is not None, f"`ov {name}` names {module}, which does not exist"


def load(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli, info_name="ov"), name)
    assert command is not None, f"{name} is in COMMANDS but does not load"
    return command


def with_subcommands(path: tuple[str, ...], command: click.Command) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=path[-1])
        for sub in command.list_commands(ctx):
            found += with_subcommands((*path, sub), command.get_command(ctx, sub))  # type: ignore[arg-type]
    return found


def readme_table_commands() -> set[str]:
    """Top-level command names in the first cell of README table rows (`ov NAME ...`)."""
    names = set()
    for line in README.splitlines():
        match = re.match(r"^\|\s*`ov ([a-z][a-z0-9-]*)", line)
        if match:
            names.add(match.group(1))
    return names


def test_the_foundation_commands_exist() -> None:
    assert {"init", "doctor", "config"} <= set(EXISTING)


@pytest.mark.parametrize("name", EXISTING)
def test_command_help_has_an_example(name: str) -> None:
    for path, command in with_subcommands((name,), load(name)):
        label = "ov " + " ".join(path)
        text = command.help or ""
        assert text.strip(), f"{label} has no docstring"
        assert "\b" in text, f"{label}: put the examples in a \\b block so click keeps their lines"
        example = re.compile(rf"(^|[\s\"'`]){re.escape(label)}([\s\"'`]|$)")
        example_lines = [line for block in text.split("\b")[1:] for line in block.splitlines()]
        assert any(example.search(line) for line in example_lines), f"{label}: the \\b block has no `{label} ...` example"


@pytest.mark.parametrize("name", EXISTING)
def test_command_is_in_the_readme_table(name: str) -> None:
    assert name in readme_table_commands(), f"README.md's command table has no row for `ov {name}`"


def test_readme_table_names_only_real_commands() -> None:
    stale = readme_table_commands() - set(COMMANDS)
    assert stale == set(), f"README.md documents commands that do not exist: {sorted(stale)}"


def test_short_help_in_the_table_matches_the_commands() -> None:
    """COMMANDS carries each command's one-line help (for a lazy `ov --help`); it must not be empty."""
    for name in EXISTING:
        assert COMMANDS[name][2].strip(), name


def test_ci_runs_the_readme_test_command() -> None:
    ci_run = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci_run.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    last = commands[-1].removeprefix("exec ").strip()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S)
    readme_commands = {line.strip() for block in blocks for line in block.splitlines() if line.strip()}
    assert last in readme_commands, f".ci/run runs {last!r}, which the README does not show"
    target = shlex.split(last)[-1]
    assert (REPO_ROOT / target).is_file(), f"{target} (run by .ci/run) does not exist"
