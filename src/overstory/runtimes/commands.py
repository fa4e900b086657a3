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


@dataclass(frozen=True)
class TurnCommand:
    argv: list[str]


def turn_command(runtime: str, *, claude_bin: str = "claude", model: str | None = None,
                 resume_session_id: str | None = None, scenario: Path | None = None,
                 state_dir: Path | None = None) -> TurnCommand:
    tail = list(STREAM_FLAGS)
    if model:
        tail += ["--model", model]
    if resume_session_id:
        tail += ["--resume", resume_session_id]
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
