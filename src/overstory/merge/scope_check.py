"""A branch that changes files outside its builder's write scope (`ov sling --files`) is not merged.

However the change got there (a script the guard could not see, a commit made by hand in the
worktree, a cherry-pick), `ov merge` compares the files the branch changed since its merge
base with the target (renames count as both paths) against the agent's scope and refuses
the merge, naming them, unless the operator passes ``--allow-out-of-scope``. A dry run says
the same. Agents without a scope (no ``--files``, or not a writer) are not checked.
"""

from __future__ import annotations

import typing as t

from overstory.gitutil import git
from overstory.guards import scope as patterns

if t.TYPE_CHECKING:
    from pathlib import Path

    from overstory.store.sessions import Session

LISTED = 20


def spec_scope(spec: t.Mapping[str, t.Any]) -> list[str]:
    """The agent's write scope as `ov sling` stored it (``agents.scopes``)."""
    return [str(p) for p in spec.get("write_scope") or ()]


def outside_scope(root: Path, agent: Session | None, source: str, target: str) -> list[str]:
    """The files ``source`` changed since its merge base with ``target`` that are not in the agent's scope."""
    scope = spec_scope(agent.spec) if agent is not None else []
    if not scope:
        return []
    base = git(root, "merge-base", source, f"refs/heads/{target}", check=False).stdout.strip()
    if not base:
        return []
    out = git(root, "diff", "--name-only", "--no-renames", "-z", base, source).stdout
    return patterns.outside(scope, [p for p in out.split("\0") if p])


def refusal(agent: Session, strays: t.Sequence[str]) -> str:
    """The reason the merge is refused: which files, and the scope they are outside."""
    shown = ", ".join(strays[:LISTED]) + (f" and {len(strays) - LISTED} more" if len(strays) > LISTED else "")
    return (f"out of scope: the branch changes {shown}, outside {agent.name}'s write scope "
            f"({patterns.describe(spec_scope(agent.spec))}, from `ov sling --files`)")


def next_step(label: str) -> str:
    return (f"look at the change (`ov diff {label}`); to merge it anyway: `ov merge {label} --allow-out-of-scope`; "
            f"or have the file's owner make that change")
