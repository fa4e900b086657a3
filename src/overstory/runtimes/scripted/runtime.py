"""The ``scripted`` runtime's adapter: a built-in stand-in for the claude CLI that plays a scenario file.

It speaks the same stream-json and runs the same hooks as claude (so it reuses the
claude adapter's parser, with one extension in ``stream``, and its settings), needs no
model and no key, and is headless only. The player itself is
``overstory.runtimes.scripted.player``.
"""

from __future__ import annotations

import sys
import typing as t
from pathlib import Path

from overstory.runtimes.base import RuntimeProbe, Tui, TurnParser, TurnRequest
from overstory.runtimes.claude import ClaudeRuntime

if t.TYPE_CHECKING:
    from overstory.config.model import Config


class ScriptedRuntime(ClaudeRuntime):
    name = "scripted"
    tmp_env_vars = ()
    # Its turns play a scenario by the session's count of finished turns: a fork plays its own from the start.
    session_fork = None

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.scripted.stream import ScriptedTurnStream

        return ScriptedTurnStream()

    def program(self, config: Config) -> list[str]:
        return [sys.executable, "-m", "overstory.runtimes.scripted"]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        argv = [*self.program(config), *self._flags(request)]
        if request.scenario is not None:
            argv += ["--scenario", str(request.scenario)]
        return [*argv, "--state-dir", str(self.state_dir(request.run_dir))]

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        return {}

    def state_dir(self, run_dir: Path) -> Path | None:
        return run_dir / "scripted"

    def prepare_state(self, state_dir: Path, environ: t.Mapping[str, str], cwd: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)

    @property
    def tui(self) -> Tui | None:
        return None

    def default_scenario(self, capability: str, task_id: str) -> dict[str, t.Any] | None:
        from overstory.runtimes.scripted.scenarios import default_scenario

        return default_scenario(capability, task_id)

    def check_scenario(self, text: str, *, yaml: bool) -> None:
        from overstory.runtimes.scripted.scenario_shape import parse, problem

        found = problem(parse(text, yaml=yaml))
        if found:
            raise ValueError(found)

    def probe(self, config: Config | None) -> RuntimeProbe:
        return RuntimeProbe(self.name, "ok", "built in", "not needed")
