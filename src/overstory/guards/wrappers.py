"""Handlers for commands that run other commands: shells, eval, xargs, env, timeout ….

They return the inner command (``inner``) or script text (``scripts``) for the policy to
check in turn, or refuse outright (sudo and friends). Shells without ``-c``, ``source``
and ``.`` run script files, which cannot be looked into: those count as code.
"""

from __future__ import annotations

import os
import re

from overstory.guards.agent import _Agent
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _values,
)
from overstory.guards.shell import _ASSIGNMENT

_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish", "ash"})

_XARGS_VALUE = ("-I", "-n", "-P", "-L", "-l", "-s", "-d", "-E", "-a", "--arg-file",
                "--delimiter", "--max-args", "--max-procs", "--max-lines", "--replace",
                "--max-chars", "--eof", "--process-slot-var")


def _xargs(argv: list[str], *_: object) -> _Effect:
    _, command = _parse_options(argv[1:], _XARGS_VALUE, stop_at_positional=True)
    return _Effect("read", inner=[command]) if command else _READ


def _shell(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    if len(args) == 1 and args[0] in _VERSION_FLAGS:
        return _READ
    flags = ""
    i = 0
    while i < len(args) and args[i].startswith(("-", "+")) and args[i] not in ("-", "--"):
        arg = args[i]
        if arg in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if not arg.startswith("--"):
            flags += arg[1:]
        i += 1
    rest = args[i:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if "c" in flags:
        return _Effect("read", scripts=rest[:1]) if rest else _READ
    if "n" in flags:
        return _READ  # syntax check only
    return _Effect("code", what=f"a shell script with `{os.path.basename(argv[0])}`")


def _trap(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:])
    if _names(options) & {"-p", "-l"} or len(positionals) < 2:
        return _READ
    return _Effect("read", scripts=positionals[:1])


def _eval(argv: list[str], *_: object) -> _Effect:
    return _Effect("read", scripts=[" ".join(argv[1:])]) if argv[1:] else _READ


def _exec(argv: list[str], *_: object) -> _Effect:
    _, rest = _parse_options(argv[1:], ("-a",), stop_at_positional=True)
    return _Effect("read", inner=[rest]) if rest else _READ


def _source(argv: list[str], *_: object) -> _Effect:
    return _Effect("code", what="`source`, which runs a script")


def _privileged(argv: list[str], agent: _Agent, *_: object) -> _Effect:
    return _Effect("deny", reason=f"{agent.who} may not use `{os.path.basename(argv[0])}`: "
                   "agents run unprivileged. Ask your parent with `ov mail send`.")


# ---- wrappers that run another command


def _wrapper(with_value: tuple[str, ...] = (), *, leading_positionals: int = 0) -> _Handler:
    def handler(argv: list[str], *_: object) -> _Effect:
        _, rest = _parse_options(argv[1:], with_value, stop_at_positional=True)
        rest = rest[leading_positionals:]
        return _Effect("read", inner=[rest]) if rest else _READ

    return handler


def _nice(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    if args and re.match(r"^-\d+$", args[0]):
        args = args[1:]
    _, rest = _parse_options(args, ("-n", "--adjustment"), stop_at_positional=True)
    return _Effect("read", inner=[rest]) if rest else _READ


def _env(argv: list[str], *_: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-u", "--unset", "-C", "--chdir", "-S",
                                              "--split-string"), stop_at_positional=True)
    while rest and _ASSIGNMENT.match(rest[0]):
        rest = rest[1:]
    chdir = _values(options, "-C", "--chdir")
    split = _values(options, "-S", "--split-string")
    scripts = [" ".join(split + rest)] if split else []
    inner = [] if split else [rest]
    if not rest and not split:
        return _READ
    return _Effect("read", inner=inner, scripts=scripts, chdir=chdir[0] if chdir else None)


def _command(argv: list[str], *_: object) -> _Effect:
    options, rest = _parse_options(argv[1:], (), stop_at_positional=True)
    if _names(options) & {"-v", "-V"} or not rest:
        return _READ
    return _Effect("read", inner=[rest])


def _watch(argv: list[str], *_: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-n", "--interval", "-q", "--equexit"),
                                   stop_at_positional=True)
    if not rest:
        return _READ
    if _names(options) & {"-x", "--exec"}:
        return _Effect("read", inner=[rest])
    return _Effect("read", scripts=[" ".join(rest)])


WRAPPER_HANDLERS: dict[str, _Handler] = {
    "trap": _trap,
    "xargs": _xargs,
    "eval": _eval,
    "exec": _exec,
    "source": _source,
    ".": _source,
    "sudo": _privileged,
    "su": _privileged,
    "doas": _privileged,
    "pkexec": _privileged,
    "runuser": _privileged,
    "timeout": _wrapper(("-s", "--signal", "-k", "--kill-after"), leading_positionals=1),
    "nice": _nice,
    "nohup": _wrapper(),
    "time": _wrapper(("-f", "--format", "-o", "--output")),
    "stdbuf": _wrapper(("-i", "-o", "-e", "--input", "--output", "--error")),
    "ionice": _wrapper(("-c", "-n", "-t", "--class", "--classdata")),
    "builtin": _wrapper(),
    "chronic": _wrapper(),
    "unbuffer": _wrapper(),
    "env": _env,
    "command": _command,
    "watch": _watch,
}
for _name in _SHELLS:
    WRAPPER_HANDLERS[_name] = _shell
