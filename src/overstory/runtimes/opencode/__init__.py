"""The ``opencode`` runtime: OpenCode, headless (``opencode run --format json``), one process per turn.

All of an agent's opencode state lives under ``.overstory/run/<agent>/opencode-home``:
``HOME`` and the four ``XDG_*`` dirs point there, so the user's ``~/.opencode``,
``~/.config/opencode`` and ``~/.claude/CLAUDE.md`` are neither read nor written (the agent's
shell commands see that ``HOME`` too). Project config (a repository's ``opencode.json``,
``.opencode/`` plugins and its ``AGENTS.md``) is off, so nothing in a worktree can change an
agent's provider, permissions or guard. ov writes into the config dir:

- ``opencode.json``: one OpenAI-compatible (Chat Completions) provider, ``ov``, whose base URL
  and key come from the environment of each turn; the agent's model declared in it (opencode
  refuses an undeclared one), snapshots, sharing, updates and title requests off;
- ``AGENTS.md``: the agent's instructions (opencode's global instructions file);
- ``plugins/ov-guard.js``: a ``tool.execute.before`` hook that runs ``ov guard`` before every
  tool call and throws (blocking the call, telling the model why) when it refuses or fails;
- ``package.json``/``package-lock.json``/``node_modules/``: they make opencode skip the npm
  install of its plugin package it otherwise starts on every run.

The prompt goes on stdin, which is then closed. Facts: tests/fixtures/OPENCODE_PROBE_NOTES.md.
"""

from __future__ import annotations

import json
import os
import tempfile
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable, UsageError
from overstory.runtimes.base import AgentSetup, Runtime, RuntimeProbe, TurnParser, TurnRequest, find_program
from overstory.runtimes.common import git_identity_env, guard_hook_command, probe_program

if t.TYPE_CHECKING:
    from overstory.config.model import Config

PACKAGE = "opencode-ai"
HOME_DIR = "opencode-home"
PROVIDER = "ov"
KEY_ENV = "OV_OPENCODE_API_KEY"
BASE_URL_ENV = "OV_OPENCODE_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
GUARD_TIMEOUT_MS = 60000
PROVIDER_TIMEOUT_MS = 120000  # opencode's own default waits 300 s for headers and between chunks

PLUGIN = """// Written by ov sling. Every tool call is first checked by `ov guard`; when it refuses, or fails,
// the call is blocked and the model is told why.
import { spawn } from "node:child_process"

const GUARD = %(command)s
const TIMEOUT_MS = %(timeout)d

// The guard runs without blocking this process: while it waits, opencode goes on printing its events,
// and ov may hold the answer until the stream shows every bill counted below.
function guard(call) {
  return new Promise((resolve) => {
    const child = spawn("/bin/sh", ["-c", GUARD], { stdio: ["pipe", "ignore", "pipe"] })
    let stderr = ""
    const timer = setTimeout(() => { child.kill("SIGKILL"); resolve({ status: null, stderr, why: "timed out" }) },
                             TIMEOUT_MS)
    child.stderr.on("data", (chunk) => { stderr += chunk })
    child.on("error", (error) => { clearTimeout(timer); resolve({ status: null, stderr, why: String(error) }) })
    child.on("close", (status, signal) => { clearTimeout(timer); resolve({ status, stderr, why: signal }) })
    child.stdin.on("error", () => {})
    child.stdin.end(JSON.stringify(call))
  })
}

export const OvGuard = async ({ directory }) => {
  const bills = new Set()  // the step-finish parts (each carries a step's tokens and cost) seen so far
  return {
    event: async ({ event }) => {
      const part = event && event.properties && event.properties.part
      if (event.type === "message.part.updated" && part && part.type === "step-finish") bills.add(part.id)
    },
    "tool.execute.before": async (input, output) => {
      const call = { tool: input.tool, sessionID: input.sessionID, callID: input.callID, args: output.args,
                     cwd: directory, ov_bills_seen: bills.size }
      const result = await guard(call)
      if (result.status !== 0) {
        const why = (result.stderr || "").trim()
        throw new Error(why || `ov guard failed (${result.why || result.status}); call blocked`)
      }
    },
  }
}
"""


def opencode_json(model: str) -> dict[str, t.Any]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: {
            "npm": "@ai-sdk/openai-compatible",
            "name": "ov",
            "options": {"baseURL": f"{{env:{BASE_URL_ENV}}}", "apiKey": f"{{env:{KEY_ENV}}}",
                        "headerTimeout": PROVIDER_TIMEOUT_MS, "chunkTimeout": PROVIDER_TIMEOUT_MS},
            "models": {model: {"name": model}},
        }},
        "model": f"{PROVIDER}/{model}",
        "autoupdate": False,
        "share": "disabled",
        "snapshot": False,
        "agent": {"title": {"disable": True}},
        # task (opencode's sub-agents) is denied, which takes it off the tool list: ov agents delegate with
        # `ov sling`. Everything else runs unasked; `ov guard` judges each call (the plugin).
        "permission": {"bash": "allow", "edit": "allow", "external_directory": "allow", "task": "deny"},
    }


class OpenCodeRuntime(Runtime):
    name = "opencode"
    own_agent_tools = "OpenCode's own sub-agents (the task tool, which is off)"
    tool_hooks = frozenset({"pre"})  # receipts come from the stream, found by the plugin's callID
    usage_during_turn = True  # each step_finish carries the step's tokens and cost
    credential_vars = ("OPENAI_API_KEY",)  # `ov resume` after an auth park takes a fixed key from the operator
    instructions_file = "AGENTS.md"  # in opencode's ov-owned config dir, not the worktree
    protocols = ("openai-chat",)

    def _bin(self, config: Config | None) -> str:
        return config.runtime.opencode_bin if config is not None else os.environ.get("OV_RUNTIME_OPENCODE_BIN",
                                                                                     "opencode")

    def program(self, config: Config) -> list[str]:
        found = find_program(self._bin(config))
        if found is None:
            raise RuntimeNotAvailable(f"the opencode runtime needs `{self._bin(config)}` on PATH: npm install -g "
                                      f"{PACKAGE} (or set runtime.opencode_bin)")
        return [found]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        argv = [*self.program(config), "run", "--format", "json"]
        if request.model:
            argv += ["--model", f"{PROVIDER}/{request.model}"]
        if request.resume_session_id:
            argv += ["--session", request.resume_session_id]
        return argv

    def stdin_message(self, prompt: str) -> bytes:
        return prompt.encode("utf-8")

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.opencode.stream import OpenCodeTurnStream

        return OpenCodeTurnStream()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {BASE_URL_ENV: base_url, KEY_ENV: api_key}

    def inherited_env(self, environ: t.Mapping[str, str]) -> dict[str, str]:
        # OPENCODE_PURE would switch off ov's guard plugin; XDG_* and HOME are replaced below.
        env = {k: v for k, v in environ.items() if not k.startswith(("OPENCODE", "XDG_"))}
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
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        }

    def state_files(self, setup: AgentSetup) -> dict[str, str] | None:
        if not setup.model:
            raise UsageError("the opencode runtime needs a model: ov sling --model, config models.<capability> "
                             "or runtime.model")
        plugin_package = {"@opencode-ai/plugin": "*"}
        return {
            "home/.keep": "",
            "config/opencode/opencode.json": json.dumps(opencode_json(setup.model), indent=2),
            "config/opencode/AGENTS.md": setup.instructions,
            "config/opencode/plugins/ov-guard.js": PLUGIN % {"command": json.dumps(guard_hook_command(setup.ov_command)),
                                                             "timeout": GUARD_TIMEOUT_MS},
            "config/opencode/package.json": json.dumps({"dependencies": plugin_package}, indent=2),
            "config/opencode/package-lock.json": json.dumps(
                {"lockfileVersion": 3, "packages": {"": {"dependencies": plugin_package}}}, indent=2),
            "config/opencode/node_modules/.keep": "",
        }

    def probe(self, config: Config | None) -> RuntimeProbe:
        if os.environ.get("OPENAI_API_KEY"):
            credentials = "OPENAI_API_KEY set"
        elif config is not None and any(p.protocol == "openai-chat" for p in config.providers.values()):
            credentials = "no OPENAI_API_KEY; an openai-chat provider is configured"
        else:
            credentials = "no OPENAI_API_KEY (and no openai-chat provider in config)"
        with tempfile.TemporaryDirectory(prefix="ov-opencode-probe-") as scratch:
            env = {**self.inherited_env(os.environ), **self.turn_env(Path(scratch))}
            return probe_program(self.name, self._bin(config), env=env, credentials=credentials, package=PACKAGE,
                                 hint_key="opencode_bin")
