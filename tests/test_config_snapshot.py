"""The configuration snapshot: `ov sling` validates once, the agent's loop reads plain JSON.

An idle loop is one process per agent; without pydantic and yaml it is about a third of
the size (bench figure 6). These tests check the snapshot says exactly what the
validated configuration says, that a real loop runs without pydantic or yaml loaded,
and what happens when the snapshot is missing or the configuration changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t
from pathlib import Path

import pytest

from agent_helpers import agent_env, wait_for
from overstory.agents.loop import load_loop_config
from overstory.config import snapshot as config_snapshot
from overstory.config.load import write_agent_snapshot
from overstory.config.model import Config, load_config
from overstory.paths import ProjectPaths

CUSTOM = """\
turns:
  max_retries: 5
  stall_timeout: 90.5
merge:
  gates: ["python -m pytest -q", "ruff check"]
providers:
  local:
    base_url: http://127.0.0.1:9/v1
    api_key_env: LOCAL_KEY
models:
  builder: local/some-model
  lead: opus
"""


def _leaves(config: t.Any, model: t.Any = Config, prefix: str = "") -> dict[str, t.Any]:
    """Every value reachable from ``config`` as the loop reaches it (attributes, then keys of mappings)."""
    from pydantic import BaseModel

    found: dict[str, t.Any] = {}
    for name, field in model.model_fields.items():
        value = getattr(config, name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.update(_leaves(value, annotation, f"{prefix}{name}."))
        elif t.get_origin(annotation) is dict:
            inner = t.get_args(annotation)[1]
            assert isinstance(value, dict)
            for key, item in value.items():
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    found.update(_leaves(item, inner, f"{prefix}{name}[{key}]."))
                else:
                    found[f"{prefix}{name}[{key}]"] = item
        else:
            found[prefix + name] = value
    return found


@pytest.mark.parametrize("text", ["", CUSTOM], ids=["defaults", "custom"])
def test_the_snapshot_reads_as_the_validated_config(tmp_path: Path, text: str) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(text)
    environ = {"OV_TURNS_KILL_GRACE": "1.5", "OV_RUNTIME_MODEL": "sonnet"}  # the launch environment counts
    validated = load_config(config_file, None, environ=environ)
    written = write_agent_snapshot(config_file, None, environ, tmp_path)
    assert written.model_dump() == validated.model_dump(mode="json")
    snapshot = config_snapshot.read(tmp_path / "config.json")
    assert _leaves(snapshot) == _leaves(validated)
    assert snapshot.turns.kill_grace == 1.5 and snapshot.runtime.model == "sonnet"
    assert snapshot.model_dump() == validated.model_dump(mode="json")  # type: ignore[attr-defined]
    if text:
        assert snapshot.providers["local"].base_url == "http://127.0.0.1:9/v1"
        assert snapshot.models.get("lead") == "opus" and snapshot.models.get("scout") is None


def test_the_snapshot_is_read_only_and_says_what_is_missing(tmp_path: Path) -> None:
    write_agent_snapshot(tmp_path / "none.yaml", None, {}, tmp_path)
    snapshot = config_snapshot.read(tmp_path / "config.json")
    with pytest.raises(AttributeError, match="read-only"):
        snapshot.turns.max_retries = 9
    with pytest.raises(AttributeError, match="no 'nonsense'"):
        snapshot.turns.nonsense  # noqa: B018


def test_the_loop_loads_the_config_itself_without_a_usable_snapshot(project: ProjectPaths) -> None:
    run_dir = project.run_dir / "builder-x"
    run_dir.mkdir(parents=True)
    project.local_config_file.write_text("turns:\n  max_retries: 7\n")
    fallback = load_loop_config(project, "builder-x", {})  # no snapshot (slung by an older ov)
    assert isinstance(fallback, config_snapshot.Snapshot) and fallback.turns.max_retries == 7
    (run_dir / "config.json").write_text('{"format": 99}')
    assert load_loop_config(project, "builder-x", {}).turns.max_retries == 7
    (run_dir / "config.json").write_text("{half a fi")
    assert load_loop_config(project, "builder-x", {}).turns.max_retries == 7
    write_agent_snapshot(project.config_file, project.local_config_file, {}, run_dir)
    project.local_config_file.write_text("turns:\n  max_retries: 1\n")  # changed after the sling
    read = load_loop_config(project, "builder-x", {})
    assert isinstance(read, config_snapshot.Section) and read.turns.max_retries == 7


def test_a_reading_loop_never_sees_half_a_snapshot(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_agent_snapshot(tmp_path / "none.yaml", None, {}, run_dir)
    write_agent_snapshot(tmp_path / "none.yaml", None, {"OV_TURNS_MAX_RETRIES": "4"}, run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json"]  # the temporary file was renamed over it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.snapshot.json", "run"]
    assert config_snapshot.read(run_dir / "config.json").turns.max_retries == 4


def test_watchdog_readoption_refreshes_the_snapshot_and_keeps_it_if_the_config_broke(
        project: ProjectPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    from overstory.agents import loop
    from overstory.agents.process import save_launch_env
    from overstory.watchdog import daemon as watchdog

    started: list[str] = []
    monkeypatch.setattr(loop, "spawn_loop", lambda _project, agent, _gen, _env: (started.append(agent), (1, None))[1])
    run_dir = project.run_dir / "builder-x"
    save_launch_env(project, "builder-x", {"OV_TURNS_MAX_RETRIES": "3"})
    write_agent_snapshot(project.config_file, project.local_config_file, {}, run_dir)
    project.local_config_file.write_text("turns:\n  stall_timeout: 42\n")
    watchdog._spawn_loop(project, "builder-x", 1)
    snapshot = config_snapshot.read(run_dir / "config.json")
    assert (snapshot.turns.stall_timeout, snapshot.turns.max_retries) == (42, 3)  # files now, launch env
    project.local_config_file.write_text("turns:\n  stall_timeout: -1\n")
    watchdog._spawn_loop(project, "builder-x", 1)
    assert config_snapshot.read(run_dir / "config.json").turns.stall_timeout == 42
    assert started == ["builder-x", "builder-x"]


def _mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_real_idle_loop_has_neither_pydantic_nor_yaml_loaded(project: ProjectPaths, tmp_path: Path) -> None:
    """The compiled parts of pydantic (pydantic_core) and yaml (_yaml) show in /proc/PID/maps once imported."""
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.store import sessions
    from overstory.store.db import open_state

    scenario = tmp_path / "idle.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [], "result": "waiting for mail"}]}))
    config = load_config(project.config_file, project.local_config_file, environ={})
    conn = open_state(project.state_db)
    try:
        result = sling(project, config, conn, SlingRequest(capability="scout", task_id="idle", runtime="scripted",
                                                           scenario=scenario), environ=agent_env())

        def idle() -> sessions.Session | None:
            agent = sessions.get(conn, result.name)
            return agent if agent is not None and agent.state == "between_turns" and agent.turns == 1 else None

        agent = wait_for(idle, 60, message="the scout's first turn to end")
    finally:
        conn.close()
    assert (project.run_dir / result.name / "config.json").is_file()
    maps = _mapped(agent.loop_pid)
    assert "_sqlite3" in maps  # the check can see extension modules
    assert "pydantic_core" not in maps and "_yaml" not in maps
    control = subprocess.Popen([sys.executable, "-c", "import overstory.config.model, sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE, env={**os.environ})
    try:
        wait_for(lambda: "pydantic_core" in _mapped(control.pid), 30, message="the control to import pydantic")
    finally:
        control.communicate(b"", timeout=30)


def test_the_snapshot_has_every_method_the_config_models_have(tmp_path: Path) -> None:
    """A method added to a config model must be added to the snapshot too (the loop calls it there)."""
    from pydantic import BaseModel

    write_agent_snapshot(tmp_path / "none.yaml", None, {"OV_RUNTIME_DEFAULT": "scripted"}, tmp_path)
    snapshot = config_snapshot.read(tmp_path / "config.json")
    validated = load_config(tmp_path / "none.yaml", None, environ={"OV_RUNTIME_DEFAULT": "scripted"})

    def methods(model: type[BaseModel]) -> set[str]:
        return {name for name, value in vars(model).items() if callable(value) and not name.startswith("_")}

    assert methods(Config) == {"runtime_for"}
    for capability in ("builder", "scout", "coordinator"):
        assert snapshot.runtime_for(capability) == validated.runtime_for(capability)

    def models(model: t.Any, where: str) -> t.Iterator[tuple[str, type[BaseModel]]]:
        for name, field in model.model_fields.items():
            for annotation in (field.annotation, *t.get_args(field.annotation)):
                if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                    yield f"{where}{name}", annotation
                    yield from models(annotation, f"{where}{name}.")

    found = dict(models(Config, ""))
    assert "budgets.agent" in found and "providers" in found  # nested sections and mappings of models
    for name, model in found.items():
        assert methods(model) == set(), f"{name}: teach config_snapshot.Section the methods of {model.__name__}"
