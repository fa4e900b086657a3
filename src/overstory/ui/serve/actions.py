"""Core functions that later versions of ov add, looked up when a route needs them.

Approval gates, budgets, `ov costs` and `ov resume` are being built elsewhere. Their
routes and page panels already exist; each calls the core function named here and,
while that function does not exist, answers 501 "not available in this version".
Wiring one in is one line in ``SEAMS`` (module, attribute) with the signature below.

A module that exists but fails to import is a bug and surfaces as one (500), not as 501.
"""

from __future__ import annotations

import importlib
import importlib.util
import typing as t

from overstory.errors import OrchestratorError


class NotAvailable(OrchestratorError):
    """The feature behind a route is not part of this version of ov (HTTP 501)."""


# key -> (module, attribute, what a person would call the feature)
SEAMS: dict[str, tuple[str, str, str]] = {
    # (project, conn, *, include_decided: bool) -> list[dict]
    "approvals.list": ("overstory.approvals", "list_approvals", "approval gates"),
    # (project, conn, approval_id: str, *, decider: str, note: str | None) -> dict
    "approvals.approve": ("overstory.approvals", "approve", "approval gates"),
    # (project, conn, approval_id: str, *, decider: str, reason: str) -> dict
    "approvals.reject": ("overstory.approvals", "reject", "approval gates"),
    # (project, conn, *, by: str | None, since: str | None) -> dict
    "costs": ("overstory.costs", "costs_report", "`ov costs`"),
    # (project, config, conn, name, *, add_usd: float | None, add_turns: int | None, add_time: str | None) -> dict
    "resume": ("overstory.agents.budgeting", "resume_from_request", "`ov resume`"),
    # (conn, name) -> dict | None: the agent's limits, spent and left
    "budget": ("overstory.store.budgets", "agent_budget", "budgets"),
}


def lookup(key: str) -> t.Callable[..., t.Any] | None:
    """The core function behind ``key``, or None when this version of ov has none."""
    module_name, attribute, _ = SEAMS[key]
    try:
        if importlib.util.find_spec(module_name) is None:
            return None
    except ModuleNotFoundError:  # a parent package is missing
        return None
    found = getattr(importlib.import_module(module_name), attribute, None)
    return found if callable(found) else None


def require(key: str) -> t.Callable[..., t.Any]:
    found = lookup(key)
    if found is None:
        raise NotAvailable(f"{SEAMS[key][2]}: not available in this version of ov")
    return found
