"""The small types every command handler shares, and the option parser they use.

A handler looks at one simple command and returns an ``_Effect``: what the command
would do (read, write these paths, run this inner command …). It never decides; the
policy does. The types live here, below the handlers and the policy, so neither
has to import the other to name them.
"""

from __future__ import annotations

from overstory.guards.agent import _Agent

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping


class _ShellState:
    """The working directory a command runs in; None when it cannot be known."""

    __slots__ = ("cwd",)

    def __init__(self, cwd: str | None) -> None:
        self.cwd = cwd


class _Effect:
    """What one simple command does, as far as the policy cares.

    kind: read | test (test runners/linters) | write | code (unknowable code) | install
          (global package install) | unknown | deny (refused for everyone, see reason).
    unsafe: why a read-only agent may not run it even though its kind is read or test
          (an option ov does not know to be read-only, an output file …).
    env / env_unset / env_clear: what a wrapper (``env``) does to the inner command's
          environment, checked like assignments.
    sets_vars: shell variables the command sets to values ov cannot know (``read x``).
    opaque: the command may change anything in the current shell (``eval``, ``source``).

    A plain class, not a dataclass: ``ov guard`` runs once per tool call, and importing
    ``dataclasses`` costs more than everything the guard does for a usual command.
    """

    __slots__ = (
        "chdir",
        "env",
        "env_clear",
        "env_unset",
        "inner",
        "kind",
        "opaque",
        "reason",
        "removes",
        "scripts",
        "sets_vars",
        "targets",
        "unsafe",
        "what",
        "writes_cwd",
    )

    def __init__(self, kind: str, what: str = "", targets: list[str] | None = None, *,
                 writes_cwd: bool = False, removes: bool = False,
                 inner: list[list[str]] | None = None, scripts: list[str] | None = None,
                 chdir: str | None = None, reason: str = "", unsafe: str = "",
                 env: list[tuple[str, str]] | None = None, env_unset: list[str] | None = None,
                 env_clear: bool = False, sets_vars: list[str] | None = None,
                 opaque: bool = False) -> None:
        self.kind = kind
        self.what = what
        self.targets = targets if targets is not None else []
        self.writes_cwd = writes_cwd
        self.removes = removes
        self.inner = inner if inner is not None else []
        self.scripts = scripts if scripts is not None else []
        self.chdir = chdir
        self.reason = reason
        self.unsafe = unsafe
        self.env = env if env is not None else []
        self.env_unset = env_unset if env_unset is not None else []
        self.env_clear = env_clear
        self.sets_vars = sets_vars if sets_vars is not None else []
        self.opaque = opaque

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__ if getattr(self, k))
        return f"_Effect({fields})"


_READ = _Effect("read")

if TYPE_CHECKING:
    _Handler = Callable[[list[str], _Agent, _ShellState, Mapping[str, str]], _Effect]
else:
    _Handler = "_Handler"  # a type for the checker only; the handler modules import the name


def _parse_options(
    args: list[str], with_value: Iterable[str] = (), *, stop_at_positional: bool = False
) -> tuple[list[tuple[str, str | None]], list[str]]:
    """Split command arguments into options ``(name, value)`` and positionals."""
    takes_value = set(with_value)
    options: list[tuple[str, str | None]] = []
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positionals.extend(args[i + 1 :])
            break
        if arg == "-" or not arg.startswith("-"):
            if stop_at_positional:
                positionals.extend(args[i:])
                break
            positionals.append(arg)
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            if eq:
                options.append((key, value))
            elif key in takes_value and i + 1 < len(args):
                options.append((key, args[i + 1]))
                i += 1
            else:
                options.append((key, None))
        else:
            j = 1
            while j < len(arg):
                flag = "-" + arg[j]
                if flag in takes_value:
                    attached = arg[j + 1 :]
                    if attached:
                        options.append((flag, attached))
                    elif i + 1 < len(args):
                        options.append((flag, args[i + 1]))
                        i += 1
                    else:
                        options.append((flag, None))
                    break
                options.append((flag, None))
                j += 1
        i += 1
    return options, positionals


def _names(options: list[tuple[str, str | None]]) -> set[str]:
    return {key for key, _ in options}


def _values(options: list[tuple[str, str | None]], *keys: str) -> list[str]:
    return [value for key, value in options if key in keys and value is not None]


_VERSION_FLAGS = frozenset({"--version", "-V", "-v", "version", "--help", "-h", "help"})
