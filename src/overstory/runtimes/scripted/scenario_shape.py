"""What a scripted scenario must look like, checked when it is slung rather than at its first turn.

`ov sling --scenario FILE` reads the file (JSON, or YAML when its name ends in .yaml/.yml),
and an agent's `ov sling` sends the same text and name through its endpoint: both are
parsed and checked here before anything is created, so a malformed scenario is a usage
error at sling time, not an agent whose every turn fails. The player parses with the
same function. Standard library only (yaml is imported for YAML text alone).
"""

from __future__ import annotations

import json
import typing as t

ACTIONS = ("text", "write", "edit", "read", "bash", "tool", "sleep", "crash", "api_error", "expect_in_prompt",
           "usage")


def is_yaml_name(name: str | None) -> bool:
    return bool(name) and str(name).lower().endswith((".yaml", ".yml"))


def parse(text: str, *, yaml: bool) -> t.Any:
    """The document in ``text``; ValueError saying why it is not valid YAML (or JSON)."""
    if yaml:
        import yaml as pyyaml  # only when asked for: yaml costs import time

        try:
            return pyyaml.safe_load(text) or {}
        except pyyaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
            raise ValueError(f"not valid YAML: {getattr(exc, 'problem', None) or exc}{at}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None


def problem(data: t.Any) -> str | None:
    """Why ``data`` is not a playable scenario, or None."""
    if not isinstance(data, dict):
        return f"a scenario must be a mapping (turns, iterations, agents), not {_kind(data)}"
    agents = data.get("agents")
    if agents is not None and not isinstance(agents, dict):
        return f"agents must map agent-name patterns to sections, not {_kind(agents)}"
    sections = [("", data), *((f"agents[{pattern!r}].", section) for pattern, section in (agents or {}).items())]
    for where, section in sections:
        if not isinstance(section, dict):
            return f"{where.rstrip('.')} must be a mapping (turns, iterations), not {_kind(section)}"
        for key in ("turns", "iterations"):
            found = _turns_problem(f"{where}{key}", section.get(key))
            if found:
                return found
        later = section.get("later_iterations")
        if later is not None:
            found = _turns_problem(f"{where}later_iterations", [later])
            if found:
                return found.replace("later_iterations[0]", "later_iterations")
    return None


def _turns_problem(where: str, turns: t.Any) -> str | None:
    if turns is None:
        return None
    if not isinstance(turns, list):
        return f"{where} must be a list of turns, not {_kind(turns)}"
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict):
            return f"{where}[{number}] must be a mapping (actions, result), not {_kind(turn)}"
        actions = turn.get("actions")
        if actions is not None and not isinstance(actions, list):
            return f"{where}[{number}].actions must be a list, not {_kind(actions)}"
        for index, action in enumerate(actions or ()):
            if not isinstance(action, dict):
                return f"{where}[{number}].actions[{index}] must be a mapping, not {_kind(action)}"
            if not any(kind in action for kind in ACTIONS):
                return (f"{where}[{number}].actions[{index}]: unknown action {sorted(map(str, action))} "
                        f"(known: {', '.join(ACTIONS)})")
    return None


def _kind(value: t.Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__}"
