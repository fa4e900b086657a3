"""An agent's instructions: its role definition (``agents/<capability>.md``) followed by
the per-task overlay (``templates/overlay.md``) filled in for this one agent.

The overlay is a :class:`string.Template`; every ``$placeholder`` must have a value.
A missing value is an error, never an empty hole in the instructions.
"""

from __future__ import annotations

import re
import string
import typing as t
from pathlib import Path

from overstory.capabilities import CAPABILITIES as CAPABILITIES
from overstory.capabilities import WRITERS as WRITERS
from overstory.errors import OverlayError, UnknownCapability

READ_WRITE = "read-write inside your worktree"
READ_ONLY = "read-only"
NO_FILE_SCOPE = "no file scope given"
NO_PROMPT = ("No task text came with this assignment: run `ov mail check`, your dispatch mail "
             "says what to do.")
OVERLAY_TEMPLATE = "overlay.md"

# What the caller supplies; ``capability``, ``access`` and ``report_instructions`` are ours.
CONTEXT_KEYS = ("agent_name", "task_id", "branch", "base_branch", "worktree", "parent", "prompt", "file_scope")


def check_capability(capability: str) -> str:
    if capability not in CAPABILITIES:
        raise UnknownCapability(f"unknown capability {capability!r}; choose one of: {', '.join(CAPABILITIES)}")
    return capability


def access_for(capability: str) -> str:
    return READ_WRITE if check_capability(capability) in WRITERS else READ_ONLY


def render_file_scope(files: t.Iterable[str], *, enforced: bool = False) -> str:
    """A markdown list of the paths an agent should keep to, or ``NO_FILE_SCOPE``. ``enforced``: it is
    a writer's write scope, which the guard and `ov merge` hold it to."""
    paths = [str(path) for path in files if str(path).strip()]
    if not paths:
        return NO_FILE_SCOPE
    listed = "\n".join(f"- `{path}`" for path in paths)
    if enforced:
        return (f"{listed}\n\nThis is your write scope (`**` is any depth): ov refuses your writes to other files "
                "of the worktree, and `ov merge` refuses a branch that changes them. Reading is free. If another "
                "file must change, ask your parent first.")
    return f"{listed}\n\nKeep your work to these paths. Ask your parent before touching anything else."


def report_instructions(capability: str, context: t.Mapping[str, str]) -> str:
    """How this agent reports, as exact ``ov mail`` commands for its capability."""
    task, branch, parent = context["task_id"], context["branch"], context["parent"]
    done = "ov mail send --type worker_done"
    ask = (f"If you are blocked, ask instead: `ov mail send --to {parent} --type question "
           f'--subject "..." --body "..."`, then end your turn.')
    if capability == "builder":
        return (f"When the task is done and its tests pass:\n\n"
                f"1. Commit your work on `{branch}`:\n\n"
                f"       git add <the files you changed>\n"
                f'       git commit -m "{task}: <what changed>"\n\n'
                f"2. Tell `{parent}` (task id, branch and your name are added for you):\n\n"
                f'       {done} --subject "{task}: <one line>" \\\n'
                f'         --body "<what changed, which files, which tests you ran and their result>" \\\n'
                f"""         --payload '{{"files_modified": ["<each file you changed>"]}}'\n\n"""
                f"3. End your turn. Send `worker_done` once, and only after the commit.\n\n{ask}")
    if capability == "scout":
        return (f"When you can answer, send your findings to `{parent}` and end your turn:\n\n"
                f'       {done} --subject "{task}: <the answer in one line>" \\\n'
                f'         --body "<answer first, then path:line references, risks, proposed tasks>"\n\n'
                f"Send `worker_done` once. You do not commit anything.\n\n{ask}")
    if capability == "reviewer":
        return (f"When you have a verdict, send it to `{parent}` and end your turn:\n\n"
                f'       {done} --subject "{task}: PASS" --body "<what you checked, tests you ran>"\n'
                f'       {done} --subject "{task}: FAIL" --body "<numbered problems with path:line and the fix>"\n\n'
                f"Send `worker_done` once. You do not commit anything.\n\n{ask}")
    if capability == "lead":
        return (f"For each builder whose work you checked and accept, tell `{parent}` it can be merged:\n\n"
                f"       ov mail send --type merge_ready --to {parent} \\\n"
                '         --subject "merge_ready: <builder name>" --body "<what it does, tests run>" \\\n'
                """         --payload '{"agent": "<builder name>", "branch": "ov/<builder name>", """
                """"task_id": "<its task id>", "files_modified": ["<each file the branch changes>"]}'\n\n"""
                "Always name the builder in the payload: left out, `agent`, `branch` and `task_id` are yours.\n\n"
                f"When your whole stream (`{task}`) is merged (ov refuses your report while a builder of yours is "
                f"working or unmerged), report to `{parent}` and end your turn:\n\n"
                f'       {done} --subject "{task}: <one line>" \\\n'
                f'         --body "<what was built, by whom, what is merged, what is still open>"\n\n'
                f"Send your own `worker_done` once, at the very end.\n\n{ask}")
    if capability == "merger":
        return (f"Report the outcome to `{parent}` and end your turn. Exactly one of:\n\n"
                f'       ov mail send --type merged --subject "{task}: merged" \\\n'
                f'         --body "<what was merged into {branch}, how each conflict was resolved, tests run>" \\\n'
                """         --payload '{"branch": "<the branch you merged>", "tier": 3}'\n"""
                f'       ov mail send --type merge_failed --subject "{task}: merge failed" \\\n'
                '         --body "<both intents and the decision that is needed>" \\\n'
                """         --payload '{"branch": "<the branch>", "reason": "<one line>", """
                """"conflict_files": ["<each conflicting file>"]}'\n\n"""
                "(`tier` 3 means the conflicts were resolved by an agent.) "
                f"Commit before sending `merged`; run `git merge --abort` before sending `merge_failed`.\n\n{ask}")
    if capability == "coordinator":
        return (f"You report to `{parent}`. You are persistent: never send `worker_done`.\n\n"
                f"- Progress worth knowing: `ov mail send --to {parent} --type status "
                '--subject "..." --body "..."`\n'
                f"- The objective is done (what was merged, what is open): `ov mail send --to {parent} "
                '--type result --subject "..." --body "..."`\n'
                f"- A decision only a human can make: `ov mail send --to {parent} --type question "
                '--subject "..." --body "..."`, then end your turn.')
    # monitor
    return (f"You report to `{parent}`. You are persistent: never send `worker_done`.\n\n"
            '- Remind a stuck agent: `ov mail send --to NAME --type nudge --subject "..." --body "..."`\n'
            f'- Raise a problem with evidence: `ov mail send --to {parent} --type escalation --subject "..." '
            """--body "..." --payload '{"severity": "warning"}'` (or `error`, `critical`; """
            "or to the stuck agent's own parent)\n"
            f'- A periodic summary when asked: `ov mail send --to {parent} --type status --subject "..." '
            '--body "..."`')


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise OverlayError(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc


# How the shipped roles name Claude Code's own delegation tools (wrapped anywhere), replaced per runtime.
_CLAUDE_AGENT_TOOLS = re.compile(r"Claude's\s+own\s+sub-agent\s+or\s+team\s+tools\s+\(Task,\s+Agent,\s+SendMessage,"
                                 r"\s+team\s+creation\)")


def for_runtime(text: str, own_agent_tools: str | None) -> str:
    """A role's text with Claude's delegation tools replaced by ``own_agent_tools`` (a runtime's own)."""
    if own_agent_tools is None:
        return text
    return _CLAUDE_AGENT_TOOLS.sub(lambda _: own_agent_tools, text)


def render_instructions(capability: str, context: t.Mapping[str, str], *,
                        agents_dir: Path, templates_dir: Path, own_agent_tools: str | None = None) -> str:
    """The full instructions for one agent: base definition (in its runtime's terms: ``own_agent_tools``),
    then the rendered overlay.

    ``context`` must hold every key in ``CONTEXT_KEYS`` (``prompt`` and ``file_scope``
    may be empty strings) plus any extra placeholder a customised template uses.
    """
    check_capability(capability)
    if context.get("capability", capability) != capability:
        raise OverlayError(f"context says capability {context['capability']!r} but {capability!r} was asked for")
    missing = [key for key in CONTEXT_KEYS if key not in context]
    if missing:
        raise OverlayError(f"cannot render the overlay for {capability}: missing value for {', '.join(missing)}")

    base = for_runtime(_read(Path(agents_dir) / f"{capability}.md", f"role definition for {capability!r}"),
                       own_agent_tools)
    template = string.Template(_read(Path(templates_dir) / OVERLAY_TEMPLATE, "overlay template"))
    values = dict(context)
    values["capability"] = capability
    values["prompt"] = context["prompt"].strip() or NO_PROMPT
    values["file_scope"] = context["file_scope"].strip() or NO_FILE_SCOPE
    values["access"] = access_for(capability)
    values["report_instructions"] = report_instructions(capability, context)

    if not template.is_valid():
        raise OverlayError(f"the overlay template {Path(templates_dir) / OVERLAY_TEMPLATE} has a bad $placeholder "
                           "(write $$ for a literal dollar sign)")
    unknown = sorted(set(template.get_identifiers()) - set(values))
    if unknown:
        raise OverlayError(f"cannot render the overlay for {capability}: missing value for {', '.join(unknown)}")
    return base.rstrip("\n") + "\n" + template.substitute(values)
