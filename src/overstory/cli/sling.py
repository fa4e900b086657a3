from __future__ import annotations

from pathlib import Path

import click

from overstory.cli._common import completer, json_option, project_option
from overstory.cli.budget import DURATION
from overstory.runtimes import RUNTIME_NAMES


@click.command(name="sling")
@click.argument("capability", shell_complete=completer("complete_capabilities"))
@click.argument("task_id")
@click.option("--name", help="Agent name (default: CAPABILITY-TASK_ID).")
@click.option("--prompt", help="What the agent should do.")
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path), help="Read the prompt from a file.")
@click.option("--files", multiple=True, metavar="PATTERNS",
              help="Write scope of a builder: paths relative to the worktree, comma-separated or repeated, globs "
                   "allowed ('src/calc.py,src/calc/**'); writes elsewhere in the worktree are refused.")
@click.option("--parent", shell_complete=completer("complete_agents"), help="Agent to report to (default: the calling agent, else operator).")
@click.option("--runtime", type=click.Choice(RUNTIME_NAMES), help="Runtime (default: config runtimes.<capability>, else runtime.default).")
@click.option("--model", help="Model for this agent.")
@click.option("--provider", help="Config provider serving --model (same as --model PROVIDER/MODEL).")
@click.option("--base-branch", help="Branch to start from (default: the project's current branch).")
@click.option("--scenario", type=click.Path(dir_okay=False, path_type=Path),
              help="Scenario file for the scripted runtime (format: docs/scripted-runtime.md).")
@click.option("--tmux/--headless", "tmux", default=None,
              help="Run the interactive TUI in tmux (`ov attach NAME`), or headless turns (default: runtime.tmux).")
@click.option("--max-usd", type=click.FloatRange(min=0), help="Budget: dollars (default: config budgets.agent).")
@click.option("--max-turns", type=click.IntRange(min=0), help="Budget: turns.")
@click.option("--max-tool-calls", type=click.IntRange(min=0), help="Budget: tool calls.")
@click.option("--max-wallclock", type=DURATION, help="Budget: wall-clock time since the sling (90m, 4h).")
@click.option("--approve", "approve", multiple=True, metavar="PATTERN",
              help="Calls matching this tool pattern need approval first, e.g. 'Bash(git push*)'; repeatable.")
@click.option("--executor", type=click.Choice(("local", "ray")),
              help="Where its turns run (default: config executor.kind); ray needs executor.ray.address.")
@click.option("--group", help="Put the agent in this task group (`ov group create NAME` first).")
@json_option
def sling(capability: str, task_id: str, name: str | None, prompt: str | None, spec_file: Path | None,
          files: tuple[str, ...], parent: str | None, runtime: str | None, model: str | None, provider: str | None,
          base_branch: str | None, scenario: Path | None, tmux: bool | None, max_usd: float | None,
          max_turns: int | None, max_tool_calls: int | None, max_wallclock: float | None, approve: tuple[str, ...], executor: str | None,
          group: str | None, as_json: bool) -> None:
    """Spawn an agent on a task: branch, worktree, instructions, guards, dispatch mail.

    \b
    ov sling builder task-42 --prompt "add a --json flag to status" --files src/status.py
    ov sling builder calc --files 'src/calc.py,src/calc/**'   # writes elsewhere are refused
    ov sling scout survey --runtime scripted
    ov sling builder task-7 --spec specs/task-7.md --model sonnet
    ov sling builder task-11 --provider ollama --model qwen3-coder   # a local model, $0
    ov sling builder task-8 --tmux     # then: ov attach builder-task-8
    ov sling builder task-9 --max-usd 2 --max-turns 30 --max-wallclock 90m
    ov sling builder task-10 --approve 'Bash(git push*)'   # pushing waits for `ov approve`
    ov sling builder task-12 --executor ray   # its turns run on the Ray cluster (config executor.ray)
    ov sling builder task-13 --group auth     # a member of task group auth (`ov group status auth`)

    \b
    Crossing a budget parks the agent (`ov resume NAME --add-usd 5` continues it);
    a child's budget never exceeds what is left of its run's.
    """
    from overstory.cli.sling_body import sling as body

    body(project_option(), capability=capability, task_id=task_id, name=name, prompt=prompt, spec_file=spec_file,
         files=files, parent=parent, runtime=runtime, model=model, provider=provider, base_branch=base_branch,
         scenario=scenario, tmux=tmux, max_usd=max_usd, max_turns=max_turns, max_tool_calls=max_tool_calls,
         max_wallclock=max_wallclock, approve=approve, executor=executor, group=group, as_json=as_json)
