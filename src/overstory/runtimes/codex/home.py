"""The ``config.toml`` of one codex agent's ov-owned ``CODEX_HOME``.

What it holds and why (facts in tests/fixtures/CODEX_PROBE_NOTES.md):

- one model provider, ``ov``, speaking the Responses API. Its key comes from
  ``OV_CODEX_API_KEY``; its ``base_url`` is OpenAI's unless the agent's provider names
  another, which each turn passes as ``-c model_providers.ov.base_url=...``;
- update checks, analytics and the plugin sync off (the only outside traffic codex
  attempts besides the model), login shells and the shell snapshot off, and codex's own
  sub-agents off (ov agents delegate through ``ov sling``);
- a permission profile for codex's own sandbox (bubblewrap and seccomp around every
  tool command): everything readable, nothing writable except ov's database directory,
  the temp dirs and, for writers, the agent's worktree and the git metadata a commit
  in it writes. Other agents' worktrees and the run dirs (this config included) stay
  read-only. Read-only agents can therefore still send mail, and writers can commit;
- a ``PreToolUse`` hook that runs ``ov guard`` before every tool call (codex reports
  shell commands, apply_patch included, as ``Bash`` with Claude's hook JSON).

TOML is written by hand (the standard library reads TOML but cannot write it); every
string goes through ``_q``, which produces a valid TOML basic string.
"""

from __future__ import annotations

import json
import subprocess
import typing as t
from pathlib import Path

from overstory.runtimes.common import guard_hook_command

if t.TYPE_CHECKING:
    from overstory.runtimes.base import AgentSetup

PROVIDER = "ov"
KEY_ENV = "OV_CODEX_API_KEY"
BASE_URL_ENV = "OV_CODEX_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
PROFILE = "ov"
HOOK_TIMEOUT_SECONDS = 60


def _q(text: str | Path) -> str:
    return json.dumps(str(text), ensure_ascii=False)


def git_write_dirs(worktree: Path) -> list[Path]:
    """The directories a commit in ``worktree`` writes: its own admin dir under the main repository's
    ``.git/worktrees/`` and the shared objects, refs and logs."""
    try:
        result = subprocess.run(["git", "rev-parse", "--absolute-git-dir", "--git-common-dir"], cwd=worktree,
                                capture_output=True, text=True, check=False)
    except OSError:  # no worktree (yet), or no git: nothing a commit could write
        return []
    lines = result.stdout.splitlines()
    if result.returncode != 0 or len(lines) != 2:
        return []
    git_dir = Path(lines[0])
    common = Path(lines[1]) if Path(lines[1]).is_absolute() else (worktree / lines[1])
    common = common.resolve()
    return [git_dir, common / "objects", common / "refs", common / "logs"]


def filesystem_rules(setup: AgentSetup, tmp_dir: Path) -> list[tuple[Path | str, str]]:
    """The permission profile's entries, broadest first (codex applies the most specific one)."""
    ov_dir = setup.project_root / ".overstory"
    rules: list[tuple[Path | str, str]] = [
        (":root", "read"),
        (":slash_tmp", "write"),
        (":tmpdir", "write"),
        (setup.project_root, "read"),   # a project under /tmp stays read-only
        (ov_dir, "write"),              # state.db and its WAL files: `ov mail send`
        (ov_dir / "worktrees", "read"),
        (ov_dir / "run", "read"),       # every agent's config, this one's included
        (tmp_dir, "write"),
    ]
    if setup.writable and setup.worktree is not None:
        rules.append((setup.worktree, "write"))
        rules += [(path, "write") for path in git_write_dirs(setup.worktree)]
    return rules


def config_toml(setup: AgentSetup, tmp_dir: Path) -> str:
    lines = [
        "# Written by ov sling for this agent; ov owns this CODEX_HOME. Edit .overstory/config.yaml instead.",
        f"model_provider = {_q(PROVIDER)}",
        "check_for_update_on_startup = false",
        "allow_login_shell = false",
        f"default_permissions = {_q(PROFILE)}",
        "",
        "[analytics]",
        "enabled = false",
        "",
        "[features]",
        "plugins = false",
        "shell_snapshot = false",
        "multi_agent = false  # codex's own sub-agents: ov agents delegate with `ov sling`",
        "",
        f"[model_providers.{PROVIDER}]",
        'name = "ov"',
        f"base_url = {_q(DEFAULT_BASE_URL)}",
        f"env_key = {_q(KEY_ENV)}",
        'wire_api = "responses"',
        "",
        f"[permissions.{PROFILE}.filesystem]",
    ]
    lines += [f"{_q(path)} = {_q(access)}" for path, access in filesystem_rules(setup, tmp_dir)]
    lines += [
        "",
        "[[hooks.PreToolUse]]",
        "[[hooks.PreToolUse.hooks]]",
        'type = "command"',
        f"command = {_q(guard_hook_command(setup.ov_command))}",
        f"timeout = {HOOK_TIMEOUT_SECONDS}",
        "",
    ]
    return "\n".join(lines)
