"""Claude Code's interactive TUI in a tmux pane: its command line and how to read its screen.

Idle means, on the captured screen: the footer (the lines below the prompt box's
lower rule) shows ``bypass permissions on`` and not ``esc to interrupt``, and the
prompt box holds nothing typed (so an operator who is attached and typing is never
interrupted). Anything else (a dialog, a menu, a busy spinner, text in the box) is
not idle. Pure functions apart from ``command``, which looks the program up.
"""

from __future__ import annotations

import re
import typing as t
from pathlib import Path

from overstory import jsontext
from overstory.errors import RuntimeNotAvailable
from overstory.runtimes.base import Blocker, Screen, Tui, find_program

if t.TYPE_CHECKING:
    from overstory.config.model import Config

# Passed on every turn, headless and TUI: only ov's --settings counts. Without --setting-sources "",
# a `disableAllHooks` in any settings file the agent can write (the worktree's .claude/, its config
# dir) turns ov's hooks off in later turns; "" also stops every CLAUDE.md and .mcp.json
# (tests/fixtures/CLAUDE_PROBE_NOTES.md, "Claude Code 2.1.330", A).
SETTING_SOURCES_FLAGS = ["--setting-sources", "", "--strict-mcp-config"]
MARKETPLACE_VAR = "CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL"
# Passed with --settings: without it `--permission-mode bypassPermissions` stops at a warning dialog.
TUI_FLAG_SETTINGS = {"skipDangerousModePermissionPrompt": True}

READY_MARK = "bypass permissions on"
BUSY_MARK = "esc to interrupt"
PROMPT_CHAR = "❯"
_RULE = re.compile(r"^\s*─{8,}\s*$")
# "✻ Pondering… (2s · ↓ 6 tokens)": the busy spinner, which animates without news.
_SPINNER = re.compile(r"^\s*\S\s+[\w' -]+…")

BLOCKERS = (
    # 2.1.330 shows "❯ No, exit" selected above "Yes, I trust this folder", and drops keys typed just
    # after it draws the question: Enter must follow only once the screen shows Yes selected.
    Blocker("trust", ("❯ No, exit", "Yes, I trust this folder"), ("Down",),
            "the TUI asked whether to trust the worktree"),
    Blocker("trust_confirm", ("❯ Yes, I trust this folder",), ("Enter",),
            "the TUI asked whether to trust the worktree"),
    Blocker("bypass_warning", ("Bypass Permissions mode", "Yes, I accept"), None,
            "the TUI stopped at its Bypass Permissions warning although ov passed "
            "skipDangerousModePermissionPrompt; a managed policy may be forcing it"),
    Blocker("api_key", ("Do you want to use this API key?",), None,
            "the TUI asks whether to use the ANTHROPIC_API_KEY of the environment: run `claude` once in a "
            "terminal and answer Yes, then sling again"),
    Blocker("onboarding", ("Choose the text style",), None,
            "the TUI's first-run set-up has not been done on this machine: run `claude` once in a terminal, "
            "then sling again"),
    Blocker("login", ("Select login method",), None,
            "the TUI is not logged in: run `claude` once in a terminal (or set ANTHROPIC_API_KEY), then sling again"),
)


def tui_command(claude_bin: str, model: str | None, *, settings: t.Mapping[str, t.Any] | None = None,
                extra_flags: t.Sequence[str] = ()) -> list[str]:
    """The interactive command line: the headless flags minus ``-p`` and the stream formats.

    ``settings`` (inline JSON for ``--settings``) always includes ``TUI_FLAG_SETTINGS``.
    """
    program = find_program(claude_bin)
    if program is None:
        raise RuntimeNotAvailable(f"tmux mode runs `{claude_bin}` (runtime.claude_bin), which is not on PATH: "
                                  "npm install -g @anthropic-ai/claude-code")
    merged = {**(settings or {}), **TUI_FLAG_SETTINGS}
    argv = [program, "--permission-mode", "bypassPermissions", "--settings", jsontext.dumps(merged)]
    if model:
        argv += ["--model", model]
    return [*argv, *extra_flags]


def read_screen(text: str) -> Screen:
    """Parse a ``capture-pane`` of the TUI (see the module docstring for the rules)."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    input_text: str | None = None
    footer: list[str] = []
    if len(rules) >= 2:
        top, bottom = rules[-2], rules[-1]
        box = lines[top + 1:bottom]
        first = box[0].lstrip() if box else ""
        if first.startswith(PROMPT_CHAR):
            parts = [first[len(PROMPT_CHAR):], *box[1:]]
            input_text = " ".join(part.replace("\u00a0", " ").strip() for part in parts).strip()
        footer = lines[bottom + 1:]
    footer_text = "\n".join(footer)
    ready = READY_MARK in footer_text
    blocker = None
    if not ready:
        blocker = next((b for b in BLOCKERS if all(mark in text for mark in b.marks)), None)
    return Screen(text=text, ready=ready, busy=BUSY_MARK in footer_text, input_text=input_text, blocker=blocker)


def activity_fingerprint(text: str) -> str:
    """A hash of the screen that changes with news, not with the spinner or the footer's timers."""
    lines = text.splitlines()
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    if rules:
        lines = lines[:rules[-1]]
    kept = [re.sub(r"\d+", "#", line.rstrip()) for line in lines if not _SPINNER.match(line)]
    import hashlib  # here: with OpenSSL's libcrypto, not in every agent loop

    return hashlib.sha1("\n".join(kept).encode("utf-8")).hexdigest()


def last_lines(text: str, count: int = 6) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _RULE.match(line)]
    return " | ".join(lines[-count:]) if lines else "(the screen is empty)"


class ClaudeTui(Tui):
    extra_env: t.ClassVar[dict[str, str]] = {MARKETPLACE_VAR: "1"}

    def command(self, config: Config, model: str | None, *, hook_settings: dict[str, t.Any] | None,
                instructions_file: Path | None) -> list[str]:
        flags = list(SETTING_SOURCES_FLAGS)
        if instructions_file is not None and instructions_file.is_file():
            flags += ["--append-system-prompt-file", str(instructions_file)]
        return tui_command(config.runtime.claude_bin, model, settings=hook_settings, extra_flags=flags)

    def read_screen(self, text: str) -> Screen:
        return read_screen(text)

    def activity_fingerprint(self, text: str) -> str:
        return activity_fingerprint(text)

    def last_lines(self, text: str, count: int = 6) -> str:
        return last_lines(text, count)
