"""The one way to load the configuration: ``load``. Its callers never know which path served them.

Validating the configuration (``config.load_config``: yaml, and pydantic models for every
section) costs a click command 0.2-0.35 s of CPU, so ``load`` keeps what the last validation
produced in ``.overstory/config.snapshot.json`` (``config_snapshot``), next to ``config.yaml``,
keyed by what it was made from: the exact bytes of ``config.yaml`` and ``config.local.yaml``
(or their absence), every ``OV_*`` variable, and the size and modification time of the files
that define the schema. When the key matches, the snapshot is the configuration; otherwise
``load`` validates (a broken file raises ``ConfigError`` as before, and nothing is kept) and
writes a new snapshot. Either way the caller gets the same read-only object
(``config_snapshot.Snapshot``). A snapshot that cannot be read or written only makes the load
slower. Standard library only until a validation is needed.
"""

from __future__ import annotations

import json
import os

from overstory.config import snapshot as config_snapshot

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t

    from overstory.config.model import Config

CACHE_NAME = "config.snapshot.json"
# What decides what a valid file means (defaults, validators, the names they accept), relative to
# the overstory package: an upgraded or edited ov validates again.
SCHEMA_FILES = ("config/model.py", "config/approvals.py", "config/defaults.py", "config/snapshot.py", "config/load.py",
                "runtimes/__init__.py", "store/sessions.py", "guards/patterns.py", "__init__.py")


def load(config_file: str | os.PathLike[str], local_file: str | os.PathLike[str] | None = None,
         environ: t.Mapping[str, str] | None = None) -> Config:
    """The effective configuration (defaults < config.yaml < config.local.yaml < OV_* in ``environ``),
    validated: from the project's snapshot when nothing it was made from changed, else validated now
    (``ConfigError`` if invalid) and kept for the next command."""
    document = _validated(config_file, local_file, environ)
    config: Config = config_snapshot.wrap(document["config"], document["shape"], config_snapshot.Snapshot)
    return config


def write_agent_snapshot(config_file: str | os.PathLike[str], local_file: str | os.PathLike[str] | None,
                         environ: t.Mapping[str, str], run_dir: str | os.PathLike[str]) -> Config:
    """Load the configuration as an agent's loop would (its launch environment) and hand it over as
    ``run_dir/config.json``, so the loop needs neither pydantic nor this project's snapshot to stay
    the same. ConfigError if it is invalid."""
    document = _validated(config_file, local_file, environ)
    config_snapshot.write_json({"format": config_snapshot.FORMAT, "shape": document["shape"], "config": document["config"]}, config_snapshot.snapshot_path(run_dir))
    config: Config = config_snapshot.wrap(document["config"], document["shape"], config_snapshot.Snapshot)
    return config


def cache_path(config_file: str | os.PathLike[str]) -> str:
    return os.path.join(os.path.dirname(os.fspath(config_file)), CACHE_NAME)


def _validated(config_file: str | os.PathLike[str], local_file: str | os.PathLike[str] | None,
               environ: t.Mapping[str, str] | None) -> dict[str, t.Any]:
    """{"format", "key", "shape", "config"}: the snapshot when its key matches, else a new one."""
    environ = os.environ if environ is None else environ
    key = _key(config_file, local_file, environ)
    cache = cache_path(config_file)
    try:
        with open(cache, encoding="utf-8") as handle:
            document = json.load(handle)
        if isinstance(document, dict) and document.get("format") == config_snapshot.FORMAT and document.get("key") == key:
            return document
    except (OSError, ValueError):
        pass
    from pathlib import Path

    from overstory.config.model import load_config as validate
    from overstory.config.model import snapshot_shape

    validated = validate(Path(config_file), None if local_file is None else Path(local_file), environ=environ)
    document = {"format": config_snapshot.FORMAT, "key": key, "shape": snapshot_shape(), "config": validated.model_dump(mode="json")}
    try:
        config_snapshot.write_json(document, cache)
    except OSError:
        pass  # a read-only or missing folder (a demo's, a sandbox's): the next load validates again
    return document


def _key(config_file: str | os.PathLike[str], local_file: str | os.PathLike[str] | None,
         environ: t.Mapping[str, str]) -> list[t.Any]:
    """What a validated configuration was made from. The files' bytes, not their times: a file edited
    twice within one clock tick, or put back as it was, is still told apart (latin-1: bytes <-> text)."""
    files: list[t.Any] = []
    for path in (config_file, local_file):
        if path is None:
            files.append(None)
            continue
        try:
            with open(path, "rb") as handle:
                files.append([os.fspath(path), handle.read().decode("latin-1")])
        except FileNotFoundError:
            files.append([os.fspath(path), None])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # overstory/, above config/
    schema: list[t.Any] = []
    for name in SCHEMA_FILES:
        try:
            stat = os.stat(os.path.join(here, name))
            schema.append([name, stat.st_mtime_ns, stat.st_size])
        except OSError:
            schema.append([name, None, None])
    variables = sorted([name, value] for name, value in environ.items() if name.startswith("OV_"))
    return [files, variables, schema]
