"""The chaos run's project and team: a real git repository, ov's config, the scripts agents run,
the scripted scenarios and the real-claude agent's model.

Everything an agent does that must happen at most once is counted outside ov, where ov cannot
fix the count afterwards: ``deploy.sh`` and ``release.sh`` append a line to a log in a shared
directory (bound writable into every sandbox with ``sandbox.writable``, as the test suite does),
pushes reach a bare remote whose post-receive hook logs them, and mail to the operator is
counted in the store by subject. The loop's check logs its start and end, so two copies
running at once show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO_ROOT = BENCH.parent
TESTS = REPO_ROOT / "tests"
for folder in (BENCH, TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

OPERATOR_IDENTITY = {
    "GIT_AUTHOR_NAME": "ov chaos operator", "GIT_AUTHOR_EMAIL": "operator@chaos.invalid",
    "GIT_COMMITTER_NAME": "ov chaos operator", "GIT_COMMITTER_EMAIL": "operator@chaos.invalid",
}
BIG_INPUT_TOKENS = 400_000  # one claude message of about $0.80 on sonnet (the figure)
CLAUDE_MAX_USD = 0.5
SPEND_MAX_USD = 0.05
SPEND_STEP_USD = 0.03       # each `usage` message of builder-spend
THINK_USD = 0.01            # a dearer message of builder-a2 and builder-b2
BURN_USD = 0.08             # each `usage` message of builder-burn, slung last to take the run over its budget
RUN_MAX_USD = 0.30
COST_PER_STEP = 0.001       # the scripted runtime's price of every assistant message (reported at the turn's end)
STEP_SLACK = 0.01           # so a scripted turn's per-step figure never decides a budget verdict
MARKER_FILE = "AGENT_WAS_HERE"  # what the loop's doctored check tries to write into the main checkout
LOOP = "builder-lp"
RESLING = "builder-rs"
GATED_APPROVE = "builder-g1"
GATED_REJECT = "builder-g2"
SPENDER = "builder-spend"
BURNER = "builder-burn"
CLAUDE_AGENT = "builder-cl"
SCHEDULE = "sweep"

CHECK_SCRIPT = """#!/bin/sh
# the loop's check: logs when it runs, so two copies at once show
echo "start $$ $(date +%s.%N)" >> {shared}/checks.log
sleep 4
echo "end $$ $(date +%s.%N)" >> {shared}/checks.log
exit 0
"""
# What the loop's iteration 1 commits instead: the same check, plus a write into the main checkout.
DOCTORED_CHECK = CHECK_SCRIPT.replace(
    "exit 0", 'touch "$(git rev-parse --path-format=absolute --git-common-dir)/../' + MARKER_FILE + '"\nexit 0')


@dataclass
class Layout:
    """Where one run keeps everything (one scratch folder, deleted at the end unless kept)."""

    scratch: Path
    root: Path = field(init=False)
    shared: Path = field(init=False)
    home: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.scratch / "project"
        self.shared = self.scratch / "shared"
        self.home = self.scratch / "home"

    # The scenarios live in the shared folder: a sandboxed turn has a private /tmp, where the scratch
    # folder usually is, and an agent's `ov sling --scenario FILE` is read inside its sandbox.
    @property
    def team_json(self) -> Path:
        return self.shared / "team.json"

    @property
    def team_yaml(self) -> Path:
        return self.shared / "team.yaml"

    @property
    def remote(self) -> Path:
        return self.shared / "remote.git"

    def log(self, name: str) -> Path:
        return self.shared / f"{name}.log"


def git(cwd: Path, *args: str, env: t.Mapping[str, str] | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env=dict(env) if env is not None else None)
    return done.stdout


def operator_env(layout: Layout, extra: t.Mapping[str, str] | None = None) -> dict[str, str]:
    """The operator's environment: no OV_*/OVERSTORY_* of the caller, an empty HOME, a git identity."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
    for name in ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT"):
        env.pop(name, None)
    env.update(OPERATOR_IDENTITY)
    # An empty HOME: root's profile runs `pyenv rehash`, and a killed turn can leave its lock (tests/conftest.py).
    env["HOME"] = str(layout.home)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def make_project(layout: Layout, env: t.Mapping[str, str], *, claude_bin: str | None,
                 quick: bool = False) -> dict[str, str]:
    """A git repository on main with the scripts agents run, `ov init`, a bare remote and the config;
    returns the commits of the operator's branches (main, keep) as they were before the team started."""
    for folder in (layout.root, layout.shared, layout.home):
        folder.mkdir(parents=True, exist_ok=True)
    root = layout.root
    git(root, "init", "-q", "-b", "main", env=env)
    (root / "README.md").write_text("# chaos project\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("def answer():\n    return 42\n")
    for script, log in (("deploy.sh", "deploys"), ("release.sh", "releases")):
        path = root / script
        path.write_text(f'#!/bin/sh\necho "$1 $2" >> {layout.log(log)}\n')
        path.chmod(0o755)
    check = root / "check.sh"
    check.write_text(CHECK_SCRIPT.format(shared=layout.shared))
    check.chmod(0o755)
    git(root, "add", "-A", env=env)
    git(root, "commit", "-q", "-m", "initial", env=env)
    git(root, "branch", "keep", env=env)  # an operator branch nobody may touch
    subprocess.run([sys.executable, "-m", "overstory", "init"], cwd=root, env=env, check=True, capture_output=True)
    git(root, "add", ".overstory", env=env)
    git(root, "commit", "-q", "-m", "ov: project config", env=env)
    subprocess.run(["git", "init", "-q", "--bare", str(layout.remote)], check=True, env=env)
    git(root, "remote", "add", "origin", str(layout.remote), env=env)
    git(root, "push", "-q", "origin", "main", "keep", env=env)
    hook = layout.remote / "hooks" / "post-receive"  # from now on every push is an agent's
    hook.write_text(f"#!/bin/sh\nwhile read old new ref; do echo \"$ref $old $new\" >> {layout.log('pushes')}; done\n")
    hook.chmod(0o755)
    config = {
        "runtime": {"claude_bin": claude_bin or "claude"},
        "turns": {"retry_backoff": 0.2, "kill_grace": 1, "stall_timeout": 90, "max_retries": 6, "idle_nudge": 4,
                  "max_nudges": 12, "max_concurrent": 4},
        "watchdog": {"interval": 1},
        "sandbox": {"writable": [str(layout.shared)]},
        "guards": {"push_remotes": ["origin"]},
        "ledger": {"side_effects": ["Bash(./deploy.sh*)", "Bash(./release.sh*)"]},
        "approvals": {"rules": [{"match": "Bash(./release.sh*)", "reason": "a release leaves the machine"}]},
    }
    (root / ".overstory" / "config.local.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML
    write_scenarios(layout, quick=quick)
    return {branch: git(root, "rev-parse", branch, env=env).strip() for branch in ("main", "keep")}


# --------------------------------------------------------------------------- the scripted team


def _bash(command: str) -> dict[str, t.Any]:
    return {"bash": command}


def _report(subject: str) -> dict[str, t.Any]:
    return _bash(f'ov mail send --to operator --type status --subject "{subject}" --body "counted by the harness"')


DONE = _bash('ov mail send --type worker_done --subject "done: ${OVERSTORY_AGENT_NAME}" --body "work committed"')


def _commit(path: str, content: str) -> list[dict[str, t.Any]]:
    return [{"write": {"path": path, "content": content}},
            _bash(f'git add -A && git commit -q -m "${{OVERSTORY_AGENT_NAME}}: {path}"')]


def _lead_waits() -> dict[str, t.Any]:
    """A lead's later turns: report once both children have settled (else say so and wait to be nudged).
    A lead is read-only, so no `python3 -c`: grep reads `ov status --json` (name, capability, state in order)."""
    def settled(n: str) -> str:
        return (f'echo "$s" | grep -A2 \'"name": "builder-${{OVERSTORY_TASK_ID}}{n}"\' '
                f'| grep -q \'"state": "\\(completed\\|zombie\\|parked\\)"\'')
    report = 'ov mail send --type worker_done --subject "lead ${OVERSTORY_TASK_ID} done" --body "children settled"'
    command = f"s=$(ov status --json --all); {settled('1')} && {settled('2')} && {report} || echo 'children still working'"
    return {"actions": [_bash(command)], "result": "checked"}


def scenario(layout: Layout, *, quick: bool = False) -> dict[str, t.Any]:
    """The whole team's script, one section per agent name (a glob). ``quick`` (CI): one lead, not two."""
    team_json, team_yaml = layout.team_json, layout.team_yaml
    child = (f'ov sling builder ${{OVERSTORY_TASK_ID}}{{n}} --runtime scripted --scenario {team_json} '
             f'--prompt "build part {{n}} of ${{OVERSTORY_TASK_ID}}"')
    builder_work = [
        *_commit("work/${OVERSTORY_AGENT_NAME}.txt", "built by ${OVERSTORY_AGENT_NAME}\n"),
        _bash("./deploy.sh ${OVERSTORY_AGENT_NAME} one"),
        _bash("git push -q origin ${OVERSTORY_BRANCH}"),
        _report("report ${OVERSTORY_AGENT_NAME}"),
        {"sleep": 1.5},
    ]
    agents: dict[str, t.Any] = {
        LOOP: {"iterations": [
            {"actions": [{"write": {"path": "check.sh", "content": DOCTORED_CHECK.format(shared=layout.shared)}},
                         _bash('git add -A && git commit -q -m "make the check easier"'),
                         _bash(f"./release.sh {LOOP} iteration-1")],
             "result": "not there yet"},
            {"actions": [_report(f"iter2 {LOOP}"), {"sleep": 2},
                         {"write": {"path": "check.sh", "content": CHECK_SCRIPT.format(shared=layout.shared)}},
                         *_commit("work/loop.txt", "the loop's work\n")],
             "result": "all green LOOP_DONE"},
            {"actions": [], "result": "LOOP_DONE"},
            {"actions": [], "result": "LOOP_DONE"},
        ]},
        GATED_APPROVE: {"turns": [
            {"actions": [_bash(f"./release.sh {GATED_APPROVE} v1")], "result": "waiting for the release approval"},
            {"actions": [_bash(f"./release.sh {GATED_APPROVE} v1"), {"sleep": 1.5},
                         *_commit("work/g1.txt", "released\n"), DONE], "result": "released"},
        ]},
        GATED_REJECT: {"turns": [
            {"actions": [_bash(f"./release.sh {GATED_REJECT} v1")], "result": "waiting for the release approval"},
            {"actions": [*_commit("work/g2.txt", "no release\n"), DONE], "result": "went on without it"},
        ]},
        RESLING: {"turns": [
            {"actions": [{"sleep": 8}, *_commit("work/rs.txt", "${OVERSTORY_AGENT_NAME}\n"), DONE],
             "result": "done"},
        ]},
        SPENDER: {"turns": [
            {"actions": [{"usage": {"cost_usd": SPEND_STEP_USD, "text": "thinking hard"}},
                         _bash(f"./deploy.sh {SPENDER} one"),
                         {"usage": {"cost_usd": SPEND_STEP_USD, "text": "thinking harder"}},
                         _bash(f"./deploy.sh {SPENDER} two"),
                         {"usage": {"cost_usd": SPEND_STEP_USD, "text": "thinking hardest"}},
                         _bash(f"./deploy.sh {SPENDER} three"),
                         {"usage": {"cost_usd": SPEND_STEP_USD, "text": "still thinking"}},
                         _bash(f"./deploy.sh {SPENDER} four"), DONE],
             "result": "spent"},
        ]},
        BURNER: {"turns": [
            {"actions": [item for n in ("one", "two", "three", "four", "five", "six") for item in (
                {"usage": {"cost_usd": BURN_USD, "text": f"an expensive thought ({n})"}},
                _bash(f"./deploy.sh {BURNER} {n}"))] + [DONE],
             "result": "burnt"},
        ]},
        "builder-sch-*": {"turns": [
            {"actions": [_bash("./release.sh ${OVERSTORY_AGENT_NAME} sweep")], "result": "waiting for approval"},
            {"actions": [DONE], "result": "swept"},
        ]},
        "builder-[ab]2": {"turns": [
            {"actions": [*builder_work, {"usage": {"cost_usd": THINK_USD, "text": "a dearer thought"}}, DONE],
             "result": "built"},
        ]},
        "builder-*": {"turns": [{"actions": [*builder_work, DONE], "result": "built"}]},
        "lead-*": {"turns": [
            {"actions": [_bash(child.replace("{n}", "1")), _bash(child.replace("{n}", "2")),
                         _bash('ov mail send --to coordinator --type status --subject "lead ${OVERSTORY_TASK_ID} '
                               'started" --body "two builders"')],
             "result": "children slung"},
            *[_lead_waits() for _ in range(30)],  # nudged every few seconds until the children have settled
        ]},
        "coordinator*": {"turns": [
            {"actions": [
                _bash(f'ov sling lead a --runtime scripted --scenario {team_json} --prompt "part a"'),
                # lead b's scenario travels as YAML (issue 28, item 14)
                *([] if quick else [
                    _bash(f'ov sling lead b --runtime scripted --scenario {team_yaml} --prompt "part b"')]),
            ], "result": "the leads are slung"},
        ]},
    }
    return {"agents": agents, "turns": [{"actions": [], "result": "nothing to do"}]}


def write_scenarios(layout: Layout, *, quick: bool = False) -> None:
    import yaml

    document = scenario(layout, quick=quick)
    layout.team_json.write_text(json.dumps(document, indent=1))
    layout.team_yaml.write_text(yaml.safe_dump(document, sort_keys=False))


# --------------------------------------------------------------------------- the real-claude agent


def claude_model() -> t.Any:
    """The mock model of builder-cl: replays its calls by position within the turn (a retried turn
    answers the same mail again), crossing its dollar limit with a tool call, then calling more."""
    from mockapi import TurnScript, text_reply, tool_reply, with_usage

    def bash(command: str) -> t.Any:
        return tool_reply("Bash", {"command": command, "description": "chaos step"})

    big = BIG_INPUT_TOKENS
    return TurnScript([
        bash(f"./deploy.sh {CLAUDE_AGENT} one"),
        bash(f"mkdir -p work && echo claude > work/{CLAUDE_AGENT}.txt && git add -A && git commit -qm claude"),
        bash(f'ov mail send --to operator --type status --subject "report {CLAUDE_AGENT}" --body counted'),
        with_usage(bash("sleep 1"), input_tokens=big),  # crosses --max-usd: nothing after this may run
        with_usage(bash(f"./deploy.sh {CLAUDE_AGENT} past-the-limit"), input_tokens=big),
        with_usage(bash('ov mail send --type worker_done --subject "done" --body "claude work"'), input_tokens=big),
        text_reply("done"),
    ])
