"""A thin, explicit wrapper around the git CLI for the merge code.

Every call is ``git <args>`` in one directory with a controlled environment: no editor,
no prompts, C locale (stable messages), and none of the GIT_* variables that would
redirect git to another repository (``ov merge`` may run inside a git hook).
"""

from __future__ import annotations

import os
import subprocess
import typing as t
from pathlib import Path

from overstory.errors import MergeError

# Variables a parent git process (a hook, `git rebase -x`) may export that would make
# our git calls operate on a different repository, index or worktree.
_REDIRECTING_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)

OVERSTORY_DIR = ".overstory"


def unredirected_env() -> dict[str, str]:
    """The environment without the GIT_* variables that point git somewhere else."""
    return {k: v for k, v in os.environ.items() if k not in _REDIRECTING_ENV}


def git_env(extra: t.Mapping[str, str] | None = None) -> dict[str, str]:
    env = unredirected_env()
    env.update(
        GIT_EDITOR="true",
        GIT_SEQUENCE_EDITOR="true",
        GIT_MERGE_AUTOEDIT="no",
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
        LANGUAGE="C",
    )
    if extra:
        env.update(extra)
    return env


class Git:
    """Runs git in ``cwd``. ``read_only`` adds GIT_OPTIONAL_LOCKS=0 (no opportunistic index writes)."""

    def __init__(self, cwd: Path, *, read_only: bool = False, env: t.Mapping[str, str] | None = None) -> None:
        self.cwd = Path(cwd)
        extra = dict(env or {})
        if read_only:
            extra["GIT_OPTIONAL_LOCKS"] = "0"
        self._env = git_env(extra)

    def run(
        self, *args: str, check: bool = True, input: bytes | None = None, pass_fds: t.Sequence[int] = ()
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            ["git", *args],
            cwd=self.cwd,
            env=self._env,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            check=False,
            pass_fds=tuple(pass_fds),
        )
        if check and proc.returncode != 0:
            raise MergeError(
                f"git {' '.join(args)} failed in {self.cwd} (exit {proc.returncode}): {describe(proc)}"
            )
        return proc

    def out(self, *args: str, check: bool = True) -> str:
        """Stdout as text, without the trailing newline."""
        return os.fsdecode(self.run(*args, check=check).stdout).rstrip("\n")

    def ok(self, *args: str) -> bool:
        return self.run(*args, check=False).returncode == 0

    def rev(self, spec: str) -> str | None:
        """The object id ``spec`` names, or None if it names nothing."""
        proc = self.run("rev-parse", "-q", "--verify", spec, check=False)
        return os.fsdecode(proc.stdout).strip() if proc.returncode == 0 else None

    def blob(self, oid: str) -> bytes:
        return self.run("cat-file", "blob", oid).stdout

    def paths(self, *args: str) -> list[str]:
        """Output of a ``-z`` listing command (``diff --name-only -z`` ...) as paths."""
        return [os.fsdecode(p) for p in self.run(*args).stdout.split(b"\0") if p]


def describe(proc: subprocess.CompletedProcess[bytes], limit: int = 2000) -> str:
    text = (os.fsdecode(proc.stderr).strip() or os.fsdecode(proc.stdout).strip()) or "(no output)"
    return text if len(text) <= limit else "..." + text[-limit:]


def is_overstory_path(path: str) -> bool:
    return path == OVERSTORY_DIR or path.startswith(OVERSTORY_DIR + "/")


def parse_stage_entries(raw: bytes) -> dict[str, dict[int, tuple[str, str]]]:
    """Parse ``<mode> <oid> <stage>\\t<path>`` NUL-separated records (``ls-files -u -z``,
    the conflict section of ``merge-tree -z``) into ``{path: {stage: (mode, oid)}}``.

    Parsing stops at the first empty record, which in ``merge-tree -z`` output ends the
    conflicted-file section.
    """
    entries: dict[str, dict[int, tuple[str, str]]] = {}
    for record in raw.split(b"\0"):
        if not record:
            break
        meta, sep, path = record.partition(b"\t")
        parts = meta.split(b" ")
        if not sep or len(parts) != 3 or not parts[2].isdigit():
            break
        mode, oid, stage = (os.fsdecode(p) for p in parts)
        entries.setdefault(os.fsdecode(path), {})[int(stage)] = (mode, oid)
    return entries
