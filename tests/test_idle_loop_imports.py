"""An idle agent loop imports only what it uses (issue 34: <= 10 MiB Pss, so 100 idle agents fit in 1 GiB).

``inspect`` (with ``ast``, ``dis`` and ``tokenize``, about 1 MiB) comes with ``dataclasses`` only for a
dataclass without a docstring, and the loop defers it (``overstory.deferred``); ``secrets`` and
``hashlib`` (OpenSSL's libcrypto) are imported where a token or a hash is made; programs are looked up
with ``procs.which``, not shutil's (which brings bz2 and lzma). The loop's own
``-X importtime`` report (PYTHONPROFILEIMPORTTIME, in its log) says what it imported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_helpers import agent_env, wait_for
from overstory.config.load import load
from overstory.paths import ProjectPaths

NOT_IN_AN_IDLE_LOOP = ("inspect", "ast", "dis", "tokenize", "secrets", "hashlib", "shutil", "bz2", "lzma",
                       "pydantic", "yaml")


def test_an_idle_loop_imports_none_of_what_it_does_not_use(project: ProjectPaths, tmp_path: Path) -> None:
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.store import sessions
    from overstory.store.db import open_state

    scenario = tmp_path / "idle.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [], "result": "waiting for mail"}]}))
    config = load(project.config_file, project.local_config_file, environ={})
    conn = open_state(project.state_db)
    try:
        result = sling(project, config, conn, SlingRequest(capability="scout", task_id="idle", runtime="scripted",
                                                           scenario=scenario),
                       environ={**agent_env(), "PYTHONPROFILEIMPORTTIME": "1"})

        def idle() -> sessions.Session | None:
            agent = sessions.get(conn, result.name)
            return agent if agent is not None and agent.state == "between_turns" and agent.turns == 1 else None

        wait_for(idle, 60, message="the scout's first turn to end")
    finally:
        conn.close()
    log = (project.run_dir / result.name / "loop.log").read_text()
    imported = set(re.findall(r"^import time:[^|]*\|[^|]*\| +(\S+)$", log, re.MULTILINE))
    assert {"overstory.agents.process", "overstory.agents.turns", "dataclasses"} <= imported  # the report is there
    assert sorted(imported & set(NOT_IN_AN_IDLE_LOOP)) == []


def test_which_finds_what_shutil_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from overstory.procs import which

    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    (tmp_path / "first" / "tool").write_text("not executable")
    (tmp_path / "first" / "folder").mkdir()
    for folder in ("first", "second"):
        (tmp_path / folder / "prog").write_text("#!/bin/sh\n")
    (tmp_path / "second" / "prog").chmod(0o755)
    (tmp_path / "second" / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "second" / "tool").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'first'}:{tmp_path / 'second'}:/usr/bin:/bin")
    for name in ("prog", "tool", "folder", "sh", "no-such-program", str(tmp_path / "second" / "prog"),
                 str(tmp_path / "first" / "prog"), str(tmp_path / "first"), "/bin/sh"):
        assert which(name) == shutil.which(name), name
    assert which("tool") == str(tmp_path / "second" / "tool")
