"""Built-in scenarios for the scripted runtime: what a fake model does, per capability.

Placeholders like ${OVERSTORY_TASK_ID} are expanded by the scripted runtime from the
turn's environment, so one scenario serves any agent.
"""

from __future__ import annotations

import typing as t

REPORT = 'ov mail send --type worker_done --subject "done: ${OVERSTORY_TASK_ID}" --body '


def default_scenario(capability: str, task_id: str) -> dict[str, t.Any]:
    if capability in ("builder", "merger"):
        actions: list[dict[str, t.Any]] = [
            {"text": "Reading the task and the instructions in .claude/CLAUDE.md."},
            {"bash": "git status --short"},
            {"write": {"path": "work/${OVERSTORY_TASK_ID}.md",
                       "content": "# ${OVERSTORY_TASK_ID}\n\nDone by ${OVERSTORY_AGENT_NAME} (scripted runtime).\n"}},
            {"bash": 'git add work/${OVERSTORY_TASK_ID}.md && git commit -q -m "${OVERSTORY_TASK_ID}: add notes"'},
        ]
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
            {"text": "Looking around the repository."},
            {"bash": "git log --oneline -n 5"},
            {"bash": "ls"},
            {"bash": REPORT + '"findings: the repository layout is listed above; nothing blocks the task"'},
        ],
        "result": f"{task_id}: findings reported",
    }]}
