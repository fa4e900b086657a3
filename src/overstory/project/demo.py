"""`ov demo`: a small team working in a throw-away repository, start to finish."""

from __future__ import annotations

import subprocess
import tempfile
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory.paths import ProjectPaths
from overstory.store import sessions

DEMO_FILES = {
    "README.md": "# demo project\n\nA tiny repository that an ov team works on.\n",
    "src/app.py": "def greet(name):\n    return f'hello {name}'\n",
}
TEAM = (
    ("scout", "survey", "Survey the repository and report what you find."),
    ("builder", "docs", "Write notes for the docs task and commit them."),
    ("builder", "api", "Write notes for the api task and commit them."),
)


@dataclass
class DemoOutcome:
    project: Path
    agents: list[sessions.Session]
    seconds: float
    timeout: float = 0.0

    @property
    def reasons(self) -> dict[str, str]:
        """Why each agent that did not complete did not (its state's reason, or that time ran out)."""
        found = {}
        for agent in self.agents:
            if agent.state == "completed":
                continue
            why = agent.state_reason or "no reason recorded"
            if not agent.is_terminal and agent.state != "parked":
                why = f"still {agent.state} after {self.timeout:g}s ({why})"
            found[agent.name] = why
        return found

    @property
    def all_completed(self) -> bool:
        return all(agent.state == "completed" for agent in self.agents)

    @property
    def exit_code(self) -> int:
        """`ov wait`'s contract: 0 all completed, 3 zombie, 4/5/6 parked, 124 still running at the timeout."""
        from overstory.views.waiting import EXIT_TIMEOUT, is_settled, outcome_code

        if not all(is_settled(agent) for agent in self.agents):
            return EXIT_TIMEOUT
        return outcome_code(self.agents)


def make_demo_repo(directory: Path | None) -> Path:
    root = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="ov-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        from overstory.errors import UsageError

        raise UsageError(f"{root} is not empty; give an empty or new --dir")
    env_git = ["-c", "user.name=ov demo", "-c", "user.email=demo@ov.invalid"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    for name, text in DEMO_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", *env_git, "commit", "-q", "-m", "demo: initial commit"], cwd=root, check=True)
    return root


def run_demo(*, runtime: str, directory: Path | None, timeout: float,
             on_change: t.Callable[[sessions.Session], None] = lambda agent: None,
             environ: t.Mapping[str, str] | None = None, claude_bin: str | None = None) -> DemoOutcome:
    """Create the repository, sling the team and wait until every agent is terminal or ``timeout`` passes.

    ``claude_bin`` (the operator's ``runtime.claude_bin``) goes into the demo project's
    config.local.yaml, so the agents' turns start the same program.
    """
    import os

    from overstory.agents.spawn import SlingRequest, sling
    from overstory.config.load import load as load_config
    from overstory.project.init import init_project
    from overstory.store.db import open_state

    started = time.monotonic()
    root = make_demo_repo(directory)
    init_project(root)
    project = ProjectPaths(root)
    if claude_bin:
        import json

        project.local_config_file.write_text(f"runtime:\n  claude_bin: {json.dumps(claude_bin)}\n", encoding="utf-8")
    environ = dict(os.environ if environ is None else environ)
    for name in list(environ):
        if name.startswith("OVERSTORY_"):
            environ.pop(name)  # the demo team reports to the operator, even when run inside an agent
    environ.setdefault("GIT_AUTHOR_NAME", "ov demo agent")
    environ.setdefault("GIT_AUTHOR_EMAIL", "agent@ov.invalid")
    environ.setdefault("GIT_COMMITTER_NAME", "ov demo agent")
    environ.setdefault("GIT_COMMITTER_EMAIL", "agent@ov.invalid")
    config = load_config(project.config_file, project.local_config_file, environ=environ)
    conn = open_state(project.state_db)
    try:
        names = []
        for capability, task, prompt in TEAM:
            result = sling(project, config, conn, SlingRequest(capability=capability, task_id=task, prompt=prompt,
                                                                runtime=runtime), environ)
            names.append(result.name)
        seen: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while True:
            agents = [a for a in (sessions.get(conn, n) for n in names) if a is not None]
            for agent in agents:
                if seen.get(agent.name) != agent.state:
                    seen[agent.name] = agent.state
                    on_change(agent)
            if all(a.is_terminal or a.state == "parked" for a in agents) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        return DemoOutcome(project=root, agents=agents, seconds=time.monotonic() - started, timeout=timeout)
    finally:
        conn.close()
