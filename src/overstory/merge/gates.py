"""Merge gates (config ``merge.gates``) run the merged tree, the agent's code in it: as the agents' turns do.

`ov merge` hands ``merge_branch`` a gate runner from ``sandboxed_gates``: each gate runs in the
scratch worktree of the merge, inside the agents' sandbox (``sandbox.checks``: nothing outside
that worktree writable, no agent secret, killed with the `ov merge` that runs it; a merge that
was killed leaves a record next to its scratch worktree, and its recovery kills what is left).
A branch that changes a protected path (config ``loop.protected_paths``: what the gates depend
on) is not merged while there are gates, unless the operator allows it (``ov merge
--allow-protected``; a loop's own ``--allow-protected`` paths count for its branch).
"""

from __future__ import annotations

import typing as t
from pathlib import Path

from overstory.errors import SandboxError
from overstory.sandbox.checks import run_check

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths

GateRunner = t.Callable[[str, Path, float | None], tuple[int | None, str]]
OUTPUT_LIMIT = 1 << 20


def gate_record(scratch: Path) -> Path:
    """Where a running gate of the merge in ``scratch`` records its process group."""
    return scratch.with_name(scratch.name + ".gate.json")


def sandboxed_gates(project: ProjectPaths, config: Config, *, capability: str,
                    environ: t.Mapping[str, str]) -> GateRunner:
    """A gate runner for ``merge_branch``: (command, scratch worktree, timeout) -> (exit code or None, output)."""

    def run(command: str, scratch: Path, timeout: float | None) -> tuple[int | None, str]:
        log = scratch.with_name(scratch.name + ".gate.log")
        try:
            with open(log, "w+b") as out:
                try:
                    ran = run_check(project, config, command, scratch, capability=capability, environ=environ,
                                    timeout=timeout, output=out, record=gate_record(scratch))
                except SandboxError as exc:
                    return 126, f"[ov] the gate did not run: {exc}"
                size = out.seek(0, 2)
                out.seek(max(0, size - OUTPUT_LIMIT))
                output = out.read().decode("utf-8", "replace")
            return ran.exit_code, output
        finally:
            log.unlink(missing_ok=True)

    return run


def protected_for(config: Config, loop_definition: t.Mapping[str, t.Any] | None) -> tuple[list[str], list[str]]:
    """(protected paths, paths the operator allowed) for merging a branch (of a loop: its own too)."""
    definition = loop_definition or {}
    protected = list(config.loop.protected_paths)
    protected += [p for p in definition.get("protected_paths") or [] if p not in protected]
    return protected, list(definition.get("allow_protected") or [])
