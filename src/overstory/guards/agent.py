"""Who is asking and where it may write: capabilities and the agent's path model.

An ``_Agent`` is built from the ``OVERSTORY_*`` environment of the hook. It resolves
paths to real paths (``~``, ``..``, symlinks, globs) and says why a write to a path is
refused, if it is. The words it gets are already expanded by the shell walker, so a
``$`` here is a literal character; a value that cannot be known before the command runs
holds the ``_SUBST`` marker. The refusal texts are shown to the model, so they say what
to do instead.
"""

from __future__ import annotations

import os

from overstory.capabilities import READ_ONLY as READ_ONLY_CAPABILITIES
from overstory.capabilities import WRITERS as WRITE_CAPABILITIES
from overstory.guards.shell import _SUBST

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

_MAX_GLOB_MATCHES = 2000
_PATH_MAX = 4096  # the kernel refuses longer paths: a `cd` there fails
_CACHE_SIZE = 8192
_SCOPE_ENV = "OVERSTORY_WRITE_SCOPE"  # guards.scope.ENV: scope.py is imported only for an agent that has one


def _real(path: str) -> str:
    return os.path.realpath(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class _Agent:
    """The agent asking: name, capability, its worktree and project, its environment."""

    __slots__ = (
        "capability",
        "env",
        "name",
        "project_root",
        "real_dirs",
        "scope",
        "temp_dirs",
        "worktree",
        "writable",
    )

    def __init__(self, name: str, capability: str, writable: bool, worktree: str | None,
                 project_root: str | None, env: Mapping[str, str], temp_dirs: tuple[str, ...]) -> None:
        self.name = name
        self.capability = capability
        self.writable = writable
        self.worktree = worktree
        self.project_root = project_root
        self.env = env
        self.temp_dirs = temp_dirs
        self.real_dirs: dict[str, str] = {}  # realpath answers for this one hook call
        # Its write scope inside the worktree (`ov sling --files`); empty: the whole worktree.
        self.scope: list[str] = []
        if env.get(_SCOPE_ENV):
            from overstory.guards import scope as write_scope

            self.scope = write_scope.from_env(env[_SCOPE_ENV])

    def __repr__(self) -> str:
        return f"_Agent({self.name!r}, {self.capability!r}, worktree={self.worktree!r})"

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

    @property
    def home_area(self) -> str | None:
        """Where this agent works: its worktree, or the project root when it has none."""
        return self.worktree or self.project_root

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
        """Resolve a path to a real absolute path, or None when it cannot be known.

        ``word`` is literal (the walker has expanded it): only a leading ``~``/``~/`` is
        read as the home directory, for paths from file tools.
        """
        if _SUBST in word or not word:
            return None
        if word == "~" or word.startswith("~/"):
            home = self.env.get("HOME")
            if not home:
                return None
            word = home + word[1:]
        if not os.path.isabs(word):
            if cwd is None:
                return None
            word = os.path.join(cwd, word)
        return self._realpath(word)

    def _realpath(self, path: str) -> str:
        """``os.path.realpath``, with what is already resolved remembered: a long command
        naming many files in a few directories (or ``cd a && cd a && …``) costs one
        ``lstat`` per new name instead of one per path component."""
        if len(path) > _PATH_MAX:
            return _real(path)
        head, tail = os.path.split(path)
        if not tail or tail in (".", "..") or not head:
            return _real(path)
        joined = os.path.join(self._real_dir(head), tail)
        real = _real(joined) if os.path.islink(joined) else joined
        if len(self.real_dirs) < _CACHE_SIZE:
            self.real_dirs[path] = real
        return real

    def _real_dir(self, head: str) -> str:
        cached = self.real_dirs.get(head)
        if cached is not None:
            return cached
        parent, name = os.path.split(head)
        known = self.real_dirs.get(parent)
        if known is not None and name not in ("", ".", ".."):
            joined = os.path.join(known, name)
            cached = _real(joined) if os.path.islink(joined) else joined
        else:
            cached = _real(head)
        if len(self.real_dirs) < _CACHE_SIZE:
            self.real_dirs[head] = cached
        return cached

    @staticmethod
    def is_relative(word: str) -> bool:
        return bool(word) and not word.startswith(("/", "~")) and _SUBST not in word

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

    def place(self, path: str) -> str | None:
        """Why ``path`` is not this agent's to touch (a phrase), or None when it is."""
        other = self.other_worktree(path)
        if other is not None:
            return f"inside {other}'s worktree"
        if self.overstory_dir and _inside(path, self.overstory_dir) and not self._in_own_worktree(path):
            return f"in ov's own state under {self.overstory_dir}"
        if self.worktree and _inside(path, self.worktree):
            return None
        if self.project_root and _inside(path, self.project_root):
            if self.worktree is None:
                return None  # an agent without a worktree (the coordinator) works at the root
            return f"in the project checkout {self.project_root}"
        return "outside its worktree"

    def write_denial(self, word: str, cwd: str | None, *, removes: bool = False) -> str | None:
        """Why a write to ``word`` is refused, or None when it is allowed (or unknowable)."""
        if word in _NULL_SINKS or word.startswith("/dev/fd/"):
            return None
        if cwd is None and self.is_relative(word):
            return (
                f"ov guard cannot tell which directory `{word}` is relative to: an earlier `cd` "
                "in this command may or may not have taken effect (inside `( )`, after `||`, "
                "a loop, `cd -`, a computed directory …). Use an absolute path, or run the "
                "`cd` as a command of its own first."
            )
        if any(c in word for c in "*?[") and _SUBST not in word:
            reason = self._glob_denial(word, cwd, removes=removes)
            if reason:
                return reason
        path = self.expand(word, cwd)
        if path is None:
            return None
        return self.path_denial(word, path, removes=removes)

    def _glob_denial(self, word: str, cwd: str | None, *, removes: bool) -> str | None:
        """A write through a glob writes what it matches now: check every match."""
        import glob

        pattern = word if os.path.isabs(word) or cwd is None else os.path.join(cwd, word)
        if word.startswith("~"):
            home = self.env.get("HOME")
            if not home:
                return None
            pattern = home + word[1:]
        matches = []
        for match in glob.iglob(pattern, include_hidden=True):
            matches.append(match)
            if len(matches) > _MAX_GLOB_MATCHES:
                return (f"`{word}` matches more than {_MAX_GLOB_MATCHES} files, too many to check; "
                        "narrow the pattern.")
        for match in matches:
            reason = self.path_denial(word, self._realpath(match), removes=removes)
            if reason:
                return reason
        return None

    def path_denial(self, word: str, path: str, *, removes: bool = False) -> str | None:
        shown = word if word == path else f"`{word}` ({path})"
        parent, base = os.path.split(path)
        if os.path.basename(parent) == ".claude" and base in _HOOK_SETTINGS:
            return (
                f"{shown} holds the Claude hook settings that run `ov guard`; ov manages "
                "them and no agent may change them."
            )
        if removes and self.hook_settings_inside(path):
            return (
                f"removing or moving {shown} would delete the Claude hook settings that run "
                "`ov guard` (.claude/settings*.json); ov manages them and no agent may change them."
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
            return self.scope_denial(shown, path, removes=removes)
        if self.project_root and _inside(path, self.project_root):
            return (
                f"{shown} is in the project checkout {self.project_root}; {self.who} may only "
                f"write inside {self._own()}. Your branch {self.own_branch} reaches the project "
                "through `ov merge`."
            )
        if path in _NULL_SINKS or any(_inside(path, t) for t in self.temp_dirs):
            return None
        return f"{self.who} may only write inside {self._own()}; {shown} is outside it."

    def scope_denial(self, shown: str, path: str, *, removes: bool = False) -> str | None:
        """Why ``path`` (inside the worktree) is outside this agent's write scope, or None."""
        if not self.scope or not self.worktree or path == self.worktree and not removes:
            return None
        from overstory.guards import scope as write_scope

        relative = os.path.relpath(path, self.worktree).replace(os.sep, "/")
        if write_scope.matches(self.scope, relative):
            return None
        if not removes and not os.path.lexists(path) and write_scope.leads_to(self.scope, relative):
            return None  # a new directory on the way to the scope (mkdir -p src/calc)
        parent = self.env.get("OVERSTORY_PARENT") or "operator"
        return (
            f"{shown} is outside {self.name}'s write scope ({write_scope.describe(self.scope)}), "
            f"set by `ov sling --files`: it may change only those paths (reading anything is fine). "
            f"If {relative} must change, ask {parent} with `ov mail send --to {parent} --type question`; "
            "another builder may own it."
        )

    def hook_settings_inside(self, path: str) -> bool:
        """Does ``path`` (a directory about to be removed) hold this worktree's hook settings?"""
        if not self.worktree or not _inside(os.path.join(self.worktree, ".claude"), path):
            return False
        return any(os.path.lexists(os.path.join(self.worktree, ".claude", f)) for f in _HOOK_SETTINGS)

    def _own(self) -> str:
        return f"its worktree {self.worktree}" if self.worktree else (
            "its worktree (none is set: OVERSTORY_WORKTREE is missing, so only the temp dir "
            "is writable)"
        )

    def protected_zone_denial(self, words: Iterable[str], cwd: str | None) -> str | None:
        """For commands we cannot model: refuse arguments that name places it does not own
        (other worktrees, ov's state, the project checkout), since the command may write there.
        """
        if not self.project_root:
            return None
        for word in words:
            value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
            if "/" not in value and not value.startswith((".", "~")):
                continue
            path = self.expand(value, cwd)
            if path is None or not _inside(path, self.project_root):
                continue
            if self._in_own_worktree(path) or (self.worktree and _inside(path, self.worktree)):
                continue
            reason = self.path_denial(value, path)
            if reason:
                return f"ov cannot tell whether this command writes to its arguments: {reason}"
        return None


_NULL_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_HOOK_SETTINGS = frozenset({"settings.json", "settings.local.json"})
