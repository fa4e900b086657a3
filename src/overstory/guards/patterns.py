"""Tool-call patterns such as ``Bash(git push*)``, ``mcp__*__deploy*`` or ``Write(docs/*)``.

One matcher for every rule that names tool calls: the ledger's classes
(``ledger.side_effects``, ``ledger.read_only``) today, approval rules later.
Standard library only: ``ov guard`` matches on every tool call.

Syntax: ``TOOL`` or ``TOOL(ARGUMENT)``, both shell-style globs (``*``, ``?``,
``[...]``; case-sensitive; ``*`` also matches spaces and slashes).

- ``TOOL`` is matched against the tool name (``Bash``, ``Write``, ``mcp__github__create_issue``).
- ``ARGUMENT`` is matched against the call's *subjects*, and the pattern matches when
  any subject does:

  - shell tools (Bash, Monitor): each simple command of the command line, its words
    joined by single spaces, after leading ``VAR=value`` assignments and wrappers
    (``env``, ``timeout``, ``nohup``, ``nice``, ``time``, ``command``, ``exec``,
    ``sudo``) are dropped, with the program's directory dropped (``/usr/bin/git`` is
    ``git``) and git's global options (``-C dir``, ``-c key=value``…) removed. The
    scripts of ``bash -c``/``sh -c`` are looked into, and so are ``$(...)``
    substitutions. So ``Bash(git push*)`` matches ``cd x && env -i git -C . push``.
    A command line the scanner cannot split is matched whole.
  - other tools: ``file_path``, ``notebook_path``, ``path``, ``url``, ``command``,
    ``pattern`` or ``query`` (the first one present), else the input as stable JSON.
"""

from __future__ import annotations

import os

from overstory import jsontext
from overstory.guards.chars import is_assignment
from overstory.guards.shell import _KEYWORDS, ShellCommand, split_shell

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    import re
    from collections.abc import Iterable, Mapping

SHELL_TOOLS = frozenset({"Bash", "Monitor"})
SUBJECT_KEYS = ("file_path", "notebook_path", "path", "url", "command", "pattern", "query")
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "ash"})
_WRAPPERS = frozenset({"env", "nohup", "nice", "time", "command", "exec", "sudo", "doas", "stdbuf", "ionice"})
_WRAPPER_VALUE_OPTIONS = frozenset({"-n", "-u", "-g", "-o", "-e", "-i", "-c", "-C", "-s", "-k", "--signal",
                                    "--kill-after", "--adjustment", "--user", "--group", "--chdir"})
_GIT_VALUE_OPTIONS = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--config-env",
                                "--super-prefix", "--exec-path"})
_MAX_DEPTH = 4


class _Glob:
    """A compiled glob: plain equality or a prefix test where that is all it says, else a regex.

    The regex is compiled on the first text that starts with the glob's literal head (the part
    before its first wildcard): most calls are ruled out by that alone, and `ov guard` parses
    every default rule on every tool call.
    """

    __slots__ = ("exact", "glob", "head", "prefix", "regex")

    def __init__(self, glob: str) -> None:
        self.exact: str | None = None
        self.prefix: str | None = None
        self.regex: re.Pattern[str] | None = None
        self.glob = glob
        self.head = ""
        wild = [index for index in (glob.find("*"), glob.find("?"), glob.find("[")) if index >= 0]
        if not wild:
            self.exact = glob
        elif (first := min(wild)) == len(glob) - 1 and glob[first] == "*":  # the one wildcard, a star at the end
            self.prefix = glob[:first]
        else:
            self.head = glob[:first]

    def __call__(self, text: str) -> bool:
        if self.exact is not None:
            return text == self.exact
        if self.prefix is not None:
            return text.startswith(self.prefix)
        if not text.startswith(self.head):
            return False
        if self.regex is None:
            import fnmatch
            import re

            self.regex = re.compile(fnmatch.translate(self.glob), re.DOTALL)
        return self.regex.fullmatch(text) is not None


class ToolPattern:
    """One parsed pattern; ``matches`` answers for a whole call. (A plain class: a dataclass costs
    milliseconds to define, and `ov guard` imports this on every tool call.)"""

    __slots__ = ("argument", "text", "tool")

    def __init__(self, text: str, tool: _Glob, argument: _Glob | None) -> None:
        self.text = text
        self.tool = tool
        self.argument = argument

    def __repr__(self) -> str:
        return f"ToolPattern({self.text!r})"

    def tool_matches(self, tool_name: str) -> bool:
        return self.tool(tool_name)

    def subject_matches(self, subject: str) -> bool:
        return self.argument is None or self.argument(subject)

    def matches(self, tool_name: str, tool_input: Mapping[str, object] | None,
                subjects: list[str] | None = None) -> bool:
        if not self.tool_matches(tool_name):
            return False
        if self.argument is None:
            return True
        found = call_subjects(tool_name, tool_input) if subjects is None else subjects
        return any(self.subject_matches(subject) for subject in found)


def parse_pattern(text: str) -> ToolPattern:
    """Parse ``TOOL`` or ``TOOL(ARGUMENT)``; a ValueError says what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("a tool pattern must be a non-empty string such as 'Bash(git push*)'")
    raw = text.strip()
    name, paren, rest = raw.partition("(")
    name = name.strip()
    if not name:
        raise ValueError(f"tool pattern {text!r} names no tool before '('")
    if ")" in name:
        raise ValueError(f"tool pattern {text!r} has ')' without '('")
    argument = None
    if paren:
        if not rest.endswith(")"):
            raise ValueError(f"tool pattern {text!r} must end with ')' after its argument")
        argument = rest[:-1]
        if not argument.strip():
            raise ValueError(f"tool pattern {text!r} has an empty argument: write {name!r} to match every call")
    return ToolPattern(raw, _Glob(name), _Glob(argument) if argument is not None else None)


def parse_patterns(texts: Iterable[str]) -> tuple[ToolPattern, ...]:
    return tuple(parse_pattern(text) for text in texts)


def first_match(patterns: Iterable[ToolPattern], tool_name: str,
                tool_input: Mapping[str, object] | None) -> ToolPattern | None:
    """The first pattern matching the call (subjects are worked out once), or None."""
    subjects: list[str] | None = None
    for pattern in patterns:
        if not pattern.tool_matches(tool_name):
            continue
        if pattern.argument is None:
            return pattern
        if subjects is None:
            subjects = call_subjects(tool_name, tool_input)
        if any(pattern.subject_matches(s) for s in subjects):
            return pattern
    return None


# --------------------------------------------------------------------------- subjects


def call_subjects(tool_name: str, tool_input: Mapping[str, object] | None) -> list[str]:
    """What ``TOOL(ARGUMENT)`` patterns are matched against (see the module docstring)."""
    tool_input = tool_input or {}
    if tool_name in SHELL_TOOLS:
        command = tool_input.get("command")
        return shell_subjects(command) if isinstance(command, str) else []
    for key in SUBJECT_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str):
            return [value]
    return [jsontext.dumps(tool_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)]


def shell_subjects(command: str, depth: int = 0) -> list[str]:
    """Each simple command of a command line as normalized text (see the module docstring).

    A program named with a directory (``./deploy.sh``, ``/usr/bin/git``) gives two subjects:
    as written and by its base name, so both ``Bash(./deploy.sh*)`` and ``Bash(git push*)`` match.
    """
    subjects = []
    for words, _redirects in shell_commands(command, depth):
        subjects.append(" ".join(words))
        if words and os.sep in words[0]:
            subjects.append(" ".join([os.path.basename(words[0]), *words[1:]]))
    return subjects


def shell_commands(command: str, depth: int = 0) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """Each simple command as (normalized words, redirections); the whole line when it cannot be split.

    The program keeps its directory (``./deploy.sh``); ``shell_subjects`` adds the base name.
    """
    try:
        commands = split_shell(command)
    except ValueError:
        return [([command.strip()], [])]
    found: list[tuple[list[str], list[tuple[str, str]]]] = []
    for simple in commands:
        found.extend(_normalized(simple, depth))
    return found


def _normalized(simple: ShellCommand, depth: int) -> list[tuple[list[str], list[tuple[str, str]]]]:
    argv = list(simple.argv)
    while argv and argv[0] in _KEYWORDS:
        argv.pop(0)
    argv = _unwrap(argv)
    if not argv:
        return []
    program = os.path.basename(argv[0]) or argv[0]
    if program in _SHELLS and depth < _MAX_DEPTH:
        script = _shell_script(argv)
        if script is not None:
            return shell_commands(script, depth + 1)
    if program == "git":
        argv = _without_git_globals(argv)
    return [(argv, list(simple.redirects))]


def _unwrap(argv: list[str]) -> list[str]:
    """Drop leading assignments and wrapper programs (with their options)."""
    for _ in range(_MAX_DEPTH * 2):
        while argv and is_assignment(argv[0]):
            argv = argv[1:]
        if not argv:
            return argv
        name = os.path.basename(argv[0])
        if name == "timeout":
            argv = _skip_options(argv[1:])
            argv = argv[1:]  # the duration
        elif name in _WRAPPERS:
            argv = _skip_options(argv[1:])
        else:
            return argv
    return argv


def _skip_options(args: list[str]) -> list[str]:
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        if args[i] == "--":
            return args[i + 1:]
        if args[i] in _WRAPPER_VALUE_OPTIONS:
            i += 1
        i += 1
    return args[i:]


def _shell_script(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-c" or (arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]):
            return argv[i + 1] if i + 1 < len(argv) else None
        if not arg.startswith("-"):
            return None
    return None


def _without_git_globals(argv: list[str]) -> list[str]:
    out = [argv[0]]
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        key, eq, _ = argv[i].partition("=")
        if key in _GIT_VALUE_OPTIONS and not eq:
            i += 1
        i += 1
    return out + argv[i:]
