"""The command line each runtime is started with for one headless turn.

Every runtime speaks Claude Code's stream-json protocol, so one turn runner serves
them all; only the program and a few flags differ.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from overstory.errors import RuntimeNotAvailable

RUNTIMES = ("claude", "scripted")
STREAM_FLAGS = ["-p", "--output-format", "stream-json", "--input-format", "stream-json", "--verbose",
                "--permission-mode", "bypassPermissions"]


# An agent with no worktree (the coordinator, at the project root) keeps its instructions
# and hook settings in its run dir (.overstory/run/<agent>/), never in the user's .claude/.
ROOT_INSTRUCTIONS_FILE = "CLAUDE.md"
ROOT_SETTINGS_FILE = "settings.json"


@dataclass(frozen=True)
class TurnCommand:
    argv: list[str]


def root_agent_flags(run_dir: Path) -> list[str]:
    """``--append-system-prompt TEXT --settings FILE`` for an agent working at the project root."""
    flags: list[str] = []
    instructions = run_dir / ROOT_INSTRUCTIONS_FILE
    if instructions.is_file():
        flags += ["--append-system-prompt", instructions.read_text(encoding="utf-8")]
    settings = run_dir / ROOT_SETTINGS_FILE
    if settings.is_file():
        flags += ["--settings", str(settings)]
    return flags


def turn_command(runtime: str, *, claude_bin: str = "claude", model: str | None = None,
                 resume_session_id: str | None = None, scenario: Path | None = None,
                 state_dir: Path | None = None, extra_flags: list[str] | None = None) -> TurnCommand:
    tail = list(STREAM_FLAGS)
    if model:
        tail += ["--model", model]
    if resume_session_id:
        tail += ["--resume", resume_session_id]
    tail += extra_flags or []
    if runtime == "claude":
        program = shutil.which(claude_bin) or (claude_bin if Path(claude_bin).is_file() else None)
        if program is None:
            raise RuntimeNotAvailable(
                f"the claude runtime needs `{claude_bin}` on PATH: npm install -g @anthropic-ai/claude-code "
                "(or set runtime.claude_bin, or use --runtime scripted)")
        return TurnCommand([program, *tail])
    if runtime == "scripted":
        argv = [sys.executable, "-m", "overstory.runtimes.scripted", *tail]
        if scenario is not None:
            argv += ["--scenario", str(scenario)]
        if state_dir is not None:
            argv += ["--state-dir", str(state_dir)]
        return TurnCommand(argv)
    raise RuntimeNotAvailable(f"unknown runtime {runtime!r}; choose one of: {', '.join(RUNTIMES)}")
