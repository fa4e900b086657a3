"""Shared fixtures: real git repositories and initialized ov projects in tmp_path."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# Variables that would leak the developer's own agent identity or project into tests.
_LEAKY_ENV = [name for name in os.environ if name.startswith(("OVERSTORY_", "OV_"))] + [
    "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT",
]


def pytest_configure(config: pytest.Config) -> None:
    import cpu_report  # opt-in: OV_TEST_CPU_REPORT=<folder> measures CPU per test file (tests/cpu_report.py)

    cpu_report.register(config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first (seconds per file from an earlier run: tests/file_durations.json, made by
    .ci/file_durations.py). `.ci/test` gives pytest-xdist workers whole files in collection order; a long
    file that starts last keeps one worker busy after the others are done, while short ones fill in well."""
    try:
        weights = json.loads((TESTS_DIR / "file_durations.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -weights.get(item.nodeid.split("::", 1)[0], 0))  # stable: a file keeps its order


@pytest.fixture(scope="session")
def _test_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


def _make_hermetic(patch: pytest.MonkeyPatch, home: Path) -> None:
    for name in _LEAKY_ENV:
        patch.delenv(name, raising=False)
    # An empty HOME: the agent CLIs start login shells, and the machine's own profile
    # must not run in them. Measured: root's ~/.bashrc runs `pyenv rehash`; a test that
    # kills a turn's process group mid-rehash leaves pyenv's lock behind, and from then
    # on every login shell (so every Bash tool call) waits 60 s for it.
    patch.setenv("HOME", str(home))
    patch.setenv("GIT_AUTHOR_NAME", "ov tests")
    patch.setenv("GIT_AUTHOR_EMAIL", "tests@ov.invalid")
    patch.setenv("GIT_COMMITTER_NAME", "ov tests")
    patch.setenv("GIT_COMMITTER_EMAIL", "tests@ov.invalid")


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch, _test_home: Path) -> None:
    _make_hermetic(monkeypatch, _test_home)


@contextlib.contextmanager
def hermetic_environ(home: Path) -> Iterator[None]:
    """The environment ``_hermetic_env`` gives each test, for a module-scoped fixture (it is
    set up before any per-test fixture runs): one real-CLI run whose output several tests read."""
    with pytest.MonkeyPatch.context() as patch:
        _make_hermetic(patch, home)
        yield


def run_git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    run_git(path, "init", "-q", "-b", "main")
    for name, text in (files or {"README.md": "hello\n"}).items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    run_git(path, "add", "-A")
    run_git(path, "commit", "-q", "-m", "initial")
    return path


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A real git repository on branch main with one commit."""
    return make_repo(tmp_path / "repo")


@pytest.fixture
def project(git_repo: Path):
    """An initialized ov project (ProjectPaths) in a real git repository.

    On teardown every agent loop and turn the test left running is stopped (only
    processes recorded in this project's database, checked by start time).
    """
    from overstory.paths import ProjectPaths
    from overstory.project.init import init_project

    init_project(git_repo)
    project = ProjectPaths(git_repo)
    yield project
    stop_project_processes(project)


def stop_project_processes(project) -> None:
    import sqlite3

    from overstory import procs

    try:
        conn = sqlite3.connect(project.state_db, timeout=10)
        rows = conn.execute("SELECT loop_pid, loop_start_ticks, turn_pgid, turn_start_ticks FROM sessions").fetchall()
        turn_ids = [r[0] for r in conn.execute("SELECT id FROM turns WHERE ended_at IS NULL")]
        conn.close()
    except sqlite3.Error:
        return
    for loop_pid, loop_ticks, pgid, pgid_ticks in rows:
        if loop_pid and procs.is_alive(loop_pid, loop_ticks):
            procs.kill_group(loop_pid, loop_ticks, grace=2)
        procs.kill_group(pgid, pgid_ticks, grace=1)
    for turn_id in turn_ids:
        procs.kill_turn(None, None, turn_id, grace=1)


@pytest.fixture
def state_db(project):
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    yield conn
    conn.close()


@pytest.fixture
def events_db(project):
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    yield conn
    conn.close()


def ov_command() -> list[str]:
    """How tests run `ov` as a real subprocess: the installed script if on PATH, else the module."""
    import shutil

    found = shutil.which("ov")
    return [found] if found else [sys.executable, "-m", "overstory"]


def run_ov(*args: str, cwd: Path, env: dict[str, str] | None = None, input: str | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*ov_command(), *args], cwd=cwd, env=full_env, input=input, capture_output=True,
                          text=True, timeout=timeout, check=False)
