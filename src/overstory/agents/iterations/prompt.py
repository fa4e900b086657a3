"""The first message of every iteration of an `ov loop`.

Each iteration is a fresh session that remembers nothing, so its message carries all
the loop knows: the immutable objective and constraints, the iteration number and
limit, the current phase (objective, gate) with a summary of the phases already done,
the agent's own progress file, the tail of the last check's output, a critic's notes
when a phase runs again, and mail that arrived since the last iteration.
"""

from __future__ import annotations

import typing as t

from overstory.agents.iterations.spec import PROGRESS_FILE, describe_gate
from overstory.store.loops import Loop


def iteration_message(loop: Loop, *, number: int, attempt: int, progress: str | None,
                      finished: t.Sequence[dict[str, t.Any]], mail_text: str = "") -> str:
    definition = loop.definition
    promise = definition["until"]
    limit = f" of at most {loop.max_iterations}" if loop.max_iterations is not None else ""
    retry = f" (attempt {attempt}: the previous attempt of this iteration was interrupted)" if attempt > 1 else ""
    parts = [
        f"[ov loop {loop.name}] Iteration {number}{limit}{retry}.",
        "This is a fresh session: you remember nothing of earlier iterations. The progress file and the check "
        "output below are what they left you. Build on their work; do not start over.",
        "## Objective (fixed for the whole loop)\n" + definition["objective"],
    ]
    if definition.get("constraints"):
        parts.append("## Constraints\n" + "\n".join(f"- {c}" for c in definition["constraints"]))
    if definition.get("phased"):
        phase = loop.phase
        phases = loop.phases
        again = f" (run {loop.phase_round + 1}: a critic asked for it again)" if loop.phase_round else ""
        block = [f"## Phase {loop.phase_index + 1} of {len(phases)}: {phase['name']}{again}",
                 f"Objective of this phase: {phase['objective']}",
                 f"Gate (ov checks it after this iteration): {describe_gate(phase.get('gate'))}"]
        if phase.get("tools") is not None:
            block.append(f"Tools allowed in this phase: {', '.join(phase['tools']) or 'none'}")
        if finished:
            block.append("Finished phases (build on this; do not start over):")
            block += [f"- {p['phase']}: {p.get('progress') or 'done'} (checkpoint {p['commit_sha'][:12]})"
                      for p in finished]
        parts.append("\n".join(block))
    if loop.critic_notes:
        parts.append("## The critic's notes on the last run of this phase\n" + loop.critic_notes)
    parts.append(f"## Progress file ({PROGRESS_FILE})\n"
                 + (progress.rstrip() if progress else "(none yet: create it)"))
    if loop.last_check_tail is not None:
        parts.append(f"## Last check (exit {loop.last_check_exit})\n```\n{loop.last_check_tail.rstrip()}\n```")
    else:
        parts.append("## Last check\n(none yet)")
    if mail_text:
        parts.append("## Mail since the last iteration\n" + mail_text)
    final = definition.get("final_check")
    checked = describe_gate(loop.phase.get("gate"))
    if final and loop.phase_index == len(loop.phases) - 1:
        checked += f", and then {describe_gate(final)}"
    parts.append(
        "## How this ends\n"
        f"- Keep {PROGRESS_FILE} in your worktree up to date: its first line is a one-line summary of where the "
        "work stands, then what is done, what is next and what you learned. ov keeps it out of commits.\n"
        "- Commit your work as you go. ov commits what you leave uncommitted, then checks your branch as it "
        "will be merged (a fresh checkout: files git ignores are not there).\n"
        f"- After this iteration ov itself checks: {checked}.\n"
        + _protected_line(definition) +
        f"- Only when the objective{' of this phase' if definition.get('phased') else ''} is met, end your last "
        f"message with {promise}. Saying {promise} while the check fails only starts another iteration with "
        "its output.\n"
        "- Do not send worker_done: ov reports to your parent when the loop is complete.")
    return "\n\n".join(parts)


def _protected_line(definition: t.Mapping[str, t.Any]) -> str:
    paths = definition.get("protected_paths") or []
    if not paths:
        return ""
    allowed = definition.get("allow_protected") or []
    return (f"- Protected paths: {', '.join(paths)}. ov checks with them as they are on the base branch, and a "
            "change to one fails the check" + (f" (except {', '.join(allowed)})" if allowed else "") + ".\n")


def critic_message(loop: Loop, *, loop_agent: str, phase: dict[str, t.Any], diff: str, diff_range: str,
                   progress: str | None) -> str:
    return "\n\n".join([
        f"You are the critic of phase {phase['name']!r} of the loop {loop_agent}. Review the phase's work; "
        "do not change anything.",
        "## Loop objective\n" + loop.definition["objective"],
        f"## Phase objective\n{phase['objective']}\nIts gate passed: {describe_gate(phase.get('gate'))}.",
        f"## The loop's progress file\n{(progress or '(none)').rstrip()}",
        f"## The phase's diff ({diff_range})\n```diff\n{diff.rstrip() or '(no changes)'}\n```",
        "## Your verdict\nSend exactly one `result` mail to the loop with your verdict in its payload: `pass` (the "
        "phase is done well: go on), `retry` (run the phase again; say what to fix in `notes`) or `escalate` (a "
        "person must look at it):\n"
        f"ov mail send --to {loop_agent} --type result --subject 'verdict: pass' "
        "--payload '{\"verdict\": \"pass\", \"notes\": \"...\"}'\n"
        "Then report worker_done to your parent as usual.",
    ])
