"""The README's "Set-up" and "Run a real team" steps, run literally in a fresh clone and a fresh venv.

Only the model is mocked (tests/mockapi.py on 127.0.0.1, because no real model can be
reached here): the clone, the venv, `pip install .`, the real Claude Code CLI, git,
tmux, SQLite and every `ov` command are real. The lines come from the README's code
blocks; the only ones replaced are the steps a person does that a test cannot:

- ``<repository-url>``: this repository (its committed HEAD, as CI's clean clone);
- ``npm install -g @anthropic-ai/claude-code``: the CLI the tests already use goes on
  PATH as ``claude`` (same package, already installed from npm);
- ``export ANTHROPIC_API_KEY=...``: the mock's key, plus ANTHROPIC_BASE_URL and an
  offline CLI configuration (claude_cli.claude_env);
- ``cd ~/src/your-project``: a fresh git repository with one commit;
- ``ov watch``: a person watches until the builder is done and presses q; the test
  polls `ov status --all --json` for that;
- ``bash .ci/test``: ``bash .ci/test --collect-only -q`` (it installs the test
  dependencies the same way; running the whole suite inside one of its tests would
  recurse), told where the Codex, Gemini and OpenCode CLIs the tests already use are
  (``OV_*_BIN``, which `.ci/test` honours), as ``claude`` is on PATH: otherwise it would
  download them again into the clone, about 850 MB; and with ``OV_SKIP_LINT=1``: ruff and mypy
  on the same tree have run already in this CI run (about 20 s of CPU).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import typing as t
from pathlib import Path

import pytest

from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from codex_cli import CODEX_BIN
from conftest import REPO_ROOT, make_repo, run_git, stop_project_processes
from gemini_cli import GEMINI_BIN
from kilo_cli import KILO_BIN
from mockapi import MockMessagesAPI, Reply, assistant_turns, conversation_text, text_reply, tool_reply
from opencode_cli import OPENCODE_BIN
from qwen_cli import QWEN_BIN

README = REPO_ROOT / "README.md"
SECTIONS = ("## Set-up", "## Run a real team")
WAIT_FOR_BUILDER = (
    "for i in $(seq 1 240); do "
    "state=$(ov status --all --json | python3 -c \"import json,sys; d=json.load(sys.stdin); "
    "print(next((a['state'] for a in d['agents'] if a['name']=='builder-greet'), 'missing'))\"); "
    "[ \"$state\" = completed ] && break; [ \"$state\" = zombie ] && exit 1; sleep 1; done; "
    "[ \"$state\" = completed ]"
)


def readme_steps() -> list[str]:
    """Every command line of the code blocks in the two sections, in order."""
    text = README.read_text(encoding="utf-8")
    steps: list[str] = []
    for title in SECTIONS:
        start = text.index(title + "\n")
        end = text.find("\n## ", start + len(title))
        section = text[start:end if end != -1 else None]
        for block in re.findall(r"```\n(.*?)```", section, flags=re.S):
            steps += [line.strip() for line in block.splitlines() if line.strip()]
    return steps


def substitute(step: str, *, repo_url: str, project_dir: Path, env: dict[str, str]) -> str:
    if "<repository-url>" in step:
        return step.replace("<repository-url>", shlex.quote(repo_url))
    if step == "npm install -g @anthropic-ai/claude-code":
        return "command -v claude"  # already on PATH (see the docstring)
    if step.startswith("export ANTHROPIC_API_KEY="):
        return f"export ANTHROPIC_API_KEY={shlex.quote(env['ANTHROPIC_API_KEY'])}"
    if step.startswith("cd ~/"):
        return f"cd {shlex.quote(str(project_dir))}"
    if step == "ov watch":
        return WAIT_FOR_BUILDER
    if step == "bash .ci/test":
        return f"{installed_clis()} OV_SKIP_LINT=1 bash .ci/test --collect-only -q"
    return step


def installed_clis() -> str:
    """The agent CLIs this run already has, as the variables that keep `.ci/test` from installing them."""
    found = {"OV_CODEX_BIN": CODEX_BIN, "OV_GEMINI_BIN": GEMINI_BIN, "OV_OPENCODE_BIN": OPENCODE_BIN,
             "OV_QWEN_BIN": QWEN_BIN, "OV_KILO_BIN": KILO_BIN}
    return " ".join(f"{name}={shlex.quote(path)}" for name, path in found.items() if path)


GREET_SCRIPT = [
    tool_reply("Bash", {"command": "printf 'def greet(name):\\n    return \"hello \" + name\\n' > greet.py && "
                                   "git add greet.py && git commit -q -m 'add greet'", "description": "write, commit"}),
    tool_reply("Bash", {"command": "ov mail send --type worker_done --subject 'greet added' --body 'greet.py committed'",
                        "description": "report"}),
    text_reply("greet.py is committed and reported."),
]
DEMO_SCRIPT = [
    tool_reply("Bash", {"command": "ov mail send --type worker_done --subject done --body 'demo task done'",
                        "description": "report"}),
    text_reply("Reported."),
]


def respond(body: dict[str, t.Any]) -> Reply:
    """The builder slung by the README gets the greet script; the demo's agents report and stop."""
    script = GREET_SCRIPT if "greet(name)" in conversation_text(body) else DEMO_SCRIPT
    position = assistant_turns(body)
    return script[position] if position < len(script) else text_reply("(done)")


@requires_claude
@pytest.mark.slow
@pytest.mark.timeout(900)  # two venv installs, two demos and a team: 160-230 s here, more on a loaded machine
def test_readme_setup_and_real_team_steps_work_as_written(tmp_path: Path) -> None:
    steps = readme_steps()
    assert "pip install . && ov demo" in steps and "bash .ci/test" in steps and "ov demo --runtime claude" in steps
    assert "python3 -m venv .venv && . .venv/bin/activate" in steps
    head = run_git(REPO_ROOT, "rev-parse", "HEAD").strip()
    project_dir = make_repo(tmp_path / "your-project", {"README.md": "# your project\n"})
    shim = tmp_path / "shim-bin"
    shim.mkdir()
    assert CLAUDE_BIN is not None
    (shim / "claude").symlink_to(CLAUDE_BIN)
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "tmp").mkdir()
    with MockMessagesAPI(respond) as api:
        env = claude_env(api.base_url, tmp_path)
        for name in list(env):
            if name.startswith(("OV_", "OVERSTORY_")) or name in ("VIRTUAL_ENV", "PYTHONPATH"):
                env.pop(name)
        # Nothing of the developer's venv: `ov` must come from the venv the README makes.
        path = [p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "ov").exists()]
        env["PATH"] = os.pathsep.join([str(shim), *path])
        env["TMPDIR"] = str(tmp_path / "tmp")  # the demo repositories land here, inside the test's folder
        script = ["set -euo pipefail"]
        for step in steps:
            script += [f"echo {shlex.quote('+++ ' + step)}",
                       substitute(step, repo_url=str(REPO_ROOT), project_dir=project_dir, env=env)]
        try:
            done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, env=env, capture_output=True,
                                  text=True, timeout=1800)
        finally:
            for found in (tmp_path / "tmp").glob("ov-demo-*"):
                stop_project_processes(_paths(found))
            stop_project_processes(_paths(project_dir))
        requests = api.main_requests
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    clone = work / "ov"
    assert run_git(clone, "rev-parse", "HEAD").strip() == head
    assert (clone / ".venv" / "bin" / "ov").is_file()
    demos = re.findall(r"(every agent completed|NOT every agent completed)", done.stdout)
    assert demos == ["every agent completed", "every agent completed"], log[-6000:]
    assert "runtime claude" in done.stdout
    # The team really ran on the real CLI: every agent's conversation reached the mock.
    assert len(requests) >= 2 * 3 + len(GREET_SCRIPT)
    # The builder's work is merged into the user's branch, cleaned up, and git status is clean.
    assert (project_dir / "greet.py").read_text() == 'def greet(name):\n    return "hello " + name\n'
    assert run_git(project_dir, "branch", "--list", "ov/builder-greet") == ""
    assert not (project_dir / ".overstory" / "worktrees" / "builder-greet").exists()
    assert run_git(project_dir, "status", "--porcelain", "--untracked-files=all") == ""
    status = json.loads(subprocess.run([str(clone / ".venv" / "bin" / "ov"), "status", "--all", "--json"],
                                       cwd=project_dir, env=env, capture_output=True, text=True).stdout)
    greet = next(a for a in status["agents"] if a["name"] == "builder-greet")
    assert greet["state"] == "completed" and greet["cost_usd"] > 0


def _paths(root: Path) -> t.Any:
    from overstory.paths import ProjectPaths

    return ProjectPaths(root)
