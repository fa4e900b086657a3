"""An idle agent loop imports only what it uses (issue 34: <= 10 MiB Pss, so 100 idle agents fit in 1 GiB).

``inspect`` (with ``ast``, ``dis`` and ``tokenize``, about 1 MiB) comes with ``dataclasses`` only for a
dataclass without a docstring, and the loop defers it (``overstory.deferred``); ``secrets`` and
``hashlib`` (OpenSSL's libcrypto) are imported where a token or a hash is made. The loop's own
``-X importtime`` report (PYTHONPROFILEIMPORTTIME, in its log) says what it imported.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from agent_helpers import agent_env, wait_for
from overstory.config_load import load
from overstory.paths import ProjectPaths

NOT_IN_AN_IDLE_LOOP = ("inspect", "ast", "dis", "tokenize", "secrets", "hashlib", "pydantic", "yaml")


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
