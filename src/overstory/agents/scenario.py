"""The scenario a playing runtime (scripted) is slung with: read, checked and named at sling time.

The operator's `ov sling --scenario FILE` and an agent's (which sends the file's text and
name through its endpoint) end the same way: JSON, or YAML when the name ends in
.yaml/.yml (text without a name is JSON if it parses as JSON, else YAML); the runtime
checks it before anything is created, so a malformed scenario is a usage error of the
sling, never an agent whose every turn fails. It is saved under the name the player reads
by: ``scenario.yaml`` or ``scenario.json``.
"""

from __future__ import annotations

import json
import typing as t
from pathlib import Path

from overstory.errors import UsageError

if t.TYPE_CHECKING:
    from overstory.runtimes.base import Runtime


def checked_scenario(runtime: Runtime, text: str | None, name: str | Path | None, *, capability: str,
                     task_id: str) -> tuple[str | None, str]:
    """(the scenario's text or None, the file name to save it under in the run dir)."""
    if text is None:
        built_in = runtime.default_scenario(capability, task_id)
        return (json.dumps(built_in, indent=2) if built_in is not None else None), "scenario.json"
    yaml = _is_yaml(text, name)
    try:
        runtime.check_scenario(text, yaml=yaml)
    except ValueError as exc:
        label = f"--scenario {name}" if name else "the scenario"
        raise UsageError(f"{label}: {exc}") from None
    return text, "scenario.yaml" if yaml else "scenario.json"


def _is_yaml(text: str, name: str | Path | None) -> bool:
    from overstory.runtimes.scripted.scenario_shape import is_yaml_name

    if name:
        return is_yaml_name(str(name))
    try:
        json.loads(text)
    except ValueError:
        return True
    return False
