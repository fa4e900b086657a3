"""One `ov doctor` finding: a name, ok/warn/fail, what was seen, how to fix it, and its category."""

from __future__ import annotations

import typing as t
from dataclasses import asdict, dataclass

OK, WARN, FAIL = "ok", "warn", "fail"

# name -> what its checks look at (printed by `ov doctor --help`), in the order they run.
CATEGORIES: dict[str, str] = {
    "install": "Python, git and tmux",
    "project": "the project folder, its config, canonical branch and databases",
    "runtimes": "each agent CLI (installed, version, key or login), local model servers, agents parked for auth",
    "sandbox": "bubblewrap, and what running without it gives up",
    "executor": "where turns run: locally, or on the Ray cluster the config names",
    "processes": "live agents' hook channels, orphan agent processes, a second watchdog",
    "serve": "whether this project's `ov serve` is running and answering",
}


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hint: str = ""
    category: str = ""
    # More facts for `ov doctor --json` (merged into the check's object), e.g. a runtime's measured start-up.
    extra: t.Mapping[str, t.Any] | None = None

    def as_dict(self) -> dict[str, t.Any]:
        document = asdict(self)
        del document["extra"]
        return {**document, **(self.extra or {})}
