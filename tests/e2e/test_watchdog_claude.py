"""The watchdog and `ov stop` against the REAL Claude Code CLI (model mocked on 127.0.0.1).

The real CLI starts each Bash tool call in a session of its own, outside the turn's
process group; these tests prove ov still stops everything the turn started, and
recovers when the loop and the turn are killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from agent_helpers import agent_state, mail_rows, shared_dir, wait_for, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import ov_command, run_ov
from mockapi import MockMessagesAPI, TurnScript, text_reply, tool_reply
from overstory import procs
from overstory.store.db import open_state

DONE = tool_reply("Bash", {"command": "ov mail send --type worker_done --subject done --body finished",
                           "description": "report"})


def sling(project, tmp_path, api, task, **extra):
    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude", **extra})
    result = run_ov("sling", "builder", task, "--prompt", f"work on {task}", cwd=project.root, env=env)
    assert result.returncode == 0, result.stderr
    return f"builder-{task}", env


def turn_ids(project, name):
    conn = open_state(project.state_db)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM turns WHERE agent = ?", (name,))]
    finally:
        conn.close()


@requires_claude
def test_stop_leaves_no_process_of_the_agent(project, tmp_path):
    marker_dir, shared = shared_dir(tmp_path)
    marker = marker_dir / "tool-started"
    script = [tool_reply("Bash", {"command": f"touch {marker}; sleep 300", "description": "long"}), text_reply("x")]
    with MockMessagesAPI(script) as api:
        name, _ = sling(project, tmp_path, api, "long", **shared)
        wait_for(marker.exists, 60, message="the long tool call")
        ids = turn_ids(project, name)
        assert procs.tagged_processes(ids[-1]), "the tool process should be running"
        result = run_ov("stop", name, cwd=project.root)
        assert result.returncode == 0, result.stderr
    agent = agent_state(project, name)
    assert agent.state == "completed"
    assert not any(procs.tagged_processes(turn) for turn in ids)
    assert not procs.is_alive(agent.loop_pid, agent.loop_start_ticks)


@requires_claude
def test_killing_loop_and_turn_recovers_with_the_watchdog(project, tmp_path):
    marker_dir, shared = shared_dir(tmp_path)
    marker = marker_dir / "slept-once"
    script = [tool_reply("Bash", {"command": f"test -e {marker} || {{ touch {marker}; sleep 120; }}",
                                  "description": "long step"}), DONE, text_reply("done")]
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "overstory.agents.loop",
                              "--agent", "builder-fi"], cwd=project.root, start_new_session=True)
    watchdog = None
    try:
        # The retry resumes the killed turn's session (its id is saved as soon as it is known):
        # TurnScript plays the same calls again there.
        with MockMessagesAPI(TurnScript(script)) as api:
            name, env = sling(project, tmp_path, api, "fi", OV_TURNS_RETRY_BACKOFF="0.2", **shared)
            watchdog = subprocess.Popen([*ov_command(), "watchdog", "--interval", "0.5"], cwd=project.root,
                                        env={**env, "OV_WATCHDOG_INTERVAL": "0.5"}, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
            wait_for(marker.exists, 60, message="the long tool call")
            agent = agent_state(project, name)
            os.kill(agent.loop_pid, signal.SIGKILL)
            os.killpg(agent.turn_pgid, signal.SIGKILL)
            agent = wait_terminal(project, name, timeout=120)
        assert agent.state == "completed", agent.state_reason
        assert mail_rows(project, type="worker_died") == []
        assert mail_rows(project, type="dispatch")[0]["read_at"] is not None
        assert decoy.poll() is None, "a process ov did not start was touched"
    finally:
        decoy.kill()
        if watchdog is not None:
            watchdog.send_signal(signal.SIGTERM)
            watchdog.wait(timeout=30)
