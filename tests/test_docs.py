"""The docs cannot drift from the commands: help text with examples, the README table, CI, the links between pages."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest

from conftest import REPO_ROOT
from overstory.cli.main import COMMANDS, cli

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
# The README is what a person needs in the first hours; the rest lives in docs/*.md, linked from it.
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 450

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


# ---- the pages and the links between them ------------------------------------------------------


def test_the_readme_stays_short() -> None:
    lines = len(README.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move details to docs/"


def test_the_readme_set_up_is_the_two_commands() -> None:
    """The first section is the set-up: a venv, then one command for the demo and one for the tests."""
    sections = re.split(r"^## ", README, flags=re.M)
    assert sections[1].startswith("Set-up\n"), "the README's first section is the set-up"
    blocks = [block.strip() for block in re.findall(r"```\n(.*?)```", sections[1], flags=re.S)]
    assert blocks == ["git clone <repository-url> ov\ncd ov\npython3 -m venv .venv && . .venv/bin/activate",
                      "pip install . && ov demo", "bash .ci/test"], blocks
    assert "Then two commands." in sections[1]


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {target.split("#")[0] for target in links(README)}
    missing = [page.name for page in PAGES[1:] if f"docs/{page.name}" not in linked]
    assert missing == [], f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(REPO_ROOT).as_posix())
def test_no_link_between_the_pages_is_broken(page: Path) -> None:
    assert broken_links(page, page.read_text(encoding="utf-8")) == []


def test_a_broken_link_or_anchor_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The web dashboard: `ov serve`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    text = ("[a](other.md) [b](other.md#the-web-dashboard-ov-serve) [c](other.md#twice-1) [d](#local)\n"
            "[e](missing.md) [f](other.md#nowhere) [g](#nowhere) [h](https://example.com/x.md)\n"
            "`[i](in-code.md)`\n\n```\n[j](in-a-block.md)\n```\n\n## Local\n")
    assert broken_links(page, text, tmp_path) == [
        "missing.md: no such file", "other.md#nowhere: no such heading", "#nowhere: no such heading"]


def test_anchors_follow_githubs_rules() -> None:
    assert anchors("# ov \u2014 a team of coding agents in git worktrees\n## Cost control: budgets, quotas\n"
                   "### The guard alone (`sandbox.mode: off`), measured\n## The dashboard's token\n"
                   "## See [Security](security.md)\n## Set-up\n```\n# a comment in code\n```\n## Set-up\n") == [
        "ov--a-team-of-coding-agents-in-git-worktrees", "cost-control-budgets-quotas",
        "the-guard-alone-sandboxmode-off-measured", "the-dashboards-token", "see-security", "set-up", "set-up-1"]


def prose(text: str) -> list[str]:
    """The page's lines with those of fenced code blocks (fences included) blanked."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            kept.append("")
        else:
            kept.append("" if fenced else line)
    return kept


def without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked: a link inside code is not a link."""
    return "\n".join(re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "code", line) for line in prose(text))


def links(text: str) -> list[str]:
    """The targets of the markdown links and images of a page, outside code."""
    return re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", without_code(text))


def anchors(text: str) -> list[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens, -1 on a repeat."""
    found: list[str] = []
    for match in re.finditer(r"^#{1,6}[ \t]+(.*?)[ \t#]*$", "\n".join(prose(text)), flags=re.M):
        title = match.group(1).replace("`", "")  # a code span keeps its words in the anchor
        title = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        repeats = sum(1 for earlier in found if re.fullmatch(re.escape(slug) + r"(-\d+)?", earlier))
        found.append(f"{slug}-{repeats}" if repeats else slug)
    return found


def broken_links(page: Path, text: str, root: Path = REPO_ROOT) -> list[str]:
    """Each relative link of the page whose file does not exist (in root), or whose #anchor names no heading of it."""
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:: not between the pages
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if path and (not file.exists() or root.resolve() not in file.parents):
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md":
            headings = anchors(text if file == page else file.read_text(encoding="utf-8"))
            if anchor not in headings:
                broken.append(f"{target}: no such heading")
    return broken
