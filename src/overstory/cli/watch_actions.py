"""What the keys of `ov watch` do: each one runs an `ov` command by name.

Commands run as child processes (`python -m overstory`), one at a time, in a background thread, so the screen keeps
refreshing while `ov stop` waits for an agent to go.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import typing as t
from dataclasses import dataclass
from pathlib import Path

ACTION_TIMEOUT = 300.0


def ov_argv(root: Path, args: t.Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "overstory", "--project", str(root), *args]


@dataclass
class Outcome:
    ok: bool
    message: str


def run_command(root: Path, args: t.Sequence[str]) -> Outcome:
    """Run ``ov ARGS`` to completion; its last line of output (or error) is the message."""
    try:
        done = subprocess.run(ov_argv(root, args), capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=ACTION_TIMEOUT)
    except subprocess.TimeoutExpired:
        return Outcome(False, f"`ov {' '.join(args)}` did not finish in {ACTION_TIMEOUT:g}s")
    text = (done.stdout if done.returncode == 0 else done.stderr or done.stdout).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # a usage error prints click's usage lines first and its message last
    message = (lines[0] if done.returncode == 0 else lines[-1]) if lines else f"`ov {args[0]}` exited {done.returncode}"
    return Outcome(done.returncode == 0, message.removeprefix("ov: error: ").removeprefix("Error: "))


def run_foreground(root: Path, args: t.Sequence[str]) -> Outcome:
    """Run ``ov ARGS`` on this terminal (attach): the caller has handed the terminal over."""
    code = subprocess.call(ov_argv(root, args))
    return Outcome(code == 0, f"`ov {' '.join(args)}` exited {code}" if code else f"back from `ov {args[0]}`")


def pending_approval(state_db: Path, agent: str) -> str | None:
    """The id of ``agent``'s pending gate in the ``approvals`` table; None when there is none (or no table)."""
    from overstory.store.approvals import first_pending_of

    try:
        conn = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=2)
        try:
            found = first_pending_of(conn, agent)
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(found) if found else None


class Runner:
    """One action at a time in a background thread; ``poll`` returns its outcome once it is done."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._thread: threading.Thread | None = None
        self._outcome: Outcome | None = None
        self.label = ""

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, label: str, args: t.Sequence[str]) -> bool:
        if self.busy:
            return False
        self.label = label
        self._outcome = None

        def work() -> None:
            try:
                self._outcome = run_command(self.root, args)
            except Exception as exc:  # shown on screen; the dashboard goes on
                self._outcome = Outcome(False, f"{type(exc).__name__}: {exc}")

        self._thread = threading.Thread(target=work, name="ov-watch-action", daemon=True)
        self._thread.start()
        return True

    def poll(self) -> Outcome | None:
        if self._thread is None or self._thread.is_alive():
            return None
        self._thread = None
        return self._outcome

    def wait(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
