"""A run on disk, readable without ov: each turn's ``metadata.json`` and each ended run's ``summary.txt``.

- ``.overstory/logs/<agent>/<turn_id>/metadata.json``: written when the turn settles (``turns._settle``),
  beside the turn's prompt, command line and raw output: who ran it (agent, task, run, capability),
  with what (runtime, model, session), how it ended (status, reason, exit code) and what it cost
  (dollars, tokens, tool calls).
- ``.overstory/runs/<run_id>/summary.txt``: written when the run ends (``ov coordinator stop``,
  ``ov run complete``): its agents, their outcomes, turns, tokens and cost (``ov run show``'s figures);
  its trace is exported just before (``run_ended``).

Both are written to a temporary file in the same folder, flushed, and renamed over the target, so a
process that dies while writing leaves either no file (or the previous one) or the whole new one,
never half a file; at worst a ``.*.tmp`` beside it, removed by the next write. A run whose process
died after the run was completed but before its summary was written gets it from the watchdog's
next tick (``write_missing_summaries``). Failing to write either file never fails the turn or the run:
the database is the record, these files are a copy for people.
"""

from __future__ import annotations

import os
import typing as t
from pathlib import Path

from overstory import jsontext
from overstory.errors import OrchestratorError
from overstory.store.sqlite_module import sqlite3

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths
    from overstory.store.sessions import Session

METADATA = "metadata.json"
SUMMARY = "summary.txt"
# The test hook for "the process dies while writing": exit after the temporary file is written, before the rename.
DIE_WRITING_ENV = "OV_TEST_DIE_WRITING"


def write_atomically(path: Path, text: str) -> None:
    """``text`` at ``path`` whole or not at all (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    if os.environ.get(DIE_WRITING_ENV) == path.name:
        os._exit(9)  # crash-safety tests: the temporary file is complete, the target not yet replaced
    os.replace(temporary, path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer that died before its rename
        try:
            stale.unlink()
        except OSError:
            pass


def turn_metadata(agent: Session, turn_id: str, *, started_ms: int, ended_ms: int, **fields: t.Any) -> dict[str, t.Any]:
    """What ``metadata.json`` holds: the agent's side (who, in which run, on which runtime) and the turn's."""
    from overstory.clock import iso

    return {"agent": agent.name, "generation": agent.generation, "task": agent.task_id, "run": agent.run_id,
            "capability": agent.capability, "parent": agent.parent, "runtime": agent.runtime, "turn": turn_id,
            "started_at": iso(started_ms), "ended_at": iso(ended_ms), **fields}


def write_turn_metadata(log_dir: Path, metadata: t.Mapping[str, t.Any]) -> bool:
    """The turn's ``metadata.json``; False (nothing raised) when it could not be written."""
    try:
        write_atomically(log_dir / METADATA, jsontext.dumps(dict(metadata), indent=2, ensure_ascii=False, default=str)
                         + "\n")
    except OSError:
        return False
    return True


def run_folder(project: ProjectPaths, run_id: str) -> Path:
    return project.ov_dir / "runs" / run_id


def write_run_summary(project: ProjectPaths, conn: sqlite3.Connection, run_id: str) -> Path | None:
    """The run's ``summary.txt`` from the database; None when the run or the file could not be had."""
    from overstory.store import runs

    try:
        run = runs.get_run(conn, run_id)
        if run is None:
            return None
        text = summary_text(runs.report(conn, run))
        path = run_folder(project, run_id) / SUMMARY
        write_atomically(path, text)
    except (OSError, sqlite3.Error, OrchestratorError):
        return None
    return path


def run_ended(project: ProjectPaths, conn: sqlite3.Connection, run_id: str, config: Config | None) -> Path | None:
    """What a run's end leaves: its trace exported (when tracing is on, ``overstory.project.telemetry``), then its
    ``summary.txt``. In that order: a crash between them exports the trace again with the summary (at least once)."""
    from overstory.project.telemetry import export_run_quietly

    export_run_quietly(conn, run_id, config)
    return write_run_summary(project, conn, run_id)


def write_missing_summaries(project: ProjectPaths, conn: sqlite3.Connection, config: Config | None = None) -> list[str]:
    """Ended runs without a ``summary.txt`` (their process died before writing it) get one; their ids."""
    from overstory.store import runs

    written = []
    for row in runs.ended(conn):
        if not (run_folder(project, row["id"]) / SUMMARY).exists() and run_ended(project, conn, row["id"], config):
            written.append(row["id"])
    return written


def summary_text(report: t.Mapping[str, t.Any]) -> str:
    """``ov run show``'s figures as plain text, one agent and one turn per line."""
    info, totals = report["run"], report["totals"]
    lines = [f"run {info['id']}: {info['status']}",
             f"coordinator: {info['coordinator'] or '-'}",
             f"started: {info['started_at']}", f"completed: {info['completed_at'] or '-'}",
             f"duration: {_seconds(info['duration_seconds'])}",
             f"agents: {totals['agents']} ({', '.join(f'{n} {s}' for s, n in totals['by_state'].items()) or 'none'})",
             f"turns: {totals['turns']} ({totals['turns_ok']} ok)",
             f"tokens: {totals['input_tokens']} in, {totals['output_tokens']} out",
             f"cost: ${totals['cost_usd']:.4f}", f"mail: {totals['mail']}", "", "agents:"]
    for agent in report["agents"]:
        reason = f" ({_one_line(agent['state_reason'])})" if agent["state_reason"] else ""
        lines.append(f"  {agent['name']} [{agent['capability']}, task {agent['task_id']}, {agent['runtime']}]: "
                     f"{agent['state']}{reason}; {agent['turns']} turn(s), {agent['input_tokens']}/"
                     f"{agent['output_tokens']} tokens, ${agent['cost_usd']:.4f}, "
                     f"{_seconds(agent['duration_seconds'])}")
    lines += ["", "turns:"]
    for turn in report["turns"]:
        error = f" - {_one_line(turn['error'])}" if turn["error"] else ""
        lines.append(f"  {turn['id']} {turn['agent']} #{turn['number']} attempt {turn['attempt']}: {turn['status']}, "
                     f"${turn['cost_usd']:.4f}, {turn['tool_calls']} tool call(s), "
                     f"{_seconds(turn['duration_seconds'])}{error}")
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    from overstory.printable import line

    return line(" ".join(str(text).split()))[:300]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
