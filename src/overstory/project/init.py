"""`ov init`: lay out `.overstory/` in a git repository."""

from __future__ import annotations

import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.config.model import DEFAULT_CONFIG_YAML
from overstory.errors import AlreadyInitialized, NotAGitRepository
from overstory.gitutil import current_branch, has_commit, repo_toplevel
from overstory.paths import ProjectPaths
from overstory.resources import shipped_agents_dir, shipped_templates_dir
from overstory.serve_token import ensure_token
from overstory.store.db import open_events, open_state

# Everything in .overstory/ is this machine's runtime state except what a team shares:
# the config, the role definitions and the overlay templates (and this file).
OV_GITIGNORE = """\
# Written by `ov init`. Commit config.yaml, agents/, templates/ and this file;
# everything else here (databases, logs, worktrees, run/, locks/,
# config.local.yaml) is this machine's runtime state and stays out of git.
/*
!/.gitignore
!/config.yaml
!/agents/
!/templates/
"""
SHARED = (".overstory/config.yaml", ".overstory/agents/", ".overstory/templates/", ".overstory/.gitignore")
DEFAULT_BRANCH = "main"


@dataclass
class InitReport:
    root: Path
    canonical_branch: str = DEFAULT_BRANCH
    branch_detected: bool = True
    created: list[str] = field(default_factory=list)
    overwritten: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def init_project(start: Path, *, force: bool = False, no_limits: bool = False) -> InitReport:
    """Lay out .overstory/ in the repository around ``start``; ``no_limits``: write every budget limit as null."""
    root = repo_toplevel(start)
    if not has_commit(root):
        raise NotAGitRepository(f"{root} has no commit yet; ov branches agents from a commit, so make one first")
    project = ProjectPaths(root)
    if project.is_initialized() and not force:
        raise AlreadyInitialized(f"{project.ov_dir} already exists; use `ov init --force` to restore missing or edited files")
    branch = current_branch(root)
    report = InitReport(root=root, canonical_branch=branch or DEFAULT_BRANCH, branch_detected=branch is not None)
    project.ov_dir.mkdir(exist_ok=True)
    files: dict[Path, str] = {
        project.config_file: config_text(report.canonical_branch, no_limits=no_limits),
        project.ov_dir / ".gitignore": OV_GITIGNORE,
    }
    for source_dir, target_dir in ((shipped_agents_dir(), project.agents_dir), (shipped_templates_dir(), project.templates_dir)):
        for source in sorted(source_dir.iterdir()):
            if source.is_file():
                files[target_dir / source.name] = source.read_text(encoding="utf-8")
    for path, text in files.items():
        _write_unless_edited(path, text, force=force, report=report, root=root)
    for folder in (project.worktrees_dir, project.logs_dir, project.locks_dir, project.run_dir):
        folder.mkdir(exist_ok=True)
    if ensure_token(project).created:
        report.created.append(str(project.serve_token_file.relative_to(root)))
    for opener, path in ((open_state, project.state_db), (open_events, project.events_db)):
        existed = path.exists()
        opener(path).close()
        if not existed:
            report.created.append(str(path.relative_to(root)))
    return report


def _write_unless_edited(path: Path, text: str, *, force: bool, report: InitReport, root: Path) -> None:
    """Create ``path``; an existing file that differs (the user edited it) is kept unless ``force``."""
    relative = str(path.relative_to(root))
    if path.exists():
        if path.read_text(encoding="utf-8") == text:
            return
        if not force:
            report.kept.append(relative)
            return
        report.overwritten.append(relative)
    else:
        report.created.append(relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)



def config_text(canonical_branch: str, *, no_limits: bool = False) -> str:
    """The config file `ov init` writes: the defaults, with the repository's branch as canonical
    (``no_limits``: every budget limit null, said so in a comment)."""
    import json

    import yaml

    value = canonical_branch if yaml.safe_load(canonical_branch) == canonical_branch else json.dumps(canonical_branch)
    old = f"  canonical_branch: {DEFAULT_BRANCH}\n"
    assert old in DEFAULT_CONFIG_YAML
    text = DEFAULT_CONFIG_YAML.replace(old, f"  canonical_branch: {value}\n", 1)
    if no_limits:
        head, rest = text.split("\nbudgets:\n", 1)
        budgets, tail = rest.split("\nquota:\n", 1)
        lines = [line.split(":", 1)[0] + ": null" if line.lstrip().startswith("max_") else line
                 for line in budgets.splitlines()]
        note = "  # `ov init --no-limits`: you chose no limits; write numbers here to have some.\n"
        text = f"{head}\nbudgets:\n{note}" + "\n".join(lines) + f"\n\nquota:\n{tail}"
    return text


def written_budgets(root: Path) -> dict[str, dict[str, t.Any]] | None:
    """The budget limits of the project's config.yaml ({"agent": ..., "run": ...}); None when it does not load
    (a file the user edited and `ov init` kept: `ov doctor` says what is wrong with it)."""
    from overstory.config.model import load_config
    from overstory.errors import ConfigError

    try:
        config = load_config(ProjectPaths(root).config_file, None, environ={})
    except ConfigError:
        return None
    return {"agent": config.budgets.agent.model_dump(), "run": config.budgets.run.model_dump()}


def budget_summary(limits: t.Mapping[str, t.Any]) -> str:
    """``$5.00, 50 turns, 4h of wall clock`` (the limits set of one scope), or ``no limits``."""
    parts = []
    if limits.get("max_usd") is not None:
        parts.append(f"${limits['max_usd']:.2f}")
    for key, word in (("max_turns", "turns"), ("max_tool_calls", "tool calls")):
        if limits.get(key) is not None:
            parts.append(f"{limits[key]} {word}")
    if limits.get("max_wallclock") is not None:
        hours = limits["max_wallclock"] / 3600
        parts.append(f"{hours:g}h of wall clock" if hours >= 1 else f"{limits['max_wallclock'] / 60:g}m of wall clock")
    return ", ".join(parts) if parts else "no limits"
