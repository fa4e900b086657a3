"""Who is asking and where it may write: capabilities and the agent's path model.

An ``_Agent`` is built from the ``OVERSTORY_*`` environment of the hook. It resolves shell
words to real paths (``~``, known ``$VARS``, ``..``, symlinks) and says why a write to a
path is refused, if it is. The refusal texts are shown to the model, so they say what to
do instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from overstory.guards.shell import _SUBST

WRITE_CAPABILITIES = frozenset({"builder", "merger"})
READ_ONLY_CAPABILITIES = frozenset({"coordinator", "lead", "scout", "reviewer", "monitor"})


def _real(path: str) -> str:
    return os.path.realpath(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class _Agent:
    """Who is calling (from the hook's environment) and where it may write."""

    name: str
    capability: str
    writable: bool
    worktree: str | None
    project_root: str | None
    env: Mapping[str, str]
    temp_dirs: tuple[str, ...]

    @classmethod
    def from_env(cls, name: str, env: Mapping[str, str]) -> _Agent:
        capability = env.get("OVERSTORY_CAPABILITY", "").strip().lower()
        worktree = env.get("OVERSTORY_WORKTREE") or None
        root = env.get("OVERSTORY_PROJECT_ROOT") or None
        worktree = _real(worktree) if worktree and os.path.isabs(worktree) else None
        root = _real(root) if root and os.path.isabs(root) else None
        if root is None and worktree is not None:
            parts = worktree.split(os.sep)
            if len(parts) >= 3 and parts[-3:-1] == [".overstory", "worktrees"]:
                root = os.sep.join(parts[:-3]) or os.sep
        temps = {"/tmp", "/var/tmp"}
        for key in ("TMPDIR", "TEMP", "TMP"):
            if env.get(key, "").startswith(os.sep):
                temps.add(env[key])
        temp_dirs = tuple(sorted({_real(t) for t in temps} | temps))
        return cls(
            name=name,
            capability=capability or "unknown",
            writable=capability in WRITE_CAPABILITIES,
            worktree=worktree,
            project_root=root,
            env=env,
            temp_dirs=temp_dirs,
        )

    @property
    def own_branch(self) -> str:
        return self.env.get("OVERSTORY_BRANCH") or f"ov/{self.name}"

    @property
    def who(self) -> str:
        return f"{self.name} ({self.capability})"

    @property
    def overstory_dir(self) -> str | None:
        return os.path.join(self.project_root, ".overstory") if self.project_root else None

    def start_dir(self, hook_input: Mapping[str, object]) -> str | None:
        cwd = hook_input.get("cwd")
        if isinstance(cwd, str) and os.path.isabs(cwd):
            return _real(cwd)
        return self.worktree or self.project_root

    # ---- reasons

    def read_only(self, what: str) -> str:
        unknown = (
            ""
            if self.capability in READ_ONLY_CAPABILITIES
            else f" (capability '{self.capability}' is not a writer, so it is treated as read-only)"
        )
        return (
            f"{self.who} is read-only{unknown}: it may not {what}. Read with Read/Grep/Glob or "
            "read-only shell commands, and report what should change to your parent with "
            "`ov mail send`."
        )

    # ---- paths

    def expand(self, word: str, cwd: str | None) -> str | None:
        """Resolve a shell word to a real absolute path, or None when it cannot be known."""
        if _SUBST in word or "`" in word:
            return None
        if word == "~" or word.startswith("~/"):
            home = self.env.get("HOME")
            if not home:
                return None
            word = home + word[1:]
        elif word.startswith("~"):
            return None
        if "$" in word:
            word = _VAR_RE.sub(lambda m: self._var(m), word)
            if "$" in word:
                return None
        if not word:
            return None
        if not os.path.isabs(word):
            if cwd is None:
                return None
            word = os.path.join(cwd, word)
        return _real(word)

    def _var(self, match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        value = self.env.get(name)
        return value if value is not None else match.group(0)

    def _in_own_worktree(self, path: str) -> bool:
        """Inside our own worktree, when that worktree is one of ov's (not the project root)."""
        if not self.worktree or not self.overstory_dir:
            return False
        worktrees = os.path.join(self.overstory_dir, "worktrees")
        return _inside(self.worktree, worktrees) and self.worktree != worktrees and _inside(
            path, self.worktree
        )

    def other_worktree(self, path: str) -> str | None:
        """The name of the other agent whose worktree holds ``path``, if any."""
        if not self.overstory_dir or self._in_own_worktree(path):
            return None
        worktrees = os.path.join(self.overstory_dir, "worktrees")
        if not _inside(path, worktrees) or path == worktrees:
            return None
        return path[len(worktrees) + 1 :].split(os.sep, 1)[0]

    def write_denial(self, word: str, cwd: str | None, *, removes: bool = False) -> str | None:
        """Why a write to ``word`` is refused, or None when it is allowed (or unknowable)."""
        if word in _NULL_SINKS or word.startswith("/dev/fd/"):
            return None
        path = self.expand(word, cwd)
        if path is None:
            return None
        shown = word if word == path else f"`{word}` ({path})"
        parent, base = os.path.split(path)
        if os.path.basename(parent) == ".claude" and base in _HOOK_SETTINGS:
            return (
                f"{shown} holds the Claude hook settings that run `ov guard`; ov manages "
                "them and no agent may change them."
            )
        if self.overstory_dir and _inside(path, self.overstory_dir) and not self._in_own_worktree(path):
            other = self.other_worktree(path)
            if other is not None:
                return (
                    f"{shown} is inside {other}'s worktree; {self.who} may only write inside "
                    f"{self._own()}. Ask {other} with `ov mail send --to {other}` if it needs "
                    "a change."
                )
            return (
                f"{shown} is ov's own state under {self.overstory_dir}; change it only through "
                "`ov` commands."
            )
        if self.worktree and _inside(path, self.worktree):
            if removes and path == self.worktree:
                return f"{self.who} may not remove or move its own worktree {self.worktree}."
            if _inside(path, os.path.join(self.worktree, ".git")):
                return (
                    f"{shown} is the worktree's git metadata; change it only through git "
                    "commands."
                )
            return None
        if self.project_root and _inside(path, self.project_root):
            return (
                f"{shown} is in the project checkout {self.project_root}; {self.who} may only "
                f"write inside {self._own()}. Your branch {self.own_branch} reaches the project "
                "through `ov merge`."
            )
        if path in _NULL_SINKS or any(_inside(path, t) for t in self.temp_dirs):
            return None
        return f"{self.who} may only write inside {self._own()}; {shown} is outside it."

    def _own(self) -> str:
        return f"its worktree {self.worktree}" if self.worktree else (
            "its worktree (none is set: OVERSTORY_WORKTREE is missing, so only the temp dir "
            "is writable)"
        )

    def protected_zone_denial(self, words: Iterable[str], cwd: str | None) -> str | None:
        """For commands we cannot model: refuse arguments that name other agents' files."""
        if not self.overstory_dir:
            return None
        for word in words:
            value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
            if "/" not in value and not value.startswith((".", "~")):
                continue
            path = self.expand(value, cwd)
            if path is None or not _inside(path, self.overstory_dir):
                continue
            if self._in_own_worktree(path):
                continue
            return self.write_denial(value, cwd)
        return None


_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_NULL_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_HOOK_SETTINGS = frozenset({"settings.json", "settings.local.json"})
