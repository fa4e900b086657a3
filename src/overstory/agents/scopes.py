"""Builders' write scopes (`ov sling --files`): checked at the sling, compared between builders.

The patterns (``guards.scope``) are stored in the agent's spec as ``write_scope`` for the
writing capabilities (builder, merger); the others get ``--files`` as text in their
instructions only. Each turn's guard reads them from ``OVERSTORY_WRITE_SCOPE``
(``agents.turns``), `ov merge` checks the branch's files against them (``merge.scope_check``),
and `ov sling` and `ov status` compare the scopes of a run's active writers: two that may
name one file overlap. Writers without a scope are not compared.
"""

from __future__ import annotations

import typing as t

from overstory.capabilities import WRITERS as WRITER_CAPABILITIES
from overstory.errors import UsageError
from overstory.guards import scope as patterns
from overstory.store.sessions import Session


def checked_files(values: t.Iterable[str]) -> list[str]:
    """``--files`` values as scope patterns, or one usage error naming what is wrong."""
    try:
        return patterns.parse(values)
    except ValueError as exc:
        raise UsageError(f"--files: {exc}") from None


def write_scope_of(capability: str, files: t.Sequence[str]) -> list[str]:
    """The write scope an agent of ``capability`` gets from ``files``: only writers have one."""
    return list(files) if capability in WRITER_CAPABILITIES else []


def spec_scope(spec: t.Mapping[str, t.Any]) -> list[str]:
    return [str(p) for p in spec.get("write_scope") or ()]


def scoped(agents: t.Iterable[Session]) -> list[tuple[str | None, str, list[str]]]:
    """(run, name, scope) of the active agents that have a write scope."""
    return [(a.run_id, a.name, spec_scope(a.spec)) for a in agents if not a.is_terminal and spec_scope(a.spec)]


def overlaps_with(agents: t.Iterable[Session], run_id: str | None, name: str,
                  scope: t.Sequence[str]) -> list[str]:
    """What a new writer ``name`` with ``scope`` in run ``run_id`` overlaps: one sentence per active writer."""
    if not scope:
        return []
    others = [m for m in scoped(agents) if m[1] != name]
    return [str(pair["message"]) for pair in patterns.overlapping_pairs([(run_id, name, list(scope)), *others])
            if name in t.cast(list, pair["agents"])]
