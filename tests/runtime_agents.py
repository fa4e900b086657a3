"""Helpers for the e2e tests that run codex, gemini and opencode agents through the real `ov sling`.

Each test starts its runtime's mock model on 127.0.0.1 and points the project at it the way
a user would: a `providers` entry (base URL, key variable, protocol) and `models`/`runtimes`
per capability in `.overstory/config.local.yaml`.
"""

from __future__ import annotations

import json
import typing as t

import yaml

from conftest import run_ov
from overstory.paths import ProjectPaths
from overstory.store.db import open_events, open_state

# Every request that is not to a mock on 127.0.0.1 goes to a dead proxy.
DEAD_PROXY = "http://127.0.0.1:9"
OFFLINE_ENV = {
    "HTTPS_PROXY": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY, "https_proxy": DEAD_PROXY, "http_proxy": DEAD_PROXY,
    "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
}
MOCK_PRICE = {"input_per_mtok": 2.0, "output_per_mtok": 8.0}


def configure(project: ProjectPaths, *, runtimes: dict[str, str], providers: dict[str, dict[str, str]],
              models: dict[str, str], prices: dict[str, dict[str, float]] | None = None,
              runtime: dict[str, t.Any] | None = None, turns: dict[str, t.Any] | None = None,
              ledger: dict[str, t.Any] | None = None) -> None:
    """Write the project's config.local.yaml (the layer a user keeps per machine)."""
    project.local_config_file.write_text(yaml.safe_dump({
        "runtime": runtime or {},
        "turns": {"retry_backoff": 0.2, **(turns or {})},
        "providers": providers,
        "models": models,
        "runtimes": runtimes,
        "prices": prices or {},
        **({"ledger": ledger} if ledger else {}),
    }))


# ---- receipts that tell the truth (issue 33): one release that fails, one that succeeds, in one turn

RELEASE = "./release.sh"
RELEASE_LEDGER = {"side_effects": [f"Bash({RELEASE}*)"]}  # classed a side effect by config, as a user would
FAILED_RELEASE, GOOD_RELEASE = f"{RELEASE} broken", f"{RELEASE} ok"


def commit_release_script(project: ProjectPaths) -> None:
    """A committed ./release.sh (so every worktree has it) that exits 3 unless told ``ok``."""
    from conftest import run_git

    script = project.root / "release.sh"
    script.write_text('#!/bin/sh\nif [ "$1" = ok ]; then echo released; else echo "cannot release: $1" >&2; exit 3; fi\n')
    script.chmod(0o755)
    run_git(project.root, "add", "release.sh")
    run_git(project.root, "commit", "-q", "-m", "release script")


def check_release_receipts(project: ProjectPaths, agent: str) -> None:
    """The failed release's receipt says failed (exit 3), the good one's succeeded (exit 0), in the ledger and in
    `ov trace`. On a retry of the turn the ledger matches a call only against earlier rows that succeeded (or
    started without a receipt): the failed release runs again, the good one is held back with its receipt."""
    rows = [(r["input"], r["class"], r["status"], r["exit_code"]) for r in ledger_rows(project, agent)
            if RELEASE in r["input"]]
    assert [row[1:] for row in rows] == [("side_effect", "failed", 3), ("side_effect", "succeeded", 0)], rows
    assert FAILED_RELEASE in rows[0][0] and GOOD_RELEASE in rows[1][0]
    trace = run_ov("trace", agent, cwd=project.root)
    assert trace.returncode == 0, trace.stderr
    shown = [line for line in trace.stdout.splitlines() if "tool #" in line and RELEASE in line]
    assert len(shown) == 2 and "[side_effect] failed" in shown[0] and FAILED_RELEASE in shown[0], shown
    assert "[side_effect] succeeded" in shown[1] and GOOD_RELEASE in shown[1], shown


def sling(project: ProjectPaths, capability: str, task: str, prompt: str, env: dict[str, str], *extra: str) -> str:
    result = run_ov("sling", capability, task, "--prompt", prompt, *extra, cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    return f"{capability}-{task}"


def events(project: ProjectPaths, agent: str, kind: str) -> list[tuple[str | None, dict[str, t.Any] | None]]:
    conn = open_events(project.events_db)
    try:
        rows = conn.execute("SELECT tool, data FROM events WHERE agent = ? AND kind = ? ORDER BY id", (agent, kind))
        return [(r[0], json.loads(r[1]) if r[1] else None) for r in rows]
    finally:
        conn.close()


def ran_in_bubblewrap(project: ProjectPaths, agent: str) -> bool:
    """Whether every turn of ``agent`` was started inside ov's bubblewrap sandbox (its logged command line)."""
    import json
    from pathlib import Path

    argvs = [json.loads((Path(r["log_dir"]) / "command.json").read_text()) for r in turn_rows(project, agent)]
    return bool(argvs) and all(Path(a[0]).name == "bwrap" and "--unshare-pid" in a for a in argvs)


def turn_rows(project: ProjectPaths, agent: str) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        rows = conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at", (agent,)).fetchall()
        return [dict(r) for r in rows]
    finally:
        conn.close()


def ledger_rows(project: ProjectPaths, agent: str) -> list[dict[str, t.Any]]:
    """The agent's tool-call ledger rows, oldest first."""
    from overstory.store import ledger

    conn = open_state(project.state_db)
    try:
        return ledger.calls(conn, agent=agent)
    finally:
        conn.close()
