"""What an `ov loop` is asked to do: its objective, constraints, phases, gates and limits.

``--spec FILE`` is YAML::

    objective: Make the whole test suite pass without skipping tests.
    constraints: ["do not edit tests/", "keep the public API"]   # or one text
    until: LOOP_DONE            # the completion promise (default LOOP_DONE)
    check: python -m pytest -q  # run by ov after every iteration (sandboxed, over the branch)
    max_iterations: 12
    max_usd: 5
    critic: reviewer            # or {capability: reviewer, runtime: ..., model: ...}
    protected_paths: [tests/]   # added to config loop.protected_paths: pinned to the base for every check
    allow_protected: [tests/test_new.py]   # protected paths this loop may change (the operator's allowance)
    phases:
      - name: scaffold
        objective: Lay out the modules.
        gate: "files: src/*.py >= 3"      # or a shell command: "python -m pytest -q tests/unit"
        max_iterations: 3
        max_usd: 1
        tools: [Read, Write, Edit, Glob, Grep]   # enforced by the guard in this phase

A file that is not a YAML mapping is the objective itself. Without ``phases`` the loop
is one phase whose gate is ``check``. With phases, ``check`` (if any) must also pass
after the last phase. Command-line flags win over the file (``--allow-protected`` adds to
it). The result, the loop's definition, is plain JSON: it is kept in the agent's row and
never changes (the protected paths of the config are copied into it at the start).
"""

from __future__ import annotations

import re
import typing as t

from overstory.capabilities import CRITICS
from overstory.errors import LoopError
from overstory.store.loops import Loop

PROGRESS_FILE = ".overstory-progress.md"
DEFAULT_PROMISE = "LOOP_DONE"
MAX_CRITIC_RETRIES = 2
_FILES_GATE = re.compile(r"\Afiles:\s*(?P<glob>\S.*?)\s*>=\s*(?P<min>\d+)\s*\Z")
_PHASE_KEYS = {"name", "objective", "gate", "max_iterations", "max_usd", "tools"}
_SPEC_KEYS = {"objective", "constraints", "until", "check", "max_iterations", "max_usd", "critic", "phases",
              "protected_paths", "allow_protected"}


def parse_gate(value: t.Any, where: str) -> dict[str, t.Any] | None:
    """``"files: <glob> >= N"``, ``{files: glob, min: N}``, ``{command: ...}`` or a shell command."""
    if value is None or value == "":
        return None
    if isinstance(value, dict):
        if "files" in value:
            return _files_gate(str(value["files"]), value.get("min", 1), where)
        if "command" in value:
            return {"kind": "command", "command": _text(value["command"], f"{where}.command")}
        raise LoopError(f"{where}: a gate mapping needs `files` (with `min`) or `command`")
    text = _text(value, where)
    match = _FILES_GATE.match(text)
    if match:
        return _files_gate(match["glob"], match["min"], where)
    if text.startswith("files:"):
        raise LoopError(f"{where}: a file-count gate reads `files: <glob> >= N`, e.g. `files: src/*.py >= 3`")
    return {"kind": "command", "command": text}


def _files_gate(glob: str, minimum: t.Any, where: str) -> dict[str, t.Any]:
    if glob.startswith("/") or ".." in glob.split("/"):
        raise LoopError(f"{where}: the files gate's glob must stay inside the worktree (got {glob!r})")
    return {"kind": "files", "glob": glob, "min": _count(minimum, f"{where} minimum", low=0)}


def describe_gate(gate: dict[str, t.Any] | None) -> str:
    if gate is None:
        return "none (the promise alone ends it)"
    if gate["kind"] == "files":
        return f"at least {gate['min']} file(s) matching `{gate['glob']}`"
    return f"`{gate['command']}` exits 0"


def _text(value: t.Any, where: str) -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or not str(value).strip():
        raise LoopError(f"{where}: expected text")
    return str(value).strip()


def _count(value: t.Any, where: str, *, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit() \
            or int(value) < low:
        raise LoopError(f"{where}: expected a whole number >= {low}, got {value!r}")
    return int(value)


def _usd(value: t.Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise LoopError(f"{where}: expected a number of dollars > 0, got {value!r}")
    return float(value)


def repo_paths(value: t.Any, where: str) -> list[str]:
    """Paths (git glob pathspecs) relative to the repository root, e.g. ``tests/``, ``**/conftest.py``."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p.strip() for p in value):
        raise LoopError(f"{where}: expected a list of paths relative to the repository root, e.g. [tests/, conftest.py]")
    paths = []
    for raw in value:
        path = raw.strip()
        if path.startswith(("/", ":")) or ".." in path.split("/"):
            raise LoopError(f"{where}: {path!r} must be a path inside the repository (relative, no `..`)")
        if path not in paths:
            paths.append(path)
    return paths


def _critic(value: t.Any) -> dict[str, t.Any] | None:
    if value in (None, False, ""):
        return None
    if isinstance(value, str):
        value = {"capability": value}
    if not isinstance(value, dict) or set(value) - {"capability", "runtime", "model"}:
        raise LoopError("critic: expected a capability (e.g. `critic: reviewer`) or {capability, runtime, model}")
    capability = _text(value.get("capability", "reviewer"), "critic.capability")
    if capability not in CRITICS:
        raise LoopError(f"critic: a critic is read-only: reviewer or scout, not {capability!r}")
    return {"capability": capability, "runtime": value.get("runtime"), "model": value.get("model")}


def _phase(raw: t.Any, index: int, seen: set[str]) -> dict[str, t.Any]:
    where = f"phases[{index}]"
    if not isinstance(raw, dict):
        raise LoopError(f"{where}: expected a mapping with name, objective and gate")
    unknown = set(raw) - _PHASE_KEYS
    if unknown:
        raise LoopError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (expected {', '.join(sorted(_PHASE_KEYS))})")
    name = _text(raw.get("name"), f"{where}.name")
    if name in seen:
        raise LoopError(f"{where}: two phases are named {name!r}")
    seen.add(name)
    tools = raw.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(x, str) and x.strip() and "," not in x for x in tools):
            raise LoopError(f"{where}.tools: expected a list of tool names, e.g. [Read, Grep, Glob]")
        tools = [x.strip() for x in tools]
    return {"name": name, "objective": _text(raw.get("objective"), f"{where}.objective"),
            "gate": parse_gate(raw.get("gate"), f"{where}.gate"),
            "max_iterations": _count(raw["max_iterations"], f"{where}.max_iterations")
            if raw.get("max_iterations") is not None else None,
            "max_usd": _usd(raw["max_usd"], f"{where}.max_usd") if raw.get("max_usd") is not None else None,
            "tools": tools}


def read_spec(text: str, source: str) -> dict[str, t.Any]:
    """The spec file as a mapping: YAML, or a plain text that is the objective."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict):
        unknown = set(data) - _SPEC_KEYS
        if unknown:
            raise LoopError(f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                            f"(expected {', '.join(sorted(_SPEC_KEYS))})")
        return data
    if not text.strip():
        raise LoopError(f"{source} is empty")
    return {"objective": text.strip()}


def build_definition(spec: t.Mapping[str, t.Any] | None, *, prompt: str | None, until: str | None,
                     check: str | None, max_iterations: int | None, default_max_iterations: int,
                     protected: t.Sequence[str] = (), allow_protected: t.Sequence[str] = ()) -> dict[str, t.Any]:
    """The loop's definition from the spec (if any) and the command line (which wins).

    ``protected``: config ``loop.protected_paths``; ``allow_protected``: ``--allow-protected``."""
    spec = dict(spec or {})
    objective = spec.get("objective") or prompt
    if not objective:
        raise LoopError("a loop needs an objective: --prompt TEXT, or `objective:` in --spec")
    objective = _text(objective, "objective")
    constraints = spec.get("constraints") or []
    if isinstance(constraints, str):
        constraints = [constraints]
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise LoopError("constraints: expected a text or a list of texts")
    promise = _text(until or spec.get("until") or DEFAULT_PROMISE, "--until")
    loop_check = parse_gate(check if check is not None else spec.get("check"), "--check")
    limit = max_iterations if max_iterations is not None else spec.get("max_iterations")
    limit = _count(limit, "--max-iterations") if limit is not None else default_max_iterations
    raw_phases = spec.get("phases")
    if raw_phases is not None and (not isinstance(raw_phases, list) or not raw_phases):
        raise LoopError("phases: expected a non-empty list")
    seen: set[str] = set()
    if raw_phases:
        phases = [_phase(raw, index, seen) for index, raw in enumerate(raw_phases)]
        final_check = loop_check
    else:
        phases = [{"name": "main", "objective": objective, "gate": loop_check, "max_iterations": None,
                   "max_usd": None, "tools": None}]
        final_check = None
    return {"objective": objective, "constraints": [c.strip() for c in constraints if c.strip()],
            "until": promise, "final_check": final_check, "max_iterations": limit, "phased": bool(raw_phases),
            "critic": _critic(spec.get("critic")), "phases": phases,
            "max_usd": _usd(spec["max_usd"], "max_usd") if spec.get("max_usd") is not None else None,
            "protected_paths": repo_paths([*protected, *repo_paths(spec.get("protected_paths"), "protected_paths")],
                                          "protected_paths"),
            "allow_protected": repo_paths([*repo_paths(spec.get("allow_protected"), "allow_protected"),
                                           *allow_protected], "--allow-protected")}


# ---- limits --------------------------------------------------------------------------------


def limit_reached(loop: Loop, next_number: int, phase_iterations: int, phase_usd: float) -> str | None:
    """Why no new iteration may start (the park reason), or None."""
    if loop.max_iterations is not None and next_number > loop.max_iterations:
        return f"loop: max_iterations {loop.max_iterations} reached without completion"
    phase = loop.phase
    name = phase["name"]
    if phase.get("max_iterations") is not None:
        allowed = int(phase["max_iterations"]) + loop.extra_phase_iterations
        if phase_iterations >= allowed:
            return f"loop: phase {name!r} reached its max_iterations {allowed} without passing its gate"
    if phase.get("max_usd") is not None:
        allowed_usd = float(phase["max_usd"]) + loop.extra_phase_usd
        if phase_usd >= allowed_usd:
            return f"loop: phase {name!r} spent its max_usd {allowed_usd:.2f} ({phase_usd:.2f})"
    return None
