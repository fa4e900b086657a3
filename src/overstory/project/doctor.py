"""`ov doctor`: environment and project health checks, each with a fix hint, grouped in categories.

``ov doctor --category NAME`` runs only the groups asked for (``CATEGORIES``); a group that is not
asked for does not run at all, so ``--category serve`` does not probe every runtime.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import typing as t
from pathlib import Path

from overstory.errors import OrchestratorError
from overstory.project.health import CATEGORIES, FAIL, OK, WARN, Check

if t.TYPE_CHECKING:
    from overstory.config.model import Config


def _version_of(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (result.stdout or result.stderr).strip().splitlines()
    return text[0] if result.returncode == 0 and text else None


def check_python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info >= (3, 11):  # noqa: UP036 (doctor reports an interpreter pip should have refused)
        return Check("python", OK, f"Python {version}")
    return Check("python", FAIL, f"Python {version}", "ov needs Python 3.11 or newer")


def check_git() -> Check:
    version = _version_of(["git", "--version"])
    if version:
        return Check("git", OK, version)
    return Check("git", FAIL, "git not found", "install git (apt-get install git)")


def check_tmux() -> Check:
    version = _version_of(["tmux", "-V"])
    if version:
        return Check("tmux", OK, version)
    return Check("tmux", WARN, "tmux not found (only tmux mode needs it)", "apt-get install tmux")


def check_runtimes(config: Config | None) -> list[Check]:
    """One check per registered runtime: installed, version, credentials."""
    from overstory.runtimes import RUNTIME_NAMES, get_runtime
    from overstory.runtimes.start_costs import start_cost

    checks = []
    for name in RUNTIME_NAMES:
        probe = get_runtime(name).probe(config)
        status = {"ok": OK, "missing": WARN, "outdated": WARN}.get(probe.status, FAIL)
        if status == OK and probe.has_credentials is False:
            status = WARN  # installed, but every turn would fail with "Not logged in"
        detail = probe.detail if probe.credentials == "not needed" else f"{probe.detail}; {probe.credentials}"
        cost = start_cost(name)
        checks.append(Check(name, status, detail, probe.hint, extra={"start_cost": cost} if cost else None))
    return checks


def check_local_providers(config: Config) -> list[Check]:
    """Each Ollama provider: its server answers, and has pulled every model the config names on it."""
    from overstory.runtimes.ollama import doctor_findings

    return [Check(name, OK if ok else FAIL, detail, hint) for name, ok, detail, hint in doctor_findings(config)]


def check_sandbox(config: Config) -> Check:
    """Whether every turn runs inside bubblewrap (docs/security.md)."""
    from overstory.sandbox import OFF_WARNING, effective_mode
    from overstory.sandbox.probe import INSTALL_HINT

    try:
        mode = effective_mode(config)
    except OrchestratorError as exc:
        return Check("sandbox", FAIL, str(exc), INSTALL_HINT)
    if mode.name == "off":
        return Check("sandbox", WARN, f"{OFF_WARNING} ({mode.reason})",
                     "" if config.sandbox.mode == "off" else INSTALL_HINT)
    return Check("sandbox", OK, f"every turn runs in bubblewrap ({mode.reason})")


SANDBOX_OFF_COSTS = (
    "without it an agent can write ov's databases and any file you can, read other agents' endpoint secrets "
    "from /proc and act as them, and write through interpreters, scripts and links the guard cannot follow; "
    "still refused: `ov approve`/`ov reject` inside an agent, and every tool call its endpoint cannot count "
    "and record")


def check_sandbox_off(config: Config) -> Check | None:
    """What ``sandbox.mode: off`` gives up (docs/security.md, "The guard alone"): a line of its own when it is off."""
    from overstory.sandbox import effective_mode

    try:
        if effective_mode(config).name != "off":
            return None
    except OrchestratorError:
        return None
    return Check("sandbox off", WARN, SANDBOX_OFF_COSTS, "set sandbox.mode: auto (or bwrap) and install bubblewrap")


def check_parked_for_auth(state_db: Path) -> Check | None:
    """Agents parked because their runtime's key or login was rejected (the key on record is bad)."""
    if not state_db.exists():
        return None
    from overstory.store.sessions import auth_parked

    try:
        conn = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=5)
        try:
            rows = auth_parked(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return None  # an older schema: nothing can be parked for auth there
    if not rows:
        return Check("auth", OK, "no agent is parked by an authentication failure")
    names = ", ".join(f"{name} ({runtime})" for name, runtime, _ in rows)
    return Check("auth", FAIL, f"{len(rows)} agent(s) parked because the API rejected their key or login: {names}; "
                               f"{rows[0][2]}",
                 f"fix the key (e.g. export ANTHROPIC_API_KEY=...), then `ov resume {rows[0][0]}`")


def check_hooks(project: t.Any, state_db: Path) -> Check | None:
    """How each live agent's tool calls reach the guard: HTTP to its loop, or an `ov guard` process."""
    if not state_db.exists():
        return None
    from overstory.store.sessions import active_names

    try:
        conn = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=5)
        try:
            names = active_names(conn)
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    if not names:
        return None
    from overstory.endpoint.hooks import TRANSPORT_FILE

    seen = []
    for name in names:
        try:
            transport = (project.run_dir / name / TRANSPORT_FILE).read_text(encoding="utf-8").strip()
        except OSError:
            transport = "command"  # tmux agents and runtimes without HTTP hooks: no loop listener
        seen.append(f"{name}: {transport.split(' ')[0] if transport.startswith('http ') else transport}")
    return Check("hooks", OK, "tool-call hooks per agent: " + "; ".join(seen))


def check_database(path: Path, expected_version: int, migrations: t.Sequence[t.Any] = (),
                   repair: bool = False) -> Check:
    name = path.name
    if not path.exists():
        # Normal in a fresh clone of a repository that commits .overstory/ (databases are git-ignored).
        return Check(name, WARN, f"{path} does not exist yet; the first ov command that needs it creates it")
    from overstory.store.db import integrity

    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            verdict, version = integrity(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return Check(name, FAIL, f"{path}: {exc}", "move the file aside and run `ov init --force`")
    if verdict != "ok":
        return Check(name, FAIL, f"integrity check: {verdict}", "move the file aside and run `ov init --force`")
    if version > expected_version:
        return Check(name, FAIL, f"schema v{version} is newer than this ov (v{expected_version})", "upgrade ov")
    if version < expected_version:
        return Check(name, WARN, f"schema v{version}; any ov command upgrades it to v{expected_version}")
    if migrations:
        damaged = check_schema(path, migrations, repair)
        if damaged is not None:
            return damaged
    return Check(name, OK, f"integrity ok, schema v{version}")


def check_schema(path: Path, migrations: t.Sequence[t.Any], repair: bool) -> Check | None:
    """A database at the current version that lacks tables or indexes its migrations made."""
    from overstory.store import schema

    try:
        conn = sqlite3.connect(path, timeout=10, isolation_level=None)
        try:
            missing = schema.missing_objects(conn, migrations)
            made = schema.repair(conn, migrations) if missing and repair else []
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return Check(path.name, FAIL, f"{path}: {exc}", "move the file aside and run `ov init --force`")
    if not missing:
        return None
    names = ", ".join(f"{typ} {name}" for typ, name in missing)
    if made:
        return Check(path.name, WARN, f"recreated the missing {', '.join(made)} (empty: their rows were lost)")
    return Check(path.name, FAIL, f"{path} is missing {names}",
                 "`ov doctor --repair` recreates them empty (the rest of the data is kept); or restore the file "
                 "from a backup")


def check_canonical_branch(root: Path, canonical: str) -> Check:
    """Warn when the branch checked out is not the one merges go to (an `ov init` on another branch)."""
    from overstory.gitutil import branch_exists, current_branch

    name = "canonical branch"
    hint = f"set project.canonical_branch in .overstory/config.yaml, or `git switch {canonical}`"
    if not branch_exists(root, canonical):
        return Check(name, WARN, f"project.canonical_branch is {canonical!r}, which does not exist", hint)
    current = current_branch(root)
    if current is None:
        return Check(name, WARN, f"HEAD is detached; merges without a base go to {canonical}", hint)
    if current != canonical:
        return Check(name, WARN, f"you are on {current}, but merges without a base go to {canonical} "
                                 "(project.canonical_branch)", hint)
    return Check(name, OK, f"{canonical} (checked out)")


def unknown_categories(names: t.Iterable[str]) -> list[str]:
    return [name for name in names if name not in CATEGORIES]


def run_checks(project_option: str | None = None, *, repair: bool = False,
               categories: t.Collection[str] | None = None, executor: str | None = None) -> list[Check]:
    """Every check of the ``categories`` asked for (all when None), each labelled with its category; the
    executor's are the Ray cluster's when turns run there (config ``executor.kind``, or ``executor``)."""
    from dataclasses import replace

    wanted = set(CATEGORIES if not categories else categories)
    checks: list[Check] = []

    def add(category: str, *found: Check | None) -> None:
        checks.extend(replace(check, category=category) for check in found if check is not None)

    if "install" in wanted:
        add("install", check_python(), check_git(), check_tmux())
    from overstory.paths import find_project

    try:
        project = find_project(project_option)
    except OrchestratorError as exc:
        if "runtimes" in wanted:
            add("runtimes", *check_runtimes(None))
        add("project", Check("project", WARN, str(exc), "run `ov init` in your repository"))
        return checks
    config = None
    config_check: Check | None = None
    if wanted - {"install", "processes", "serve"} or "project" in wanted:
        try:
            from overstory.config.load import load as load_config

            config = load_config(project.config_file, project.local_config_file)
            config_check = Check("config", OK, f"{project.config_file} is valid")
        except OrchestratorError as exc:
            config_check = Check("config", FAIL, str(exc),
                                 "fix the key named above, or compare with `ov config --defaults`")
    if "project" in wanted:
        add("project", Check("project", OK, str(project.root)), config_check)
        if config is not None:
            add("project", check_canonical_branch(project.root, config.project.canonical_branch))
        add("project", *check_databases(project, repair))
    elif config_check is not None and config is None:
        add("project", config_check)  # the reason the checks below that need the config do not run
    if "runtimes" in wanted:
        add("runtimes", *check_runtimes(config))
        if config is not None:
            add("runtimes", *check_local_providers(config))
        add("runtimes", check_parked_for_auth(project.state_db))
    if "sandbox" in wanted and config is not None:
        add("sandbox", check_sandbox(config), check_sandbox_off(config))
    if "executor" in wanted and config is not None:
        from overstory.project import doctor_cluster

        if doctor_cluster.wanted(config, executor):
            add("executor", *(Check(*finding) for finding in doctor_cluster.check_cluster(config)))
        else:
            add("executor", check_executor(config))
    if "processes" in wanted:
        from overstory.project.doctor_processes import check_orphans, check_watchdogs

        add("processes", check_hooks(project, project.state_db), check_orphans(project), check_watchdogs(project))
    if "serve" in wanted:
        from overstory.project.doctor_processes import check_serve

        add("serve", check_serve(project))
    return checks


def check_databases(project: t.Any, repair: bool) -> list[Check]:
    from overstory.store.events_migrations import EVENTS_MIGRATIONS
    from overstory.store.migrations import STATE_MIGRATIONS

    return [check_database(project.state_db, len(STATE_MIGRATIONS), STATE_MIGRATIONS, repair),
            check_database(project.events_db, len(EVENTS_MIGRATIONS), EVENTS_MIGRATIONS, repair)]


def check_executor(config: Config) -> Check:
    """Turns run as local processes (the Ray cluster's checks are ``doctor_cluster``'s)."""
    return Check("executor", OK, "turns run as local processes (executor.kind: local)")
