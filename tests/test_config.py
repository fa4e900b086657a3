"""Configuration: defaults, layer precedence, error messages, and the documented default file."""

from __future__ import annotations

import typing as t
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from overstory.config.model import DEFAULT_CONFIG_YAML, Config, env_var_names, load_config
from overstory.errors import ConfigError


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "config.yaml", tmp_path / "config.local.yaml"


def section_models() -> dict[str, type[BaseModel]]:
    return {name: f.annotation for name, f in Config.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}


# ---- defaults and precedence -------------------------------------------------


def test_defaults_without_any_file(files: tuple[Path, Path]) -> None:
    config = load_config(*files, environ={})
    assert config == Config()
    assert config.turns.stall_timeout == 600
    assert config.runtime.default == "claude"
    assert config.merge.gates == []


def test_an_empty_file_means_defaults(files: tuple[Path, Path]) -> None:
    write(files[0], "# nothing set\n")
    assert load_config(*files, environ={}) == Config()


def test_a_section_with_every_key_commented_out_means_defaults(files: tuple[Path, Path]) -> None:
    write(files[0], "turns:\n  # stall_timeout: 30\nwatchdog:\n")
    assert load_config(*files, environ={}) == Config()


def test_each_layer_overrides_the_one_below(files: tuple[Path, Path]) -> None:
    main, local = files
    write(main, "turns:\n  stall_timeout: 100\n  max_retries: 5\nwatchdog:\n  interval: 7\n")
    write(local, "turns:\n  stall_timeout: 200\n")
    config = load_config(main, local, environ={"OV_WATCHDOG_INTERVAL": "9"})
    assert config.turns.stall_timeout == 200          # local beats the project file
    assert config.turns.max_retries == 5              # untouched keys of a section survive the merge
    assert config.watchdog.interval == 9              # the environment beats both files
    assert config.watchdog.stale_after == 300         # defaults fill the rest
    config = load_config(main, local, environ={"OV_TURNS_STALL_TIMEOUT": "30"})
    assert config.turns.stall_timeout == 30


def test_the_process_environment_is_read_by_default(files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OV_TURNS_STALL_TIMEOUT", "45")
    assert load_config(*files).turns.stall_timeout == 45


@pytest.mark.parametrize(("variable", "raw", "section", "key", "expected"), [
    ("OV_RUNTIME_TMUX", "true", "runtime", "tmux", True),
    ("OV_TURNS_MAX_RETRIES", "0", "turns", "max_retries", 0),
    ("OV_TURNS_RETRY_BACKOFF", "0.5", "turns", "retry_backoff", 0.5),
    ("OV_MERGE_GATES", '["pytest -q", "ruff check"]', "merge", "gates", ["pytest -q", "ruff check"]),
    ("OV_RUNTIME_MODEL", "null", "runtime", "model", None),
    ("OV_RUNTIME_MODEL", "sonnet", "runtime", "model", "sonnet"),
    ("OV_RUNTIME_DEFAULT", "scripted", "runtime", "default", "scripted"),
    ("OV_PROJECT_CANONICAL_BRANCH", "2024", "project", "canonical_branch", "2024"),
    ("OV_RUNTIME_CLAUDE_BIN", "/opt/claude/bin/claude", "runtime", "claude_bin", "/opt/claude/bin/claude"),
])
def test_environment_values_are_typed(files: tuple[Path, Path], variable: str, raw: str, section: str, key: str,
                                      expected: t.Any) -> None:
    config = load_config(*files, environ={variable: raw})
    assert getattr(getattr(config, section), key) == expected


def test_every_section_key_has_an_environment_variable() -> None:
    names = set(env_var_names())
    for section, model in section_models().items():
        for key in model.model_fields:
            assert f"OV_{section.upper()}_{key.upper()}" in names


# ---- bad configuration ------------------------------------------------------


def test_unknown_key_names_file_key_and_expected_keys(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turns:\n  stall_timout: 30\n")
    with pytest.raises(ConfigError) as caught:
        load_config(main, None, environ={})
    message = str(caught.value)
    assert str(main) in message
    assert "turns.stall_timout" in message
    assert "stall_timeout" in message.split("turns.stall_timout", 1)[1], "should list the keys that were expected"


def test_unknown_section_is_refused(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turn:\n  stall_timeout: 30\n")
    with pytest.raises(ConfigError, match=r"unknown key 'turn'.*turns"):
        load_config(main, None, environ={})


def test_wrong_type_names_file_key_and_expectation(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turns:\n  stall_timeout: soon\n")
    with pytest.raises(ConfigError) as caught:
        load_config(main, None, environ={})
    message = str(caught.value)
    assert str(main) in message and "turns.stall_timeout" in message
    assert "number" in message and "soon" in message


def test_out_of_range_value(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turns:\n  max_concurrent: 0\n")
    with pytest.raises(ConfigError, match=r"turns\.max_concurrent.*greater than or equal to 1"):
        load_config(main, None, environ={})


def test_invalid_choice_lists_the_choices(files: tuple[Path, Path]) -> None:
    main = write(files[0], "runtime:\n  default: copilot\n")
    with pytest.raises(ConfigError, match=r"runtime\.default.*'claude'.*'scripted'.*'codex'.*'gemini'.*'opencode'"):
        load_config(main, None, environ={})


def test_broken_yaml_names_file_and_line(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turns:\n  stall_timeout: 30\n  max_retries: [1, 2\nwatchdog: {}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(main, None, environ={})
    message = str(caught.value)
    assert str(main) in message and "YAML" in message and "line" in message


@pytest.mark.parametrize("text", ["- turns\n- watchdog\n", "just a sentence\n", "42\n"])
def test_non_mapping_top_level(files: tuple[Path, Path], text: str) -> None:
    main = write(files[0], text)
    with pytest.raises(ConfigError, match="mapping"):
        load_config(main, None, environ={})


def test_a_section_that_is_not_a_mapping(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turns: 5\n")
    with pytest.raises(ConfigError, match=r"config\.yaml.*'turns'.*dictionary"):
        load_config(main, None, environ={})


def test_the_bad_layer_is_the_one_blamed(files: tuple[Path, Path]) -> None:
    main, local = files
    write(main, "turns:\n  stall_timeout: 30\n")
    write(local, "turns:\n  stall_timeout: -1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(main, local, environ={})
    assert str(local) in str(caught.value) and str(main) not in str(caught.value)


def test_a_bad_environment_variable_is_named(files: tuple[Path, Path]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(*files, environ={"OV_TURNS_STALL_TIMEOUT": "soon"})
    message = str(caught.value)
    assert "OV_TURNS_STALL_TIMEOUT" in message and "turns.stall_timeout" in message


def test_unknown_provider_key(files: tuple[Path, Path]) -> None:
    main = write(files[0], "providers:\n  local:\n    base_url: http://127.0.0.1:1\n    key: x\n")
    with pytest.raises(ConfigError, match=r"providers\.local\.key.*base_url"):
        load_config(main, None, environ={})


def test_error_messages_are_one_line(files: tuple[Path, Path]) -> None:
    main = write(files[0], "turns:\n  stall_timeout: soon\n  max_retries: many\n  bogus: 1\n")
    with pytest.raises(ConfigError) as caught:
        load_config(main, None, environ={})
    message = str(caught.value)
    assert "\n" not in message
    assert "stall_timeout" in message and "max_retries" in message and "bogus" in message


# ---- the documented default file -------------------------------------------


def _all_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys += _all_keys(field.annotation, prefix + name + ".")
    return keys


def test_every_key_is_documented_by_a_comment() -> None:
    """Each key line (other than a section header) sits right under a comment line."""
    lines = DEFAULT_CONFIG_YAML.splitlines()
    sections = section_models()
    path: list[str] = []
    documented: set[str] = set()
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        path = [*path[:depth], stripped.split(":", 1)[0].strip('"')]  # "on" is quoted (YAML 1.1 reads on as true)
        key = ".".join(path)
        if key in sections:
            continue  # a section header; its keys carry the comments
        previous = lines[number - 1].strip() if number else ""
        assert previous.startswith("#"), f"{key} (line {number + 1}) has no comment line right above it"
        documented.add(key)
    missing = [key for key in _all_keys(Config) if key not in sections and key not in documented]
    assert missing == [], f"keys missing from DEFAULT_CONFIG_YAML: {missing}"


def test_default_file_parses_to_exactly_the_model_defaults() -> None:
    data = yaml.safe_load(DEFAULT_CONFIG_YAML)
    assert Config.model_validate(data) == Config()
    assert data == Config().model_dump(), "the default file must spell out every key with its default value"


def test_default_file_loads_through_the_loader(tmp_path: Path) -> None:
    main = write(tmp_path / "config.yaml", DEFAULT_CONFIG_YAML)
    assert load_config(main, None, environ={}) == Config()


def test_sandbox_mode_off_and_on_written_bare_in_yaml(tmp_path):
    from overstory.config.model import load_config

    path = tmp_path / "config.yaml"
    path.write_text("sandbox:\n  mode: off\n  network: {default: on, scout: off}\n")
    config = load_config(path, environ={})
    assert config.sandbox.mode == "off"
    from overstory.config.snapshot import network_for  # a function, so the loop's snapshot has it too

    assert network_for(config.sandbox, "scout") is False and network_for(config.sandbox, "builder") is True
    path.write_text("sandbox:\n  mode: on\n")
    assert load_config(path, environ={}).sandbox.mode == "bwrap"
    path.write_text("sandbox:\n  network: {reviewers: off}\n")
    with pytest.raises(Exception, match="unknown capability 'reviewers'"):
        load_config(path, environ={})
