"""The agent hierarchy: who slung whom, as a tree under the operator (`ov tree`).

Stdlib only. An agent whose parent row is gone (its name was reused, or the row
was discarded) hangs under the operator, marked as an orphan, so that no agent is
ever left out of the picture.
"""

from __future__ import annotations

import sqlite3
import typing as t
from dataclasses import dataclass, field

from overstory.store import sessions
from overstory.store.sessions import Session

OPERATOR = "operator"


@dataclass
class TreeNode:
    agent: Session
    orphan_of: str | None = None  # the missing parent's name, for an orphan
    children: list[TreeNode] = field(default_factory=list)

    def as_dict(self) -> dict[str, t.Any]:
        a = self.agent
        return {
            "name": a.name, "capability": a.capability, "task_id": a.task_id, "state": a.state,
            "state_reason": a.state_reason, "parent": a.parent, "depth": a.depth, "run_id": a.run_id,
            "branch": a.branch, "turns": a.turns, "cost_usd": round(a.cost_usd, 6),
            "orphan_of": self.orphan_of, "children": [c.as_dict() for c in self.children],
        }


def build_tree(agents: t.Sequence[Session]) -> list[TreeNode]:
    """The roots (children of the operator, then orphans), each with its subtree, oldest first."""
    nodes = {a.name: TreeNode(a) for a in agents}
    roots: list[TreeNode] = []
    for agent in sorted(agents, key=lambda a: (a.created_at, a.name)):
        node = nodes[agent.name]
        parent = nodes.get(agent.parent) if agent.parent != agent.name else None
        if agent.parent == OPERATOR or parent is None or _would_cycle(nodes, agent.name):
            if agent.parent != OPERATOR:
                node.orphan_of = agent.parent
            roots.append(node)
        else:
            parent.children.append(node)
    return roots


def _would_cycle(nodes: dict[str, TreeNode], name: str) -> bool:
    """True if following parents from ``name`` comes back to it (corrupt rows must not hang `ov tree`)."""
    seen = {name}
    current = nodes[name].agent.parent
    while current in nodes:
        if current in seen:
            return True
        seen.add(current)
        current = nodes[current].agent.parent
    return False


def prune(roots: list[TreeNode], keep: t.Callable[[Session], bool]) -> list[TreeNode]:
    """Only the nodes ``keep`` accepts, plus the ancestors needed to reach them."""
    kept = []
    for node in roots:
        node.children = prune(node.children, keep)
        if keep(node.agent) or node.children:
            kept.append(node)
    return kept


def below(roots: list[TreeNode], name: str) -> list[TreeNode]:
    """The children of agent ``name`` in the tree (each with its subtree); [] when it is not there."""
    for node in roots:
        if node.agent.name == name:
            return node.children
    return next((found for node in roots if (found := below(node.children, name))), [])


def tree_document(roots: list[TreeNode], top: str = OPERATOR) -> dict[str, t.Any]:
    """The tree as JSON under ``top`` (the operator, or the agent `ov tree --parent` names)."""
    return {"name": top, "children": [r.as_dict() for r in roots]}


def describe(agent: Session) -> str:
    parts = [agent.capability, agent.state]
    if agent.state == "zombie" and agent.state_reason:
        parts[-1] += f" ({agent.state_reason[:60]})"
    parts.append(f"{agent.turns} turn{'s' if agent.turns != 1 else ''}")
    if agent.cost_usd:
        parts.append(f"${agent.cost_usd:.4f}")
    return " · ".join(parts)


def render_lines(roots: list[TreeNode], top: str = OPERATOR) -> list[str]:
    """Plain text with box-drawing branches, ``top`` (the operator) on top."""
    lines = [top]

    def walk(nodes: list[TreeNode], prefix: str) -> None:
        for index, node in enumerate(nodes):
            last = index == len(nodes) - 1
            label = f"{node.agent.name}  {describe(node.agent)}"
            if node.orphan_of:
                label += f"  [parent {node.orphan_of} is gone]"
            lines.append(f"{prefix}{'└── ' if last else '├── '}{label}")
            walk(node.children, prefix + ("    " if last else "│   "))

    walk(roots, "")
    return lines


def ancestors(conn: sqlite3.Connection, name: str) -> list[str]:
    """``name``'s parent, grandparent, … up to (not including) the operator."""
    chain: list[str] = []
    current = name
    while True:
        parent = sessions.parent_of(conn, current)
        if parent is None or parent == OPERATOR or parent in chain or parent == name:
            return chain
        chain.append(parent)
        current = parent


def is_descendant(conn: sqlite3.Connection, name: str, ancestor: str) -> bool:
    return ancestor in ancestors(conn, name)
