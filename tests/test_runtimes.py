"""The codex, gemini and opencode adapters without their CLIs: command lines, environments, the files
`ov sling` writes into their ov-owned homes, config (runtimes per capability, provider protocols,
prices), and `ov doctor`'s probe. The real CLIs are exercised in tests/e2e/test_*_agent.py."""

from __future__ import annotations

import json
import os
import stat
import sys
import tomllib
import typing as t
from pathlib import Path

import pytest

from conftest import run_git
from overstory.agents.spawn import SlingRequest, sling
from overstory.agents.turns import model_choice
from overstory.config.model import Config, load_config
from overstory.errors import ConfigError, OrchestratorError, UsageError
from overstory.paths import ProjectPaths
from overstory.project.doctor import check_runtimes
from overstory.runtimes import RUNTIME_NAMES, get_runtime
from overstory.runtimes.base import AgentSetup, Runtime, TurnRequest
from overstory.runtimes.codex.home import filesystem_rules
from overstory.runtimes.gemini import _safe_for_system_settings
from overstory.runtimes.prices import cost_usd, price_of

NEW_RUNTIMES = ("codex", "gemini", "opencode")


def fake_cli(path: Path, version: str) -> Path:
    """An executable that answers --version (and nothing else): enough for sling and doctor."""
    path.write_text(f"#!/bin/sh\necho '{version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, str]:
    return {f"{name}_bin": str(fake_cli(tmp_path / name, f"{name} 9.9.9")) for name in NEW_RUNTIMES}


def setup_for(tmp_path: Path, *, writable: bool = True, model: str | None = "m-1") -> AgentSetup:
    root = tmp_path / "proj"
    return AgentSetup(name="b", capability="builder" if writable else "reviewer", writable=writable,
                      project_root=root, worktree=root / ".overstory" / "worktrees" / "b",
                      run_dir=root / ".overstory" / "run" / "b", instructions="# Role: builder\nDo it.",
                      ov_command=["/opt/ov bin/ov"], model=model)


def request(tmp_path: Path, **fields: t.Any) -> TurnRequest:
    return TurnRequest(**{"model": "m-1", "resume_session_id": None, "run_dir": tmp_path / "run",
                          "at_project_root": False, **fields})


# ---- registry and config ----------------------------------------------------------------------------


def test_registered_behind_the_interface() -> None:
    for name in NEW_RUNTIMES:
        runtime = get_runtime(name)
        assert name in RUNTIME_NAMES and isinstance(runtime, Runtime) and runtime.name == name
        assert runtime.tui is None  # headless only: `ov sling --tmux` refuses them


def test_runtime_per_capability() -> None:
    config = Config.model_validate({"runtimes": {"builder": "codex", "reviewer": "gemini"}})
    assert config.runtime_for("builder") == "codex" and config.runtime_for("reviewer") == "gemini"
    assert config.runtime_for("scout") == "claude"


@pytest.mark.parametrize(("yaml_text", "needle"), [
    ("runtimes:\n  bulder: codex\n", "unknown capability 'bulder'"),
    ("runtimes:\n  builder: copilot\n", "unknown runtime 'copilot' for builder"),
    ("providers:\n  p: {base_url: 'http://x', protocol: grpc}\n", "unknown protocol"),
    ("prices:\n  m: {input_per_mtok: -1, output_per_mtok: 1}\n", "prices.m.input_per_mtok"),
])
def test_config_errors_name_the_key(tmp_path: Path, yaml_text: str, needle: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path, None, environ={})


def test_a_runtime_is_never_pointed_at_a_provider_of_another_protocol() -> None:
    config = Config.model_validate({"providers": {"oai": {"base_url": "http://127.0.0.1:1/v1", "api_key_env": "K",
                                                          "protocol": "openai-responses"}},
                                    "models": {"builder": "oai/gpt-x"}})
    assert model_choice(None, "builder", config, {"K": "k"}, "codex") == (
        "gpt-x", {"OV_CODEX_API_KEY": "k", "OV_CODEX_BASE_URL": "http://127.0.0.1:1/v1"})
    with pytest.raises(OrchestratorError, match="speaks openai-responses; the gemini runtime needs gemini"):
        model_choice(None, "builder", config, {"K": "k"}, "gemini")


def test_prices() -> None:
    assert price_of("gpt-5") == (1.25, 10.0)
    assert price_of("gpt-5-mini-2025-08-07") == (0.25, 2.0), "longest listed prefix"
    assert price_of("prov/gemini-2.5-flash") == (0.30, 2.50), "provider prefix dropped"
    assert price_of("mystery-model") is None and cost_usd("mystery-model", 10, 10) == 0.0
    configured = {"gpt-5": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}, "mine": {"input_per_mtok": 3,
                                                                                  "output_per_mtok": 4}}
    assert price_of("gpt-5", configured) == (1.0, 2.0), "config wins over the built-in list"
    assert cost_usd("mine", 1_000_000, 500_000, configured) == pytest.approx(3 + 2)
    prices = Config.model_validate({"prices": {"mine": {"input_per_mtok": 3, "output_per_mtok": 4}}}).prices
    assert cost_usd("mine", 2_000_000, 0, prices) == pytest.approx(6)


# ---- codex ---------------------------------------------------------------------------------------------


def test_codex_command_lines(tmp_path: Path, bins: dict[str, str]) -> None:
    codex = get_runtime("codex")
    config = Config.model_validate({"runtime": bins})
    fresh = codex.headless_command(request(tmp_path), config)
    assert fresh == [bins["codex_bin"], "exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-hook-trust",
                     "-m", "m-1", "-"]
    resumed = codex.headless_command(request(tmp_path, resume_session_id="01a2-thread",
                                             provider_env={"OV_CODEX_BASE_URL": "http://127.0.0.1:5/v1"}), config)
    assert resumed[-5:] == ["-c", 'model_providers.ov.base_url="http://127.0.0.1:5/v1"', "resume", "01a2-thread", "-"]
    assert codex.stdin_message("héllo") == "héllo".encode()


def test_codex_environment(tmp_path: Path) -> None:
    codex = get_runtime("codex")
    inherited = codex.inherited_env({"CODEX_HOME": "/root/.codex", "CODEX_THREAD_ID": "parent", "OPENAI_API_KEY": "k",
                                     "PATH": "/bin"})
    assert inherited == {"OPENAI_API_KEY": "k", "OV_CODEX_API_KEY": "k", "PATH": "/bin"}
    run_dir = tmp_path / "run" / "b"
    env = codex.turn_env(run_dir)
    assert env["CODEX_HOME"] == str(run_dir / "codex-home")
    # tmp_path is under /tmp: codex would refuse to put its sandbox helpers in a home there.
    assert env["TMPDIR"] == str(run_dir / "codex-tmp") and Path(env["TMPDIR"]).is_dir()


def test_codex_home_files(tmp_path: Path) -> None:
    setup = setup_for(tmp_path)
    files = get_runtime("codex").state_files(setup)
    assert files is not None and set(files) == {"config.toml", "AGENTS.md"}
    assert files["AGENTS.md"] == setup.instructions
    config = tomllib.loads(files["config.toml"])
    assert config["model_provider"] == "ov" and config["default_permissions"] == "ov"
    assert config["model_providers"]["ov"] == {"name": "ov", "base_url": "https://api.openai.com/v1",
                                               "env_key": "OV_CODEX_API_KEY", "wire_api": "responses"}
    assert config["features"] == {"plugins": False, "shell_snapshot": False, "multi_agent": False}
    assert not config["analytics"]["enabled"]
    hook = config["hooks"]["PreToolUse"][0]["hooks"][0]
    assert hook["type"] == "command" and hook["command"].startswith("'/opt/ov bin/ov' guard || {")
    rules = config["permissions"]["ov"]["filesystem"]
    ov_dir = setup.project_root / ".overstory"
    assert rules[":root"] == "read" and rules[str(setup.project_root)] == "read"
    assert rules[str(ov_dir)] == "write" and rules[str(ov_dir / "run")] == "read"
    assert rules[str(ov_dir / "worktrees")] == "read"


def test_codex_sandbox_profile_by_capability(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    run_git(tmp_path, "init", "-q", "-b", "main", str(root))
    (root / "a").write_text("a")
    run_git(root, "add", "a")
    run_git(root, "commit", "-q", "-m", "a")
    wt = root / ".overstory" / "worktrees" / "b"
    run_git(root, "worktree", "add", "-q", "-b", "ov/b", str(wt))
    writer = dict(filesystem_rules(setup_for(tmp_path), tmp_path / "t"))
    reader = dict(filesystem_rules(setup_for(tmp_path, writable=False), tmp_path / "t"))
    git_dir = root.resolve() / ".git"
    assert writer[wt] == "write" and writer[git_dir / "worktrees" / "b"] == "write"
    assert writer[git_dir / "objects"] == writer[git_dir / "refs"] == writer[git_dir / "logs"] == "write"
    assert wt not in reader and not any(str(p).startswith(str(git_dir)) for p in reader if isinstance(p, Path))
    assert reader[root / ".overstory"] == "write", "read-only agents still send mail (state.db)"


# ---- gemini --------------------------------------------------------------------------------------------


def test_gemini_command_lines(tmp_path: Path, bins: dict[str, str]) -> None:
    gemini = get_runtime("gemini")
    config = Config.model_validate({"runtime": bins})
    assert gemini.headless_command(request(tmp_path), config) == [
        bins["gemini_bin"], "--output-format", "stream-json", "--skip-trust", "--approval-mode", "yolo", "-m", "m-1"]
    assert gemini.headless_command(request(tmp_path, resume_session_id="uuid-1"), config)[-2:] == ["--resume", "uuid-1"]


def test_gemini_environment(tmp_path: Path) -> None:
    gemini = get_runtime("gemini")
    inherited = gemini.inherited_env({"GEMINI_API_KEY": "k", "GOOGLE_GENAI_USE_VERTEXAI": "true", "GEMINI_SYSTEM_MD": "x",
                                      "GOOGLE_GEMINI_BASE_URL": "http://elsewhere", "SANDBOX": "1", "OTEL_X": "1",
                                      "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "e", "GIT_COMMITTER_NAME": "a",
                                      "GIT_COMMITTER_EMAIL": "e", "PATH": "/bin"})
    assert inherited == {"GEMINI_API_KEY": "k", "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "e",
                         "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "e", "PATH": "/bin"}
    env = gemini.turn_env(tmp_path)
    assert env["GEMINI_CLI_HOME"] == str(tmp_path / "gemini-home") and env["GEMINI_CLI_NO_RELAUNCH"] == "true"
    assert gemini.provider_env("http://127.0.0.1:9", "k2") == {"GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9",
                                                              "GEMINI_API_KEY": "k2"}


def test_gemini_commit_identity_comes_from_git_config(tmp_path: Path) -> None:
    """Gemini's shell tool hides the global git config: ov passes the identity as variables."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Ada\n\temail = ada@example.invalid\n")
    env = get_runtime("gemini").inherited_env({"HOME": str(home), "PATH": os.environ["PATH"]})
    assert env["GIT_AUTHOR_NAME"] == env["GIT_COMMITTER_NAME"] == "Ada"
    assert env["GIT_AUTHOR_EMAIL"] == "ada@example.invalid"


def test_gemini_settings_where_gemini_accepts_them(tmp_path: Path) -> None:
    setup = setup_for(tmp_path)
    files = get_runtime("gemini").state_files(setup)
    assert files is not None and files[".gemini/GEMINI.md"] == setup.instructions
    # tmp_path is under /tmp (others may write there): gemini would skip a system settings file.
    assert not _safe_for_system_settings(setup.run_dir) and "system-settings.json" not in files
    settings = json.loads(files[".gemini/settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    hook = settings["hooks"]["BeforeTool"][0]
    assert hook["matcher"] == ".*" and "guard || {" in hook["hooks"][0]["command"]
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(tmp_path, 0o700)
    try:
        assert _safe_for_system_settings(private / "run") == all(
            not (p.stat().st_mode & 0o022) for p in (private.resolve(), *private.resolve().parents))
    finally:
        os.chmod(tmp_path, 0o755)


# ---- opencode ------------------------------------------------------------------------------------------


def test_opencode_command_lines(tmp_path: Path, bins: dict[str, str]) -> None:
    opencode = get_runtime("opencode")
    config = Config.model_validate({"runtime": bins})
    assert opencode.headless_command(request(tmp_path), config) == [
        bins["opencode_bin"], "run", "--format", "json", "--model", "ov/m-1"]
    assert opencode.headless_command(request(tmp_path, resume_session_id="ses_1"), config)[-2:] == [
        "--session", "ses_1"]


def test_opencode_environment_and_files(tmp_path: Path) -> None:
    opencode = get_runtime("opencode")
    inherited = opencode.inherited_env({"OPENCODE_PURE": "1", "XDG_CONFIG_HOME": "/u/.config", "OPENAI_API_KEY": "k",
                                        "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "e", "GIT_COMMITTER_NAME": "a",
                                        "GIT_COMMITTER_EMAIL": "e"})
    assert "OPENCODE_PURE" not in inherited and "XDG_CONFIG_HOME" not in inherited
    assert inherited["OV_OPENCODE_API_KEY"] == "k" and inherited["OV_OPENCODE_BASE_URL"] == "https://api.openai.com/v1"
    env = opencode.turn_env(tmp_path)
    assert env["HOME"] == str(tmp_path / "opencode-home" / "home")
    assert env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1"
    files = opencode.state_files(setup_for(tmp_path))
    assert files is not None
    config = json.loads(files["config/opencode/opencode.json"])
    assert config["model"] == "ov/m-1" and "m-1" in config["provider"]["ov"]["models"]
    assert config["provider"]["ov"]["options"]["baseURL"] == "{env:OV_OPENCODE_BASE_URL}"
    plugin = files["config/opencode/plugins/ov-guard.js"]
    assert '"tool.execute.before"' in plugin and json.dumps("'/opt/ov bin/ov' guard") [:-1] in plugin
    with pytest.raises(UsageError, match="needs a model"):
        opencode.state_files(setup_for(tmp_path, model=None))


# ---- sling and doctor --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("runtime", "home_file"), [("codex", "codex-home/AGENTS.md"),
                                                    ("gemini", "gemini-home/.gemini/GEMINI.md"),
                                                    ("opencode", "opencode-home/config/opencode/AGENTS.md")])
def test_sling_writes_the_home_not_the_worktree(project: ProjectPaths, state_db: t.Any, bins: dict[str, str],
                                                runtime: str, home_file: str) -> None:
    config = Config.model_validate({"runtime": bins, "runtimes": {"builder": runtime}, "models": {"builder": "m-1"}})
    result = sling(project, config, state_db, SlingRequest(capability="builder", task_id="t1", prompt="do it"),
                   environ=dict(os.environ), start=False)
    assert result.runtime == runtime
    instructions = project.run_dir / result.name / home_file
    assert "do it" in instructions.read_text() and result.name in instructions.read_text()
    worktree = Path(result.worktree or "")
    assert run_git(worktree, "status", "--porcelain", "--ignored") == ""
    assert not (worktree / ".claude").exists()


def test_doctor_probes_each_runtime(bins: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    config = Config.model_validate({"runtime": bins})
    checks = {c.name: c for c in check_runtimes(config)}
    for name in NEW_RUNTIMES:
        assert checks[name].status == "ok" and f"{name} 9.9.9 at {bins[name + '_bin']}" in checks[name].detail
    assert "no OPENAI_API_KEY" in checks["codex"].detail and "GEMINI_API_KEY set" in checks["gemini"].detail
    assert "BeforeTool hook" in checks["gemini"].detail
    missing = Config.model_validate({"runtime": {"codex_bin": "/nonexistent/codex"}})
    assert {c.name: c for c in check_runtimes(missing)}["codex"].status == "warn"


def test_doctor_never_lets_codex_touch_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`codex --version` writes ~/.codex unless CODEX_HOME is set: the probe sets it."""
    seen = tmp_path / "seen"
    script = tmp_path / "codex"
    script.write_text(f"#!/bin/sh\necho \"$CODEX_HOME\" > {seen}\necho codex-cli 0.169.0\n")
    script.chmod(0o755)
    monkeypatch.setenv("CODEX_HOME", str(Path.home() / ".codex"))
    probe = get_runtime("codex").probe(Config.model_validate({"runtime": {"codex_bin": str(script)}}))
    assert probe.status == "ok" and "codex-cli 0.169.0" in probe.detail
    used = seen.read_text().strip()
    assert used and not used.startswith(str(Path.home())) and not Path(used).exists()


def test_no_python_import_of_heavy_modules_by_the_parsers() -> None:
    import subprocess

    code = ("import sys; import overstory.runtimes.codex.stream, overstory.runtimes.gemini.stream, "
            "overstory.runtimes.opencode.stream; "
            "print(sorted(m for m in ('pydantic', 'click', 'rich', 'git', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("runtime", NEW_RUNTIMES)
def test_tmux_mode_is_refused_clearly(project: ProjectPaths, state_db: t.Any, bins: dict[str, str],
                                      runtime: str) -> None:
    config = Config.model_validate({"runtime": bins, "models": {"builder": "m-1"}})
    with pytest.raises(UsageError, match=f"the {runtime} runtime is headless only"):
        sling(project, config, state_db, SlingRequest(capability="builder", task_id="t1", runtime=runtime, tmux=True),
              environ=dict(os.environ), start=False)
    assert not project.worktree("builder-t1").exists()


def test_claudes_default_models_are_not_given_to_other_runtimes() -> None:
    """`ov init` gives builders `sonnet` and scouts `haiku`: Claude aliases that codex, gemini and
    opencode would reject. A capability run by one of them keeps that CLI's own default instead;
    a model the user chose for it is passed on."""
    config = Config.model_validate({"runtimes": {"builder": "codex"}})
    assert config.models["builder"] == "sonnet"
    assert model_choice(None, "builder", config, {}) == (None, {})
    assert model_choice(None, "scout", config, {}) == ("haiku", {}), "claude keeps it"
    assert model_choice(None, "builder", config, {}, "claude") == ("sonnet", {}), "sling --runtime claude"
    chosen = Config.model_validate({"runtimes": {"builder": "gemini"}, "models": {"builder": "gemini-2.5-pro"}})
    assert model_choice(None, "builder", chosen, {}) == ("gemini-2.5-pro", {})


def test_a_failed_spawn_leaves_no_home_behind(project: ProjectPaths, state_db: t.Any, bins: dict[str, str]) -> None:
    """The home files are written after the spawn journal's run-dir step: an injected failure right
    there is undone like any other (no branch, worktree, run dir or row left)."""
    config = Config.model_validate({"runtime": bins, "runtimes": {"builder": "codex"}})
    with pytest.raises(OrchestratorError, match="injected failure at step 'instructions'"):
        sling(project, config, state_db, SlingRequest(capability="builder", task_id="t1", prompt="do it"),
              environ={**os.environ, "OV_TEST_FAIL_AT": "instructions"}, start=False)
    assert not (project.run_dir / "builder-t1").exists() and not project.worktree("builder-t1").exists()
    assert "ov/builder-t1" not in run_git(project.root, "branch", "--list")
    assert state_db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0
