"""A validated configuration as plain JSON, read back with the standard library alone.

``config_load.load`` keeps the project's validated configuration as such a snapshot
(``.overstory/config.snapshot.json``), and `ov sling` writes the one an agent runs with to
``.overstory/run/<agent>/config.json``; the agent's loop reads it back here. An idle loop
is then a small process: pydantic and yaml were 11 MiB of its 30 MiB, and 50 agents means
50 loops.

The file holds the configuration's values (``model_dump(mode="json")``) and its shape:
which keys are sections (attribute access, as on the pydantic models) and which are
mappings by name (``providers``, ``models``: key access). So new sections need no change
here.
"""

from __future__ import annotations

import os

from overstory import jsontext

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

    from overstory.config.model import Config

SNAPSHOT_NAME = "config.json"
FORMAT = 1

# Cheaper than the Claude CLI's own default (its most capable, most expensive model) for the
# capabilities that do the bulk of the turns; every other capability keeps the CLI's default.
# Here rather than in ``config`` so that a turn can ask without importing pydantic.
DEFAULT_MODELS = {"builder": "sonnet", "scout": "haiku"}


def runtime_for(config: t.Any, capability: str) -> str:
    """The runtime of a new agent: ``runtimes[capability]``, else ``runtime.default``."""
    runtime: str = config.runtimes.get(capability) or config.runtime.default
    return runtime


def network_for(sandbox: t.Any, capability: str) -> bool:
    """``sandbox.network`` for an agent of ``capability``: whether it shares the host's network."""
    network = sandbox.network
    if isinstance(network, bool):
        return network
    return bool(network.get(capability, network.get("default", True)))


class Section:
    """One section of a snapshot: read-only attribute access to its validated values."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, t.Any]) -> None:
        object.__setattr__(self, "_values", values)

    def __getattr__(self, name: str) -> t.Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the configuration has no {name!r} here") from None

    def __setattr__(self, name: str, value: t.Any) -> None:
        raise AttributeError("a configuration snapshot is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Section) and self.model_dump() == other.model_dump()

    def __repr__(self) -> str:
        return f"Section({self.model_dump()!r})"

    def model_dump(self) -> dict[str, t.Any]:
        """The plain values, as the pydantic model's ``model_dump`` gives them."""
        return {key: _plain(value) for key, value in self._values.items()}


class Snapshot(Section):
    """The whole configuration: its sections, and the methods of ``config.Config`` (the same functions)."""

    __slots__ = ()

    def runtime_for(self, capability: str) -> str:
        return runtime_for(self, capability)


def _plain(value: t.Any) -> t.Any:
    if isinstance(value, Section):
        return value.model_dump()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def wrap(value: t.Any, shape: t.Any, kind: type[Section] = Section) -> t.Any:
    """Values -> Sections where ``shape`` says a model is: {field: shape} for a model, {"*": shape} for a
    mapping of models, None for a plain value."""
    if shape is None or not isinstance(value, dict):
        return value
    if set(shape) == {"*"}:
        return {key: wrap(item, shape["*"]) for key, item in value.items()}
    return kind({key: wrap(item, shape.get(key)) for key, item in value.items()})


def snapshot_path(run_dir: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(run_dir), SNAPSHOT_NAME)


def read(path: str | os.PathLike[str]) -> Config:
    """The configuration a snapshot holds, shaped like ``config.Config`` (OSError/ValueError if unusable)."""
    with open(path, encoding="utf-8") as handle:
        document = jsontext.loads(handle.read())
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{path}: not a configuration snapshot this ov understands")
    config: Config = wrap(document["config"], document["shape"], Snapshot)
    return config


def write_json(document: dict[str, t.Any], path: str | os.PathLike[str]) -> None:
    """Write atomically (a reader sees the old file or the new one, never half of one)."""
    target = os.fspath(path)
    temporary = f"{target}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(jsontext.dumps(document, indent=1))  # in the models' order, as validating gives it
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
