"""The registry of runtimes: the one place that knows every runtime's name.

``get_runtime(name)`` imports the adapter only when asked, so listing the names
(for config validation and ``--help``) costs nothing.
"""

from __future__ import annotations

import importlib
import typing as t

from overstory.errors import UsageError

if t.TYPE_CHECKING:
    from overstory.runtimes.base import Runtime

# name -> (module, class). Add a runtime here and nowhere else.
REGISTRY: dict[str, tuple[str, str]] = {
    "claude": ("overstory.runtimes.claude", "ClaudeRuntime"),
    "scripted": ("overstory.runtimes.scripted.runtime", "ScriptedRuntime"),
    "codex": ("overstory.runtimes.codex", "CodexRuntime"),
    "gemini": ("overstory.runtimes.gemini", "GeminiRuntime"),
    "opencode": ("overstory.runtimes.opencode", "OpenCodeRuntime"),
    "kilo": ("overstory.runtimes.kilo", "KiloRuntime"),
    "qwen": ("overstory.runtimes.qwen", "QwenRuntime"),
}
RUNTIME_NAMES: tuple[str, ...] = tuple(REGISTRY)

_instances: dict[str, Runtime] = {}


def get_runtime(name: str) -> Runtime:
    """The adapter for ``name``; a UsageError naming the known runtimes otherwise."""
    found = _instances.get(name)
    if found is not None:
        return found
    spec = REGISTRY.get(name)
    if spec is None:
        raise UsageError(f"unknown runtime {name!r}; choose one of: {', '.join(RUNTIME_NAMES)}")
    module = importlib.import_module(spec[0])
    runtime: Runtime = getattr(module, spec[1])()
    _instances[name] = runtime
    return runtime
