"""The ``scripted`` runtime: a built-in stand-in for the claude CLI that plays a scenario file.

The adapter is ``runtime.ScriptedRuntime``; the player, which runs as a new process for every
turn (``python -m overstory.runtimes.scripted``), is ``player``. This package imports neither
eagerly: the player must not pay for the adapter's imports (the claude adapter behind it),
about 80 ms of every scripted turn.
"""

from __future__ import annotations

import typing as t


def __getattr__(name: str) -> t.Any:
    if name == "ScriptedRuntime":
        from overstory.runtimes.scripted.runtime import ScriptedRuntime

        return ScriptedRuntime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
