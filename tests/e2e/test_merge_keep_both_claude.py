"""Four builders append to the same files; `ov merge --all` keeps every line, proven by the merge gates.

Two builders run the REAL Claude Code CLI (each against its own mock Messages API on 127.0.0.1:
only the model is scripted; its Bash appends a function to calc.py with a shell redirect) and two
run the scripted runtime (each appends a line to README.md). Every pair conflicts for git (both
sides inserted at the end of the file); tier 2 keeps both insertions, the earlier-ready branch
first, and the merge gates (`merge.gates`) must pass on each combination before it is committed.
"""

from __future__ import annotations

import json
from pathlib import Path

from agent_helpers import mail_rows, wait_terminal
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import run_git, run_ov
from mockapi import MockMessagesAPI, text_reply, tool_reply
from overstory.paths import ProjectPaths
from test_merge_flow import DONE, sling
from test_watchdog import write_local_config

CALC = "def add(a, b):\n    return a + b\n"
FUNCTIONS = {"sub": "def sub(a, b):\n    return a - b\n", "mul": "def mul(a, b):\n    return a * b\n"}
NOTES = {"notes-a": "- calc.py has sub()\n", "notes-b": "- calc.py has mul()\n"}
CHECK_NAMES = """import ast, sys
names = [n.name for n in ast.parse(open("calc.py").read()).body if isinstance(n, ast.FunctionDef)]
twice = sorted({n for n in names if names.count(n) > 1})
sys.exit(f"defined twice in calc.py: {', '.join(twice)}" if twice else 0)
"""
GATES = ["python3 check_names.py", "python3 -c 'import calc; assert calc.add(2, 3) == 5'"]


def claude_builder(name: str) -> list:
    append = f"cat >> calc.py <<'EOF'\n\n\n{FUNCTIONS[name]}EOF"
    return [
        tool_reply("Bash", {"command": append, "description": "append the function"}),
        tool_reply("Bash", {"command": f"git add calc.py && git commit -q -m 'calc: {name}()'", "description": "commit"}),
        tool_reply("Bash", {"command": f"ov mail send --type worker_done --subject '{name}() added' --body 'committed'",
                            "description": "report"}),
        text_reply(f"Done: {name}() is committed and reported."),
    ]


def ready_order(project: ProjectPaths, names: list[str]) -> list[str]:
    """The builders in the order their worker_done arrived (what `ov merge --all` calls ready)."""
    return [m["sender"] for m in mail_rows(project, type="worker_done") if m["sender"] in names]


@requires_claude
def test_four_builders_appending_to_the_same_files_all_merge_and_every_line_is_kept(project: ProjectPaths,
                                                                                     tmp_path: Path) -> None:
    root = project.root
    (root / "calc.py").write_text(CALC)
    (root / "check_names.py").write_text(CHECK_NAMES)
    run_git(root, "add", "calc.py", "check_names.py")
    run_git(root, "commit", "-qm", "calc and its gate")
    write_local_config(project, merge={"gates": GATES})
    readme = (root / "README.md").read_text()

    with MockMessagesAPI(claude_builder("sub")) as sub_api, MockMessagesAPI(claude_builder("mul")) as mul_api:
        for name, api in (("sub", sub_api), ("mul", mul_api)):
            env = claude_env(api.base_url, tmp_path / name, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude"})
            slung = run_ov("sling", "builder", name, "--prompt", f"Append {name}() to calc.py and commit it.",
                           cwd=root, env=env)
            assert slung.returncode == 0, slung.stderr
        for task, line in NOTES.items():
            sling(project, tmp_path, task, [{"write": {"path": "README.md", "content": readme + line}},
                                            {"bash": "git add README.md && git commit -q -m 'a note'"}, DONE],
                  wait=False)
        for name in ("builder-sub", "builder-mul", "builder-notes-a", "builder-notes-b"):
            agent = wait_terminal(project, name, timeout=120)
            assert agent.state == "completed", f"{name}: {agent.state_reason}"
        assert sub_api.main_requests and mul_api.main_requests

    result = run_ov("merge", "--all", "--json", cwd=root, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    merges = json.loads(result.stdout)["merges"]
    assert sorted(m["agent"] for m in merges if m["merged"]) == [
        "builder-mul", "builder-notes-a", "builder-notes-b", "builder-sub"]
    kept = {m["agent"]: m["resolutions"] for m in merges if m["tier"] == 2}
    assert sorted(kept) == sorted([ready_order(project, ["builder-sub", "builder-mul"])[1],
                                   ready_order(project, ["builder-notes-a", "builder-notes-b"])[1]])
    assert all("both sides only added" in how for resolutions in kept.values() for how in resolutions.values())

    # Every added line once, each file's earlier-ready builder first.
    calc_order = [n.removeprefix("builder-") for n in ready_order(project, ["builder-sub", "builder-mul"])]
    assert run_git(root, "show", "main:calc.py") == CALC + "".join("\n\n" + FUNCTIONS[n] for n in calc_order)
    notes_order = [n.removeprefix("builder-") for n in ready_order(project, ["builder-notes-a", "builder-notes-b"])]
    assert run_git(root, "show", "main:README.md") == readme + "".join(NOTES[n] for n in notes_order)
