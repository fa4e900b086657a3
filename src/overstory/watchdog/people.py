"""Watchdog work beside the agents' rules: `ov schedule`'s fires, and the human loop (ARCHITECTURE §13).

Schedules: due fires are claimed and launched (``scheduler.Scheduler``, made on the
first tick). The human loop, each tick: gates past their deadline are settled once (``agents.approvals.expire_due``:
a compare-and-swap, so two watchdogs at once settle each gate once), notifications are
collected from durable state and the due ones sent (``overstory.notify``). Nothing here
can stop the tick: errors become actions.
"""

from __future__ import annotations

import sqlite3
import typing as t

from overstory.errors import OrchestratorError

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths


class SideTicks:
    """Holds the scheduler and the project's config (read once) for the per-tick work."""

    def __init__(self, project: ProjectPaths, config: Config | None = None) -> None:
        self.project = project
        self._config = config
        self._scheduler: t.Any = None  # scheduler.Scheduler, made on the first tick

    def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.close()

    def schedules(self, state: sqlite3.Connection, interval: float) -> list[tuple[str, str, str]]:
        """`ov schedule`: due fires are claimed and launched."""
        try:
            if self._scheduler is None:
                from overstory.scheduling.scheduler import Scheduler

                self._scheduler = Scheduler(self.project, state, interval=interval)
            return list(self._scheduler.tick())
        except (sqlite3.Error, OSError, OrchestratorError) as exc:
            return [("-", "error", f"schedules: {exc}")]

    @property
    def config(self) -> Config:
        if self._config is None:
            from overstory.config.load import load as load_config

            self._config = load_config(self.project.config_file, self.project.local_config_file)
        return self._config

    def people(self, state: sqlite3.Connection) -> list[tuple[str, str, str]]:
        """(agent, kind, detail) for each thing done."""
        done: list[tuple[str, str, str]] = []
        try:
            from overstory.agents.approvals import expire_due

            for approval_id, what in expire_due(state):
                done.append(("-", "approval", f"{approval_id} {what}"))
        except (sqlite3.Error, OSError, OrchestratorError) as exc:
            done.append(("-", "error", f"approvals: {exc}"))
        try:
            from overstory.notify import collect, flush

            collect(state)
            sent = flush(state, self.config, project=self.project, budget_s=10)
            if sent.sent or sent.failed:
                done.append(("-", "notify", f"sent {sent.sent}, failed {sent.failed}"))
        except (sqlite3.Error, OSError, OrchestratorError) as exc:
            done.append(("-", "error", f"notifications: {exc}"))
        try:
            from overstory.agents.run_files import write_missing_summaries

            done.extend(("-", "run_summary", f"{run_id}: summary.txt written") for run_id in
                        write_missing_summaries(self.project, state, self.config))
        except (sqlite3.Error, OSError, OrchestratorError) as exc:
            done.append(("-", "error", f"run summaries: {exc}"))
        return done
