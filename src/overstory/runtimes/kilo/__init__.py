"""The ``kilo`` runtime: the Kilo CLI (a fork of OpenCode), headless (``kilo run --format json``), one
process per turn.

Kilo keeps OpenCode's command line, config schema, plugin hooks and ``--format json`` events,
under its own names: ``kilo.json`` in ``$XDG_CONFIG_HOME/kilo``, ``KILO_*`` variables, the
``@kilocode/plugin`` package. So this adapter is OpenCode's with those names (see
``runtimes/opencode`` for what ov writes and why), plus what Kilo adds: PostHog telemetry and
calls to api.kilo.ai, off through ``KILO_TELEMETRY_LEVEL=off``, and tools of its own that ov
agents do not use (Kilo's board and wake-ups, denied like ``task``). The stream is parsed by
OpenCode's parser. Facts: tests/fixtures/KILO_PROBE_NOTES.md.
"""

from __future__ import annotations

import json
import os
import tempfile
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable, UsageError
from overstory.runtimes.base import AgentSetup, RuntimeProbe, TurnRequest, find_program
from overstory.runtimes.common import git_identity_env, guard_hook_command, probe_program
from overstory.runtimes.opencode import GUARD_TIMEOUT_MS, PLUGIN, PROVIDER, OpenCodeRuntime, opencode_json

if t.TYPE_CHECKING:
    from overstory.config.model import Config

PACKAGE = "@kilocode/cli"
HOME_DIR = "kilo-home"
KEY_ENV = "OV_KILO_API_KEY"
BASE_URL_ENV = "OV_KILO_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Kilo's own ways to post to a board, schedule wake-ups and start sub-agents: ov agents use ov mail and sling.
DENIED_TOOLS = ("task", "board_post", "board_read", "schedule_wakeup", "cancel_wakeup")


def kilo_json(model: str) -> dict[str, t.Any]:
    config = opencode_json(model)
    config["$schema"] = "https://app.kilo.ai/config.json"
    options = config["provider"][PROVIDER]["options"]
    options["baseURL"], options["apiKey"] = f"{{env:{BASE_URL_ENV}}}", f"{{env:{KEY_ENV}}}"
    config["permission"].update({tool: "deny" for tool in DENIED_TOOLS})
    # Only ov's provider: Kilo's own gateway ("kilo") and the others it knows fetch their model lists at start.
    config["enabled_providers"] = [PROVIDER]
    return config


class KiloRuntime(OpenCodeRuntime):
    name = "kilo"
    own_agent_tools = "Kilo's own sub-agents, board or wake-ups (task, board_post, schedule_wakeup: all off)"
    instructions_file = "AGENTS.md"  # in kilo's ov-owned config dir, not the worktree

    def _bin(self, config: Config | None) -> str:
        return config.runtime.kilo_bin if config is not None else os.environ.get("OV_RUNTIME_KILO_BIN", "kilo")

    def program(self, config: Config) -> list[str]:
        found = find_program(self._bin(config))
        if found is None:
            raise RuntimeNotAvailable(f"the kilo runtime needs `{self._bin(config)}` on PATH: npm install -g "
                                      f"{PACKAGE} (or set runtime.kilo_bin)")
        return [found]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        argv = [*self.program(config), "run", "--format", "json"]
        if request.model:
            argv += ["--model", f"{PROVIDER}/{request.model}"]
        if request.resume_session_id:
            argv += ["--session", request.resume_session_id]
        return argv

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {BASE_URL_ENV: base_url, KEY_ENV: api_key}

    def inherited_env(self, environ: t.Mapping[str, str]) -> dict[str, str]:
        # KILO_PURE/OPENCODE_PURE would switch off ov's guard plugin; XDG_* and HOME are replaced below.
        env = {k: v for k, v in environ.items() if not k.startswith(("KILO", "OPENCODE", "XDG_"))}
        env.update(git_identity_env(environ))  # read with the real HOME, before it moves
        env[BASE_URL_ENV] = DEFAULT_BASE_URL  # no provider configured: OpenAI's own endpoint and key
        env[KEY_ENV] = environ.get("OPENAI_API_KEY", "")
        return env

    def state_dir(self, run_dir: Path) -> Path | None:
        return run_dir / HOME_DIR

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        root = run_dir / HOME_DIR
        return {
            "HOME": str(root / "home"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_CACHE_HOME": str(root / "cache"),
            "XDG_STATE_HOME": str(root / "state"),
            "KILO_DISABLE_MODELS_FETCH": "1",
            "KILO_DISABLE_AUTOUPDATE": "1",
            "KILO_DISABLE_PROJECT_CONFIG": "1",
            "KILO_DISABLE_CLAUDE_CODE": "1",
            "KILO_DISABLE_SHARE": "1",
            "KILO_DISABLE_SESSION_INGEST": "1",
            "KILO_TELEMETRY_LEVEL": "off",  # only "all" turns PostHog on
        }

    def state_files(self, setup: AgentSetup) -> dict[str, str] | None:
        if not setup.model:
            raise UsageError("the kilo runtime needs a model: ov sling --model, config models.<capability> "
                             "or runtime.model")
        plugin_package = {"@kilocode/plugin": "*"}
        return {
            "home/.keep": "",
            "config/kilo/kilo.json": json.dumps(kilo_json(setup.model), indent=2),
            "config/kilo/AGENTS.md": setup.instructions,
            "config/kilo/plugins/ov-guard.js": PLUGIN % {"command": json.dumps(guard_hook_command(setup.ov_command)),
                                                         "timeout": GUARD_TIMEOUT_MS},
            "config/kilo/package.json": json.dumps({"dependencies": plugin_package}, indent=2),
            "config/kilo/package-lock.json": json.dumps(
                {"lockfileVersion": 3, "packages": {"": {"dependencies": plugin_package}}}, indent=2),
            "config/kilo/node_modules/.keep": "",
        }

    def probe(self, config: Config | None) -> RuntimeProbe:
        if os.environ.get("OPENAI_API_KEY"):
            credentials = "OPENAI_API_KEY set"
        elif config is not None and any(p.protocol == "openai-chat" for p in config.providers.values()):
            credentials = "no OPENAI_API_KEY; an openai-chat provider is configured"
        else:
            credentials = "no OPENAI_API_KEY (and no openai-chat provider in config)"
        with tempfile.TemporaryDirectory(prefix="ov-kilo-probe-") as scratch:
            env = {**self.inherited_env(os.environ), **self.turn_env(Path(scratch))}
            return probe_program(self.name, self._bin(config), env=env, credentials=credentials, package=PACKAGE,
                                 hint_key="kilo_bin")
