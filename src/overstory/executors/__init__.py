"""The registry of turn executors: the one place that knows every executor's name.

``get_executor(kind, ...)`` imports the executor only when asked: the Ray executor imports
``ray`` only when it connects, so ov without the ``ray`` extra loads, lists and validates
``executor: {kind: ray}`` and fails only when a turn would need the cluster, in one line.

A Kubernetes Jobs executor would be one more entry here (see docs/scaling-out.md).
"""

from __future__ import annotations

TYPE_CHECKING = False  # every turn's shim (``executors.shim``) imports this package: no typing, no errors module
if TYPE_CHECKING:
    import typing as t

    from overstory.executors.base import TurnExecutor

# kind -> (module, class). Add an executor here and nowhere else.
REGISTRY: dict[str, tuple[str, str]] = {
    "local": ("overstory.executors.local", "LocalExecutor"),
    "ray": ("overstory.executors.ray_executor", "RayExecutor"),
}
EXECUTOR_KINDS: tuple[str, ...] = tuple(REGISTRY)
# kind -> the package it needs beyond ov's own (an optional extra), and how to get it
EXTRAS: dict[str, tuple[str, str]] = {"ray": ("ray", "install the ray extra: pip install 'overstory[ray]'")}


def check_available(kind: str) -> None:
    """ExecutorUnavailable (one line) when ``kind`` needs a package that is not installed; imports nothing."""
    import importlib.util

    from overstory.errors import ExecutorUnavailable

    extra = EXTRAS.get(kind)
    if extra is not None and importlib.util.find_spec(extra[0]) is None:
        raise ExecutorUnavailable(kind, f"the {extra[0]} package is not installed", extra[1])


def get_executor(kind: str, **settings: t.Any) -> TurnExecutor:
    """A new executor of ``kind`` built from ``settings`` (its config section's keys); UsageError if unknown."""
    import importlib

    from overstory.errors import UsageError

    spec = REGISTRY.get(kind)
    if spec is None:
        raise UsageError(f"unknown executor {kind!r}; choose one of: {', '.join(EXECUTOR_KINDS)}")
    module = importlib.import_module(spec[0])
    executor: TurnExecutor = getattr(module, spec[1])(**settings)
    return executor


def from_config(config: t.Any, state_dir: str) -> TurnExecutor:
    """The executor ``config.executor`` names. ``state_dir``: where the local executor keeps its turns."""
    section = config.executor
    if section.kind == "local":
        return get_executor("local", state_dir=state_dir)
    ray = section.ray
    return get_executor(section.kind, address=ray.address, turn_resources=dict(ray.turn_resources),
                        namespace=ray.namespace)
