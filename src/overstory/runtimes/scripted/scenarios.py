"""Built-in scenarios for the scripted runtime: what a fake model does, per capability.

Placeholders like ${OVERSTORY_TASK_ID} are expanded by the scripted runtime from the
turn's environment, so one scenario serves any agent.
"""

from __future__ import annotations

import typing as t

from overstory.capabilities import WRITERS

REPORT = 'ov mail send --type worker_done --subject "done: ${OVERSTORY_TASK_ID}" --body '


def default_scenario(capability: str, task_id: str) -> dict[str, t.Any]:
    """What the capability does by itself; in an `ov loop`, its ``iterations`` and ``later_iterations``."""
    return {**_plain(capability, task_id), **_looping(capability)}


def _plain(capability: str, task_id: str) -> dict[str, t.Any]:
    if capability in WRITERS:
        actions: list[dict[str, t.Any]] = [*_NOTES]
        if capability == "builder":
            actions.append({"bash": REPORT + '"committed work/${OVERSTORY_TASK_ID}.md on ${OVERSTORY_BRANCH}"'})
        else:
            actions.append({"bash": "ov mail send --type merged --subject \"merged ${OVERSTORY_TASK_ID}\" "
                                    "--payload '{\"tier\": 1, \"branch\": \"${OVERSTORY_BRANCH}\"}'"})
        return {"turns": [{"actions": actions, "result": f"{task_id}: work committed and reported"}]}
    if capability == "coordinator":
        return {"turns": [{"actions": [{"text": "Coordinator ready; waiting for objectives."}], "result": "ready"}]}
    if capability == "monitor":  # persistent: it reports what it saw, never worker_done
        return {"turns": [{"actions": [{"bash": "ov status"}, {"bash": 'ov mail send --type status --subject '
                                                                       '"monitor: watching" --body "no trouble seen"'}],
                           "result": "watching"}]}
    return {"turns": [{
        "actions": [
            *_LOOK,
            {"bash": REPORT + '"findings: the repository layout is listed above; nothing blocks the task"'},
        ],
        "result": f"{task_id}: findings reported",
    }]}


_NOTES: list[dict[str, t.Any]] = [
    {"text": "Reading the task and the instructions in .claude/CLAUDE.md."},
    {"bash": "git status --short"},
    {"write": {"path": "work/${OVERSTORY_TASK_ID}.md",
               "content": "# ${OVERSTORY_TASK_ID}\n\nDone by ${OVERSTORY_AGENT_NAME} (scripted runtime).\n"}},
    {"bash": 'git add work/${OVERSTORY_TASK_ID}.md && git commit -q -m "${OVERSTORY_TASK_ID}: add notes"'},
]
_LOOK: list[dict[str, t.Any]] = [
    {"text": "Looking around the repository."},
    {"bash": "git log --oneline -n 5"},
    {"bash": "ls"},
]


def _progress(line: str) -> dict[str, t.Any]:
    return {"write": {"path": ".overstory-progress.md", "content": f"# {line}\n\n(scripted runtime)\n"}}


def _looping(capability: str) -> dict[str, t.Any]:
    """An `ov loop` iteration: do the work once, keep the progress file, and end with the loop's promise
    (``$OVERSTORY_LOOP_PROMISE``) instead of a report: the loop reports when ov's check agrees. A scripted
    model cannot fix what the check finds, so a later iteration only says the promise again, and a check
    that keeps failing the same way parks the loop (``loop.same_failure_limit``)."""
    if capability == "coordinator":
        return {}
    work = [*_NOTES] if capability in WRITERS else [*_LOOK]
    first = {"actions": [*work, _progress("${OVERSTORY_TASK_ID}: first pass done; waiting for ov's check")],
             "result": "${OVERSTORY_TASK_ID}: done. ${OVERSTORY_LOOP_PROMISE}"}
    again = {"actions": [{"text": "Reading the last check's output in the message."},
                         _progress("${OVERSTORY_TASK_ID}: iteration ${OVERSTORY_LOOP_ITERATION} read the check's "
                                   "output; a scripted model cannot fix it")],
             "result": "Nothing more a scripted model can do. ${OVERSTORY_LOOP_PROMISE}"}
    return {"iterations": [first], "later_iterations": again}
