"""ov's own judgement of an iteration: the check command or a phase's gate, run in the worktree.

The model never runs these for ov: the loop process does, after the iteration's turn,
in the agent's worktree, with a timeout, in a process group of its own (so a hung test
run is stopped whole). Its full output is kept under the agent's logs; the loop keeps
the tail (for the next iteration's message) and a fingerprint of the failure (for
"the same failure again": the exit code and output with times, durations, addresses
and temp paths blanked out).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory.agents.loop_spec import PROGRESS_FILE

TIMED_OUT = 124
_NOISE = [
    re.compile(r"0x[0-9a-fA-F]+"),                                  # addresses
    re.compile(r"\d+(?:\.\d+)?\s*(?:ms|s|sec|secs|seconds|minutes?)\b"),  # durations
    re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?"),  # timestamps
    re.compile(r"\d{2}:\d{2}:\d{2}"),                               # clock times
    re.compile(r"/tmp/\S+|/var/folders/\S+"),                        # temp paths
]


@dataclass(frozen=True)
class CheckResult:
    label: str          # what was checked, for people and the next message
    exit_code: int
    seconds: float
    tail: str           # the end of the output
    fingerprint: str | None  # None when it passed

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


def fingerprint(exit_code: int, output: str) -> str:
    text = output
    for pattern in _NOISE:
        text = pattern.sub("#", text)
    text = " ".join(text.split())
    return hashlib.sha256(f"{exit_code}\n{text}".encode()).hexdigest()[:16]


def run_gate(gate: dict[str, t.Any], worktree: Path, *, timeout: float, tail: int, env: t.Mapping[str, str],
             log_file: Path | None = None) -> CheckResult:
    if gate["kind"] == "files":
        return _count_files(gate, worktree, tail)
    return _run_command(gate["command"], worktree, timeout=timeout, tail=tail, env=env, log_file=log_file)


def _count_files(gate: dict[str, t.Any], worktree: Path, tail: int) -> CheckResult:
    started = time.monotonic()
    matches = sorted(str(p.relative_to(worktree)) for p in worktree.glob(gate["glob"])
                     if p.is_file() and ".git" not in p.relative_to(worktree).parts)
    enough = len(matches) >= int(gate["min"])
    listing = ", ".join(matches[:50]) + (" ..." if len(matches) > 50 else "")
    output = (f"{len(matches)} file(s) match `{gate['glob']}` (the gate needs at least {gate['min']})"
              + (f": {listing}" if matches else ""))
    code = 0 if enough else 1
    label = f"files: {gate['glob']} >= {gate['min']}"
    return CheckResult(label, code, time.monotonic() - started, output[-tail:],
                       None if enough else fingerprint(code, output))


def _run_command(command: str, worktree: Path, *, timeout: float, tail: int, env: t.Mapping[str, str],
                 log_file: Path | None) -> CheckResult:
    started = time.monotonic()
    clean_env = {k: v for k, v in env.items() if not k.startswith("OVERSTORY_")}
    clean_env["PWD"] = str(worktree)
    proc = subprocess.Popen(["/bin/bash", "-c", command], cwd=worktree, env=clean_env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        raw, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
        note = ""
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        raw, _ = proc.communicate()
        code = TIMED_OUT
        note = f"\n[ov] the check was stopped after {timeout:g}s (loop.check_timeout)"
    else:
        _kill_group(proc.pid)  # what it left running in the background goes too
    output = raw.decode("utf-8", errors="replace") + note
    if log_file is not None:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            log_file.write_text(f"$ {command}\n{output}\n[exit {code}]\n", encoding="utf-8")
        except OSError:
            pass
    code = code if code >= 0 else 128 - code  # killed by a signal: the shell's convention
    return CheckResult(command, code, time.monotonic() - started, output[-tail:],
                       None if code == 0 else fingerprint(code, output))


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def progress_text(worktree: Path | None, limit: int = 8000) -> str | None:
    """The progress file the agent keeps (its end, when long); None when there is none."""
    if worktree is None:
        return None
    try:
        text = (worktree / PROGRESS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


def progress_summary(text: str | None) -> str | None:
    """The progress file's summary: its first non-empty line, without markdown heading marks."""
    for line in (text or "").splitlines():
        line = line.strip().lstrip("#").strip()
        if line and line != "[...]":
            return line[:200]
    return None
