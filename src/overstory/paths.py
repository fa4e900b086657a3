"""Finding the project and naming the files inside `.overstory/`.

The project is the main git repository that holds `.overstory/`. Agents run inside
worktrees under `.overstory/worktrees/<agent>/`, which are git repositories of their
own, so discovery must climb out of them to the main repository.
"""

from __future__ import annotations

import os

from overstory.records import Record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (hot commands import this module)
if TYPE_CHECKING:
    from pathlib import Path

OV_DIR_NAME = ".overstory"
PROJECT_ENV = "OVERSTORY_PROJECT_ROOT"


class ProjectPaths(Record):
    """The files of one project, all under ``root``."""

    __slots__ = ("root",)
    root: Path

    @property
    def ov_dir(self) -> Path:
        return self.root / OV_DIR_NAME

    @property
    def state_db(self) -> Path:
        return self.ov_dir / "state.db"

    @property
    def events_db(self) -> Path:
        return self.ov_dir / "events.db"

    @property
    def serve_token_file(self) -> Path:
        """The secret every `ov serve` request must carry (mode 0600, git-ignored)."""
        return self.ov_dir / "serve-token"

    @property
    def config_file(self) -> Path:
        return self.ov_dir / "config.yaml"

    @property
    def local_config_file(self) -> Path:
        return self.ov_dir / "config.local.yaml"

    @property
    def worktrees_dir(self) -> Path:
        return self.ov_dir / "worktrees"

    @property
    def logs_dir(self) -> Path:
        return self.ov_dir / "logs"

    @property
    def locks_dir(self) -> Path:
        return self.ov_dir / "locks"

    @property
    def run_dir(self) -> Path:
        """Per-agent runtime files: scenario copies, runtime config dirs, loop logs."""
        return self.ov_dir / "run"

    @property
    def agents_dir(self) -> Path:
        return self.ov_dir / "agents"

    @property
    def templates_dir(self) -> Path:
        return self.ov_dir / "templates"

    def worktree(self, agent: str) -> Path:
        return self.worktrees_dir / agent

    def is_initialized(self) -> bool:
        return self.ov_dir.is_dir() and self.config_file.is_file()


def find_git_root(start: Path) -> Path | None:
    """The top of the git working tree containing ``start`` (a worktree counts), or None."""
    current = start.resolve()
    for candidate in (current, *current.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def _climb_out_of_agent_worktree(path: str) -> str:
    """``<root>/.overstory/worktrees/<agent>/...`` -> ``<root>``; anything else unchanged."""
    parts = path.split(os.sep)
    for index in range(len(parts) - 2):
        if parts[index] == OV_DIR_NAME and parts[index + 1] == "worktrees":
            return os.sep.join(parts[:index]) or os.sep
    return path


def locate_project(explicit: str | os.PathLike[str] | None = None, *, cwd: str | os.PathLike[str] | None = None) -> str:
    """The project root as a string: ``explicit`` > $OVERSTORY_PROJECT_ROOT > walk up from ``cwd``.

    Plain ``os.path``, no pathlib: the hot commands call this directly.
    """
    chosen = explicit or os.environ.get(PROJECT_ENV)
    if chosen:
        root = os.path.realpath(os.path.expanduser(os.fspath(chosen)))
        ov_dir = os.path.join(root, OV_DIR_NAME)
        if not (os.path.isdir(ov_dir) and os.path.isfile(os.path.join(ov_dir, "config.yaml"))):
            from overstory.errors import ProjectNotFound  # an error path: `ov status` does not import errors

            raise ProjectNotFound(f"{root} is not an ov project (no {OV_DIR_NAME}/config.yaml); run `ov init` there")
        return root
    start = _climb_out_of_agent_worktree(os.path.realpath(os.fspath(cwd) if cwd is not None else os.getcwd()))
    candidate = start
    while True:
        if os.path.isfile(os.path.join(candidate, OV_DIR_NAME, "config.yaml")):
            return candidate
        parent = os.path.dirname(candidate)
        if parent == candidate:
            break
        candidate = parent
    from overstory.errors import ProjectNotFound

    raise ProjectNotFound(f"no ov project found at or above {start}; run `ov init` in a git repository first")


def state_db_path(root: str) -> str:
    return os.path.join(root, OV_DIR_NAME, "state.db")


def find_project(explicit: str | os.PathLike[str] | None = None, *, cwd: Path | None = None) -> ProjectPaths:
    """Locate the project (see ``locate_project``)."""
    from pathlib import Path

    return ProjectPaths(Path(locate_project(explicit, cwd=cwd)))
