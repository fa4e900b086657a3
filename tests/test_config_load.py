"""``config_load.load``: the one way commands load the configuration (issue 34).

A command reads the project's validated snapshot when nothing it was made from changed,
and validates (pydantic) only when something did. These tests check that the snapshot
path gives exactly what validating gives, that every change is seen (even one that keeps
the file's size and modification time), that a broken file is never served from an older
snapshot, and that a command served from the snapshot never imports pydantic or yaml.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from overstory.config import load as config_load
from overstory.config import snapshot as config_snapshot
from overstory.config.model import load_config as validate
from overstory.errors import ConfigError

SRC = Path(__file__).resolve().parent.parent / "src" / "overstory"


def _files(tmp_path: Path, text: str = "turns:\n  max_retries: 5\n") -> tuple[Path, Path]:
    ov_dir = tmp_path / ".overstory"
    ov_dir.mkdir(exist_ok=True)
    (ov_dir / "config.yaml").write_text(text)
    return ov_dir / "config.yaml", ov_dir / "config.local.yaml"


def test_both_paths_give_what_validating_gives(tmp_path: Path) -> None:
    config_file, local_file = _files(tmp_path)
    local_file.write_text("providers:\n  local:\n    base_url: http://127.0.0.1:9/v1\nmodels:\n  lead: opus\n")
    environ = {"OV_TURNS_KILL_GRACE": "1.5"}
    expected = validate(config_file, local_file, environ=environ).model_dump(mode="json")
    assert not Path(config_load.cache_path(config_file)).exists()
    first = config_load.load(config_file, local_file, environ)  # validates, keeps the snapshot
    assert Path(config_load.cache_path(config_file)).is_file()
    second = config_load.load(config_file, local_file, environ)  # from the snapshot
    for loaded in (first, second):
        assert type(loaded) is config_snapshot.Snapshot
        assert loaded.model_dump() == expected
        assert json.dumps(loaded.model_dump()) == json.dumps(expected)  # the same order too (`ov config` shows it)
        assert loaded.turns.max_retries == 5 and loaded.turns.kill_grace == 1.5
        assert loaded.providers["local"].base_url == "http://127.0.0.1:9/v1"
        assert loaded.runtime_for("builder") == "claude"


def test_every_change_is_seen_even_with_the_same_size_and_time(tmp_path: Path) -> None:
    config_file, local_file = _files(tmp_path, "turns:\n  max_retries: 5\n")
    assert config_load.load(config_file, local_file, {}).turns.max_retries == 5
    stat = config_file.stat()
    config_file.write_text("turns:\n  max_retries: 6\n")  # same size
    os.utime(config_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same time
    assert config_load.load(config_file, local_file, {}).turns.max_retries == 6
    local_file.write_text("turns:\n  max_retries: 7\n")
    assert config_load.load(config_file, local_file, {}).turns.max_retries == 7
    assert config_load.load(config_file, local_file, {"OV_TURNS_MAX_RETRIES": "8"}).turns.max_retries == 8
    local_file.unlink()
    assert config_load.load(config_file, local_file, {}).turns.max_retries == 6


def test_a_broken_file_is_never_served_from_an_older_snapshot(tmp_path: Path) -> None:
    config_file, local_file = _files(tmp_path)
    config_load.load(config_file, local_file, {})
    kept = Path(config_load.cache_path(config_file)).read_text()
    config_file.write_text("turns:\n  max_retries: -1\n")
    for _ in range(2):
        with pytest.raises(ConfigError, match="max_retries"):
            config_load.load(config_file, local_file, {})
    with pytest.raises(ConfigError, match="unknown variable OV_TURNS_NONSENSE"):
        config_load.load(config_file.with_name("gone.yaml"), None, {"OV_TURNS_NONSENSE": "1"})
    assert Path(config_load.cache_path(config_file)).read_text() == kept  # only valid results are kept


def test_an_unusable_snapshot_only_costs_a_validation(tmp_path: Path) -> None:
    config_file, local_file = _files(tmp_path)
    cache = Path(config_load.cache_path(config_file))
    for garbage in ("{half a fi", '{"format": 99}', "[]", '{"format": 1, "key": null}'):
        cache.write_text(garbage)
        assert config_load.load(config_file, local_file, {}).turns.max_retries == 5
        assert json.loads(cache.read_text())["format"] == config_snapshot.FORMAT  # written again
    cache.unlink()
    cache.mkdir()  # cannot be written at all (as in a read-only folder)
    assert config_load.load(config_file, local_file, {}).turns.max_retries == 5


def test_a_command_served_from_the_snapshot_imports_neither_pydantic_nor_yaml(tmp_path: Path) -> None:
    config_file, local_file = _files(tmp_path)
    script = (f"import sys; from overstory.config import load as s; "
              f"c = s.load({str(config_file)!r}, {str(local_file)!r}); "
              f"print(c.turns.max_retries, 'pydantic' in sys.modules, 'yaml' in sys.modules)")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OV_")}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, check=True)
            for _ in range(2)]
    assert [r.stdout.split() for r in runs] == [["5", "True", "True"], ["5", "False", "False"]]
    config_file.write_text("turns:\n  max_retries: 9\n")
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environ, check=True)
    assert again.stdout.split() == ["9", "True", "True"]


def test_an_edited_schema_validates_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgraded ov (other defaults, other validators) must not serve what an older one validated."""
    config_file, local_file = _files(tmp_path)
    config_load.load(config_file, local_file, {})
    calls: list[Path] = []
    import overstory.config.model

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(Path(str(args[0])))
        return validate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(overstory.config.model, "load_config", counting)
    config_load.load(config_file, local_file, {})
    assert calls == []
    monkeypatch.setattr(config_load, "SCHEMA_FILES", (*config_load.SCHEMA_FILES, "py.typed"))
    config_load.load(config_file, local_file, {})
    assert calls == [config_file]


def test_only_the_loader_validates() -> None:
    """Commands, loops and the watchdog call ``config_load.load``; the models are built only when a file
    changed (there) or when `ov init` checks the file it writes."""
    callers = sorted(str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
                     if re.search(r"from overstory\.config\.model import [^\n]*\bload_config\b", path.read_text()))
    assert callers == ["config/load.py", "project/init.py"]
