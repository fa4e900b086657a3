"""The ``codex`` runtime: OpenAI's Codex CLI, headless (``codex exec --json``), one process per turn.

Each agent gets its own ``CODEX_HOME`` under ``.overstory/run/<agent>/codex-home``, so the
user's ``~/.codex`` is never read or written. ov writes there the agent's instructions
(``AGENTS.md``, which codex reads as global instructions) and a ``config.toml`` with the
model provider, codex's sandbox profile and the ``ov guard`` hook (see ``home.py``).
The prompt goes on stdin (``-``), which is then closed: codex reads stdin to EOF even
when the prompt is an argument. Facts: tests/fixtures/CODEX_PROBE_NOTES.md.
"""

from __future__ import annotations

import os
import tempfile
import typing as t
from pathlib import Path

from overstory.errors import RuntimeNotAvailable
from overstory.runtimes.base import AgentSetup, Runtime, RuntimeProbe, TurnParser, TurnRequest, find_program
from overstory.runtimes.codex.home import BASE_URL_ENV, KEY_ENV, PROVIDER, config_toml
from overstory.runtimes.common import probe_program, under_temp_dir

if t.TYPE_CHECKING:
    from overstory.config.model import Config

PACKAGE = "@openai/codex"
HOME_DIR = "codex-home"
TMP_DIR = "codex-tmp"
# --dangerously-bypass-hook-trust: in exec, hooks not yet trusted (by hash, in the user's records) are
# skipped silently; ov wrote these hooks itself, into a home only ov writes.
EXEC_FLAGS = ["exec", "--json", "--skip-git-repo-check", "--dangerously-bypass-hook-trust"]


class CodexRuntime(Runtime):
    name = "codex"
    own_agent_tools = "Codex's own sub-agents, or another `codex` process"
    tool_hooks = frozenset({"pre"})  # receipts come from the stream, matched through hook_call
    hook_ids_match = False  # the hook gets the model's call id (call_...), the stream numbers items (item_N)
    credential_vars = ("OPENAI_API_KEY",)  # `ov resume` after an auth park takes a fixed key from the operator
    usage_during_turn = False  # tokens only in the closing turn.completed (docs/budgets.md)
    instructions_file = "AGENTS.md"  # in CODEX_HOME, not the worktree
    protocols = ("openai-responses",)

    def hook_call(self, tool: str, tool_input: dict[str, t.Any]) -> tuple[str, dict[str, t.Any]] | None:
        # Its hook sees a shell command as Bash with the command as the model sent it; the stream's
        # command_execution wraps it in `/bin/bash -lc '...'`, which the parser takes off. An apply_patch
        # reaches the hook as a Bash heredoc but the stream as a file_change: the ledger matches its files
        # (the tool_start's ``paths``) against the patch's instead.
        return ("Bash", tool_input) if tool == "shell" else None

    def _bin(self, config: Config | None) -> str:
        return config.runtime.codex_bin if config is not None else os.environ.get("OV_RUNTIME_CODEX_BIN", "codex")

    def program(self, config: Config) -> list[str]:
        found = find_program(self._bin(config))
        if found is None:
            raise RuntimeNotAvailable(f"the codex runtime needs `{self._bin(config)}` on PATH: npm install -g "
                                      f"{PACKAGE} (or set runtime.codex_bin)")
        return [found]

    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        argv = [*self.program(config), *EXEC_FLAGS]
        if request.sandboxed:
            # Inside ov's sandbox codex's own (bubblewrap) cannot start (no user namespace without capabilities):
            # every command would fail. ov's sandbox takes its place.
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        if request.model:
            argv += ["-m", request.model]
        base_url = request.provider_env.get(BASE_URL_ENV)
        if base_url:
            argv += ["-c", f"model_providers.{PROVIDER}.base_url={_toml_string(base_url)}"]
        if request.resume_session_id:
            argv += ["resume", request.resume_session_id]  # the options above must come before `resume`
        return [*argv, "-"]

    def stdin_message(self, prompt: str) -> bytes:
        return prompt.encode("utf-8")

    def new_parser(self) -> TurnParser:
        from overstory.runtimes.codex.stream import CodexTurnStream

        return CodexTurnStream()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        return {KEY_ENV: api_key, BASE_URL_ENV: base_url}

    def inherited_env(self, environ: t.Mapping[str, str]) -> dict[str, str]:
        # A parent codex exports CODEX_HOME, CODEX_THREAD_ID, ... into its commands: never inherit them.
        env = {k: v for k, v in environ.items() if not k.startswith("CODEX_") and k not in (KEY_ENV, BASE_URL_ENV)}
        if environ.get("OPENAI_API_KEY"):
            env[KEY_ENV] = environ["OPENAI_API_KEY"]  # no provider configured: OpenAI's own endpoint and key
        return env

    def state_dir(self, run_dir: Path) -> Path | None:
        return run_dir / HOME_DIR

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        home = run_dir / HOME_DIR
        env = {"CODEX_HOME": str(home)}
        if under_temp_dir(home):
            # codex will not put its helper binaries (the sandbox launcher) in a CODEX_HOME inside the temp
            # dir, and every sandboxed command then fails: give it a temp dir beside the home instead.
            tmp = run_dir / TMP_DIR
            tmp.mkdir(parents=True, exist_ok=True)
            env["TMPDIR"] = str(tmp)
        return env

    def state_files(self, setup: AgentSetup) -> dict[str, str] | None:
        return {"config.toml": config_toml(setup, setup.run_dir / TMP_DIR), "AGENTS.md": setup.instructions}

    def probe(self, config: Config | None) -> RuntimeProbe:
        if os.environ.get("OPENAI_API_KEY"):
            credentials = "OPENAI_API_KEY set"
        elif config is not None and any(p.protocol == "openai-responses" for p in config.providers.values()):
            credentials = "no OPENAI_API_KEY; an openai-responses provider is configured"
        else:
            credentials = "no OPENAI_API_KEY (and no openai-responses provider in config)"
        with tempfile.TemporaryDirectory(prefix="ov-codex-probe-") as scratch:
            # Without CODEX_HOME even `codex --version` writes ~/.codex.
            env = {**self.inherited_env(os.environ), "CODEX_HOME": scratch}
            return probe_program(self.name, self._bin(config), env=env, credentials=credentials, package=PACKAGE,
                                 hint_key="codex_bin")


def _toml_string(text: str) -> str:
    import json

    return json.dumps(text)
