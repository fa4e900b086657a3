#!/usr/bin/env python3
"""A stand-in for an interactive coding-agent TUI, for tmux-mode tests.

It draws the parts of Claude Code 2.1.330's screen that ov reads (see
``overstory.runtimes.claude.tui.read_screen``): a prompt box between two ``─`` rules whose
first line is ``❯`` + no-break space + the typed text, and a footer that says
``bypass permissions on`` and, while busy, ``esc to interrupt``. It reads keys from
its terminal, so it only runs inside a pane (tmux gives it one).

Like the real CLI it reads hooks from ``--settings`` (inline JSON or a file) and, unless
``--setting-sources`` excludes it, from ``.claude/settings.local.json`` in its working
directory, and runs the ``SessionStart`` hooks when it starts and the
``UserPromptSubmit`` hooks on every submitted prompt (JSON on stdin); what a hook
prints is recorded as context the "model" saw.

Everything is controlled by the environment (ov passes its own through):

- ``FAKE_TUI_LOG``: a file that gets one JSON line per event (``start`` with argv,
  ``hook``, ``prompt``, ``shell``, ``exit``).
- ``FAKE_TUI_STARTUP``: seconds before the prompt box appears (default 0.2).
- ``FAKE_TUI_DIALOG``: ``trust`` shows Claude's trust question first ("No, exit"
  selected: Down then Enter accepts it, Enter alone exits 1); ``api_key``,
  ``bypass``, ``onboarding`` show that screen and Enter exits 1. The first
  ``FAKE_TUI_DIALOG_DROP`` key presses (default 1) in a dialog are dropped.
- ``FAKE_TUI_EXIT``: exit at once with this status after printing a message.
- ``FAKE_TUI_NEVER_READY``: never show the prompt box.
- ``FAKE_TUI_BUSY``: seconds each prompt keeps it busy (default 0.3).
- ``FAKE_TUI_RULES``: a JSON list of ``{"match": text, "shell": command,
  "busy": seconds, "exit": status, "reply": text}``; the first rule whose
  ``match`` is in a prompt applies (``shell`` runs like a Bash tool call).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import termios
import time
import tty
import typing as t
from pathlib import Path

PROMPT = "❯\u00a0"
EFFORT_LINE = "◐ medium · /effort"  # right-aligned just above the prompt box
READY_FOOTER = "  ⏵⏵ bypass permissions on (shift+tab to cycle) · ← for agents"
BUSY_FOOTER = "  ⏵⏵ bypass permissions on (shift+tab to cycle) · esc to interrupt · ← for agents"

# Start-up dialogs as Claude Code 2.1.330 draws them: a menu without numbers whose first choice
# is selected; Up/Down move the "❯", Enter picks. Only the trust question's "Yes" lets it go on.
DIALOGS: dict[str, tuple[list[str], list[str], list[str]]] = {  # name -> (lines above, choices, lines below)
    "trust": (
        [" Accessing workspace:", "", " Quick safety check: Is this a project you created or one you trust?", "",
         " ⚠ This folder configures hooks that can run commands without asking, declared in "
         ".claude/settings.local.json", ""],
        ["No, exit", "Yes, I trust this folder"], ["", " Enter to confirm · Esc to cancel"],
    ),
    "api_key": (
        ["  Detected a custom API key in your environment", "  Do you want to use this API key?"],
        ["Yes", "No (recommended)"], ["  Enter to confirm · Esc to cancel"],
    ),
    "bypass": (
        ["  WARNING: Claude Code running in Bypass Permissions mode", ""],
        ["No, exit", "Yes, I accept"], ["  Enter to confirm · Esc to cancel"],
    ),
    "onboarding": (
        [" Let's get started.", " Choose the text style that looks best with your terminal"],
        ["Dark mode", "Light mode"], [],
    ),
}
PROCEED = {("trust", "Yes, I trust this folder")}
DOWN_KEYS, UP_KEYS = (b"\x1b[B", b"\x1bOB"), (b"\x1b[A", b"\x1bOA")


def log(event: str, **fields: t.Any) -> None:
    path = os.environ.get("FAKE_TUI_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"event": event, "pid": os.getpid(), "at": time.time(), **fields}) + "\n")


def _option(name: str) -> str | None:
    args = sys.argv[1:]
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def hooks(event: str) -> list[str]:
    documents = []
    given = _option("--settings")
    if given is not None:
        documents.append(given if given.lstrip().startswith("{") else Path(given).read_text(encoding="utf-8"))
    sources = _option("--setting-sources")
    if sources is None or "local" in sources.split(","):
        local = Path(".claude/settings.local.json")
        if local.is_file():
            documents.append(local.read_text(encoding="utf-8"))
    commands = []
    for text in documents:
        try:
            settings = json.loads(text)
        except ValueError:
            continue
        for group in settings.get("hooks", {}).get(event, []):
            commands.extend(hook["command"] for hook in group.get("hooks", []) if hook.get("type") == "command")
    return commands


def run_hooks(event: str, **payload: t.Any) -> list[str]:
    """Run the hooks of ``event``; returns what they printed (the context a model would get)."""
    outputs = []
    document = json.dumps({"session_id": "fake-session", "cwd": os.getcwd(), "hook_event_name": event, **payload})
    for command in hooks(event):
        done = subprocess.run(command, shell=True, input=document, capture_output=True, text=True, timeout=60)
        log("hook", hook=event, command=command, exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr)
        if done.returncode == 0 and done.stdout.strip():
            outputs.append(done.stdout.rstrip())
    return outputs


class Screen:
    def __init__(self) -> None:
        self.history: list[str] = [" Fake TUI (tests/fake_tui.py)", ""]
        self.input = ""
        self.busy_until = 0.0
        self.busy_started = 0.0
        self.ready = False

    @property
    def busy(self) -> bool:
        return time.monotonic() < self.busy_until

    def draw(self, dialog: list[str] | None = None) -> None:
        size = os.get_terminal_size(sys.stdout.fileno())
        width, height = size.columns, size.lines
        lines: list[str]
        if dialog is not None:
            lines = ["─" * width, *dialog]
        elif not self.ready:
            lines = [" starting…"]
        else:
            typed = PROMPT + self.input  # long input wraps inside the box, as in the real TUI
            wrapped = [typed[i:i + width] for i in range(0, len(typed), width)]
            box = [EFFORT_LINE.rjust(width - 2), "─" * width, *wrapped, "─" * width,
                   BUSY_FOOTER if self.busy else READY_FOOTER]
            spinner = [f"✻ Working… ({int(time.monotonic() - self.busy_started)}s)"] if self.busy else []
            room = max(height - len(box) - len(spinner) - 1, 0)
            lines = [*(self.history[-room:] if room else []), *spinner, *box]
        sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(line[:width] for line in lines))
        sys.stdout.flush()


def dialog_lines(name: str, selected: int) -> list[str]:
    above, choices, below = DIALOGS[name]
    menu = [f" {'❯' if i == selected else ' '} {choice}" for i, choice in enumerate(choices)]
    return [*above, *menu, *below]


def dialog_phase(screen: Screen, name: str) -> None:
    """Show a start-up dialog until a choice is picked; only the trust question's Yes lets the program go on.

    The real TUI ignores keys typed in about the first half second after it draws the
    question; to make that deterministic this one drops the first FAKE_TUI_DIALOG_DROP
    key presses (default 1)."""
    choices = DIALOGS[name][1]
    selected = 1 if name == "api_key" else 0  # the real API key question selects "No (recommended)"
    screen.draw(dialog_lines(name, selected))
    to_drop = int(os.environ.get("FAKE_TUI_DIALOG_DROP", "1"))
    while True:
        key = os.read(sys.stdin.fileno(), 64)
        if to_drop > 0:
            to_drop -= 1
            log("dialog_key_dropped", dialog=name, key=key.decode("utf-8", "replace"))
            continue
        if any(k in key for k in DOWN_KEYS):
            selected = min(selected + 1, len(choices) - 1)
        elif any(k in key for k in UP_KEYS):
            selected = max(selected - 1, 0)
        elif b"\r" in key or b"\n" in key:
            log("dialog", dialog=name, answer=choices[selected])
            if (name, choices[selected]) not in PROCEED:
                sys.stdout.write("\x1b[H\x1b[2J exiting\n")
                sys.exit(1)
            return
        screen.draw(dialog_lines(name, selected))


def submit(screen: Screen, prompt: str, rules: list[dict[str, t.Any]]) -> None:
    screen.busy_started = time.monotonic()
    screen.busy_until = screen.busy_started + 3600  # busy from Enter on, as the real TUI shows its spinner
    screen.draw()
    context = run_hooks("UserPromptSubmit", prompt=prompt)
    log("prompt", prompt=prompt, context=context)
    screen.history.append(f"❯ {prompt}")
    busy = float(os.environ.get("FAKE_TUI_BUSY", "0.3"))
    for rule in rules:
        if rule.get("match", "") in prompt:
            if rule.get("shell"):
                done = subprocess.run(rule["shell"], shell=True, capture_output=True, text=True, timeout=60)
                log("shell", command=rule["shell"], exit_code=done.returncode, stdout=done.stdout,
                    stderr=done.stderr)
                screen.history.append(f"● Bash({rule['shell'][:60]})")
            if "exit" in rule:
                log("exit", status=int(rule["exit"]), reason="rule")
                sys.exit(int(rule["exit"]))
            busy = float(rule.get("busy", busy))
            if rule.get("reply"):
                screen.history.append(f"● {rule['reply']}")
            break
    else:
        screen.history.append("● ok")
    screen.busy_until = time.monotonic() + busy


def main() -> int:
    shown = {k: v for k, v in os.environ.items()
             if k.startswith(("OVERSTORY_", "CLAUDE_CODE_", "ANTHROPIC_BASE_URL")) or k in ("IS_SANDBOX", "TERM")}
    log("start", argv=sys.argv[1:], cwd=os.getcwd(), env=shown)
    if os.environ.get("FAKE_TUI_EXIT"):
        status = int(os.environ["FAKE_TUI_EXIT"])
        print(f"fake TUI: cannot start (told to exit {status})", flush=True)
        log("exit", status=status, reason="FAKE_TUI_EXIT")
        return status
    rules = json.loads(os.environ.get("FAKE_TUI_RULES", "[]"))
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    screen = Screen()
    try:
        screen.draw()
        dialog = os.environ.get("FAKE_TUI_DIALOG")
        if dialog:
            dialog_phase(screen, dialog)
            screen.draw()
        time.sleep(float(os.environ.get("FAKE_TUI_STARTUP", "0.2")))
        for text in run_hooks("SessionStart", source="startup"):
            log("context", source="SessionStart", text=text)
        screen.ready = not os.environ.get("FAKE_TUI_NEVER_READY")
        was_busy = False
        while True:
            screen.draw()
            readable, _, _ = select.select([fd], [], [], 0.2)
            if readable:
                chunk = os.read(fd, 4096).decode("utf-8", errors="replace")
                for char in chunk:
                    if char in "\r\n":
                        if screen.input.strip() and screen.ready:
                            prompt, screen.input = screen.input, ""
                            screen.draw()
                            submit(screen, prompt, rules)
                    elif char in "\x7f\b":
                        screen.input = screen.input[:-1]
                    elif char == "\x1b":
                        screen.busy_until = 0.0
                    elif char.isprintable():
                        screen.input += char
            if was_busy and not screen.busy:
                screen.history.append("✻ Done")
            was_busy = screen.busy
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


if __name__ == "__main__":
    sys.exit(main())
