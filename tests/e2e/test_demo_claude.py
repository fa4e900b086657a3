"""`ov demo --runtime claude` with the REAL Claude Code CLI: config's claude_bin, and why agents failed.

No model is needed: with no API key and no login the real CLI stops before calling
any API ("Not logged in · Please run /login"), which is what a new user hits first. The
mock (tests/mockapi.py on 127.0.0.1) is the endpoint anyway, so nothing could leave the
machine, and the test checks it was never called.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_ov, stop_project_processes
from mockapi import MockMessagesAPI, error_reply
from overstory.paths import ProjectPaths


def _path_without_claude(path: str) -> str:
    return os.pathsep.join(p for p in path.split(os.pathsep) if not (Path(p) / "claude").exists())


@requires_claude
def test_demo_uses_claude_bin_from_config_and_prints_each_agents_reason(project: ProjectPaths,
                                                                        tmp_path: Path) -> None:
    # The operator's project names the CLI by path; `claude` itself is not on PATH.
    project.local_config_file.write_text(f"runtime:\n  claude_bin: {json.dumps(CLAUDE_BIN)}\n")
    demo_dir = tmp_path / "demo"
    with MockMessagesAPI(lambda body: error_reply(500, "api_error", "not expected")) as api:
        env = claude_env(api.base_url, tmp_path)
        env.pop("ANTHROPIC_API_KEY")  # and CLAUDE_CONFIG_DIR is a fresh folder: not logged in
        env["PATH"] = _path_without_claude(env["PATH"])
        try:
            result = run_ov("demo", "--runtime", "claude", "--dir", str(demo_dir), "--timeout", "150",
                            cwd=project.root, env=env, timeout=240)
        finally:
            stop_project_processes(ProjectPaths(demo_dir))
        reached = len(api.requests)
    out = result.stdout
    assert result.returncode == 6, out + result.stderr  # every agent parked by an auth failure (`ov wait`'s codes)
    assert reached == 0
    assert "NOT every agent completed" in out
    reasons = {}
    for line in out.splitlines():
        for name in ("scout-survey", "builder-docs", "builder-api"):
            if line.startswith(f"  {name}: "):
                reasons[name] = line.split(": ", 1)[1]
    assert set(reasons) == {"scout-survey", "builder-docs", "builder-api"}, out
    for reason in reasons.values():
        assert reason.startswith("auth: Not logged in") and "retries" not in reason, "an auth failure is not retried"
    assert "claude_bin" in (demo_dir / ".overstory" / "config.local.yaml").read_text()


def test_demo_without_the_claude_cli_fails_before_making_a_repository(tmp_path: Path) -> None:
    env = {"PATH": _path_without_claude(os.environ["PATH"]), "OV_RUNTIME_CLAUDE_BIN": "claude-not-installed"}
    result = run_ov("demo", "--runtime", "claude", "--dir", str(tmp_path / "demo"), cwd=tmp_path, env=env)
    assert result.returncode == 1 and "claude-not-installed" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "demo").exists()
