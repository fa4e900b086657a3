"""What every figure gets: the mode, scratch space, the interpreter and `ov`, a process registry."""

from __future__ import annotations

import subprocess
import sys
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from harness import ProcessRegistry, clean_env

# name -> (full run, --quick run)
PARAMETERS: dict[str, tuple[t.Any, t.Any]] = {
    "fig1_rounds": (30, 6),
    "fig1_warmup": (3, 1),
    "fig2_messages": (100_000, 100_000),
    "fig2_send_batch": (1000, 300),
    "fig2_batches": (5, 3),
    "fig2_checks": (300, 60),
    "fig2_claims": (1000, 200),
    "fig3_api_per_worker": (400, 100),
    "fig3_api_runs": (3, 2),
    "fig3_cli_per_worker": (6, 2),
    "fig3_cli_runs": (2, 1),
    "fig4_ticks": (30, 10),
    "fig5_files": (5000, 5000),
    "fig5_spawns": (5, 2),
    "fig6_idle_agents": (50, 10),
    "fig6_watch_rounds": (10, 4),
    "fig7_agents": (50, 25),
    "fig7_runs": (3, 1),
    "fig8_agents": (10, 10),
    "fig8_clients": (20, 20),
    "fig8_lines": (30, 20),
    "fig8_runs": (2, 1),
    "fig8_synthetic_runs": (3, 1),
    "fig8_idle_seconds": (10, 3),
    "fig9_repeat": (7, 3),
    "fig9_rounds": (10, 4),
    "fig10_calls": (60, 30),
    "fig10_rounds": (8, 2),
    "fig11_rounds": (30, 8),
    "fig12_rounds": (7, 3),
    "fig13_rounds": (3, 1),
    "fig13_warmup": (1, 1),
}


@dataclass
class Context:
    quick: bool
    scratch: Path
    ov: str
    registry: ProcessRegistry = field(default_factory=ProcessRegistry)
    python: str = sys.executable

    def p(self, name: str) -> t.Any:
        full, quick = PARAMETERS[name]
        return quick if self.quick else full

    def env(self, **extra: str) -> dict[str, str]:
        """The bench environment (bytecode setting as the caller has it) for `ov` processes."""
        return clean_env("asis", **extra)

    def ov_run(self, *args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.ov, *args], cwd=cwd, env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"ov {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
        return done
