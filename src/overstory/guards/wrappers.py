"""Handlers for commands that run other commands: shells, eval, xargs, env, timeout ….

They return the inner command (``inner``) or script text (``scripts``) for the policy to
check in turn, or refuse outright (sudo and friends, schedulers that run commands
outside the turn). Shells without ``-c``, ``source`` and ``.`` run script files, which
cannot be looked into: those count as code. Wrappers that detach or lock (``setsid``,
``flock``, ``coproc``, ``script``) are seen through for writers but refused for
read-only agents, whose commands must be positively read-only.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _Agent
from overstory.guards.chars import is_assignment, is_negative_number_option
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _values,
)
from overstory.guards.shell import _SUBST

_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish", "ash", "mksh", "yash"})

_XARGS_VALUE = ("-I", "-n", "-P", "-L", "-s", "-d", "-E", "-a", "--arg-file", "--delimiter",
                "--max-args", "--max-procs", "--max-chars", "--process-slot-var")


def _xargs(argv: list[str], *_rest: object) -> _Effect:
    options, command = _parse_options(argv[1:], _XARGS_VALUE, stop_at_positional=True)
    if not command:
        return _READ
    replace = _values(options, "-I", "--replace") or (
        ["{}"] if _names(options) & {"-i", "--replace"} else [])
    if replace:  # the input replaces this string: its value cannot be known
        command = [a.replace(replace[-1], _SUBST) for a in command]
    else:
        command = [*command, _SUBST]  # the input is appended as more arguments
    if os.path.basename(command[0]) in _SHELLS and any(
            a.startswith("-") and "c" in a for a in command[1:2]):
        script = command[2:3]
        if not script or _SUBST in script[0]:
            return _Effect("code", what="`xargs` feeding its input to a shell as code")
    return _Effect("read", inner=[command])


def _shell(argv: list[str], *_rest: object) -> _Effect:
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
        if not rest:
            return _Effect("code", what="a shell reading its script from elsewhere")
        return _Effect("read", scripts=rest[:1])
    if "n" in flags:
        return _READ  # syntax check only
    return _Effect("code", what=f"a shell script with `{os.path.basename(argv[0])}`")


def _trap(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:])
    if _names(options) & {"-p", "-l"} or len(positionals) < 2:
        return _READ
    return _Effect("read", scripts=positionals[:1])


def _eval(argv: list[str], *_rest: object) -> _Effect:
    if not argv[1:]:
        return _READ
    return _Effect("read", scripts=[" ".join(argv[1:])], opaque=True)


def _exec(argv: list[str], *_rest: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-a",), stop_at_positional=True)
    clear = "-c" in _names(options)
    return _Effect("read", inner=[rest] if rest else [], env_clear=clear)


def _source(argv: list[str], *_rest: object) -> _Effect:
    return _Effect("code", what="`source`, which runs a script", opaque=True)


def _privileged(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    return _Effect("deny", reason=f"{agent.who} may not use `{os.path.basename(argv[0])}`: "
                   "agents run unprivileged. Ask your parent with `ov mail send`.")


def _outside_the_turn(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    return _Effect("deny", reason=(
        f"{agent.who} may not use `{os.path.basename(argv[0])}`: it runs commands outside this "
        "turn, where ov can neither see nor stop them. Run the command directly."))


def _killers(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    return _Effect("deny", reason=(
        f"{agent.who} may not use `{os.path.basename(argv[0])}`: matching processes by name can "
        "stop other agents or ov itself. Use `kill` with the PID of a process you started "
        "(`$!`), or `ov stop` for agents."))


def _tmux_like(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    args = argv[1:]
    sub = next((a for a in args if not a.startswith("-")), "")
    if os.path.basename(argv[0]) == "tmux" and (
            sub.startswith(("list-", "ls", "show-", "has-")) or (
            sub in ("display-message", "display", "capture-pane", "capturep") and "-p" in args)):
        return _READ
    if os.path.basename(argv[0]) == "screen" and args[:1] in (["-ls"], ["-list"]):
        return _READ
    return _Effect("deny", reason=(
        f"{agent.who} may not drive `{os.path.basename(argv[0])}` sessions: ov runs agents in "
        "tmux, and commands started there outlive the turn. Run the command directly."))


# ---- wrappers that run another command


def _wrapper(with_value: tuple[str, ...] = (), *, leading_positionals: int = 0,
             outputs: tuple[str, ...] = ()) -> _Handler:
    """A command that runs the rest of its arguments; ``outputs`` are options naming files
    it writes."""

    def handler(argv: list[str], *_rest: object) -> _Effect:
        options, rest = _parse_options(argv[1:], with_value + outputs, stop_at_positional=True)
        rest = rest[leading_positionals:]
        files = [v for v in _values(options, *outputs) if v != "-"]
        what = f"write a file with `{os.path.basename(argv[0])}`" if files else ""
        return _Effect("write" if files else "read", what=what, inner=[rest] if rest else [],
                       targets=files)

    return handler


def _nice(argv: list[str], *_rest: object) -> _Effect:
    args = argv[1:]
    if args and is_negative_number_option(args[0]):  # nice -5
        args = args[1:]
    _, rest = _parse_options(args, ("-n", "--adjustment"), stop_at_positional=True)
    return _Effect("read", inner=[rest]) if rest else _READ


def _env(argv: list[str], *_rest: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-u", "--unset", "-C", "--chdir", "-S",
                                              "--split-string"), stop_at_positional=True)
    assignments: list[tuple[str, str]] = []
    clear = bool(_names(options) & {"-i", "--ignore-environment"})
    if rest[:1] == ["-"]:  # a lone `-` is -i
        clear, rest = True, rest[1:]
    while rest and is_assignment(rest[0]):
        name, _, value = rest[0].partition("=")
        assignments.append((name.split("[", 1)[0].rstrip("+"), value))
        rest = rest[1:]
    chdir = _values(options, "-C", "--chdir")
    split = _values(options, "-S", "--split-string")
    effect = _Effect("read", env=assignments, env_unset=_values(options, "-u", "--unset"),
                     env_clear=clear, chdir=chdir[0] if chdir else None)
    if split:
        effect.scripts = [" ".join(split + rest)]
    elif rest:
        effect.inner = [rest]
    return effect


def _command(argv: list[str], *_rest: object) -> _Effect:
    options, rest = _parse_options(argv[1:], (), stop_at_positional=True)
    if _names(options) & {"-v", "-V"} or not rest:
        return _READ
    return _Effect("read", inner=[rest])


def _watch(argv: list[str], *_rest: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-n", "--interval", "-q", "--equexit"),
                                   stop_at_positional=True)
    if not rest:
        return _READ
    if _names(options) & {"-x", "--exec"}:
        return _Effect("read", inner=[rest])
    return _Effect("read", scripts=[" ".join(rest)])


def _setsid(argv: list[str], *_rest: object) -> _Effect:
    _, rest = _parse_options(argv[1:], (), stop_at_positional=True)
    return _Effect("write", what="start a process in a new session with `setsid` (it can "
                   "outlive the turn)", inner=[rest] if rest else [])


def _flock(argv: list[str], *_rest: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-w", "--timeout", "-E", "--conflict-exit-code",
                                              "-c", "--command"), stop_at_positional=True)
    lock, command = rest[:1], rest[1:]
    effect = _Effect("write", what="take a lock file with `flock`",
                     targets=[f for f in lock if not f.isdigit()])
    scripts = _values(options, "-c", "--command")
    if scripts:
        effect.scripts = scripts[-1:]
    elif command:
        effect.inner = [command]
    return effect


def _coproc(argv: list[str], *_rest: object) -> _Effect:
    args = argv[1:]
    name = "COPROC"
    if len(args) >= 2 and args[1] == "{":
        name, args = args[0], args[2:]
    elif args[:1] == ["{"]:
        args = args[1:]
    return _Effect("write", what="start a background process with `coproc`",
                   inner=[args] if args else [], sets_vars=[name])


def _script(argv: list[str], *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-c", "--command", "-E", "--echo", "-I",
                                                     "--log-in", "-O", "--log-out", "-B",
                                                     "--log-io", "-T", "--log-timing", "-m",
                                                     "--logging-format"))
    files = positionals[:1] + _values(options, "-I", "--log-in", "-O", "--log-out", "-B",
                                      "--log-io", "-T", "--log-timing")
    return _Effect("write", what="record a terminal session with `script`",
                   targets=files, writes_cwd=not files,
                   scripts=_values(options, "-c", "--command")[-1:])


def _crontab(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    if argv[1:] == ["-l"]:
        return _READ
    return _outside_the_turn(argv, agent)


HANDLERS: dict[str, _Handler] = {
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
    "sg": _privileged,
    "newgrp": _privileged,
    "nsenter": _privileged,
    "unshare": _privileged,
    "chroot": _privileged,
    "capsh": _privileged,
    "setpriv": _privileged,
    "systemd-run": _outside_the_turn,
    "at": _outside_the_turn,
    "batch": _outside_the_turn,
    "crontab": _crontab,
    "pkill": _killers,
    "killall": _killers,
    "tmux": _tmux_like,
    "screen": _tmux_like,
    "timeout": _wrapper(("-s", "--signal", "-k", "--kill-after"), leading_positionals=1),
    "nice": _nice,
    "nohup": _wrapper(),
    "time": _wrapper(("-f", "--format"), outputs=("-o", "--output")),
    "stdbuf": _wrapper(("-i", "-o", "-e", "--input", "--output", "--error")),
    "ionice": _wrapper(("-c", "-n", "-t", "--class", "--classdata")),
    "taskset": _wrapper(leading_positionals=1),
    "chrt": _wrapper(leading_positionals=1),
    "prlimit": _wrapper(("-p", "--pid")),
    "builtin": _wrapper(),
    "chronic": _wrapper(),
    "unbuffer": _wrapper(),
    "ifne": _wrapper(),
    "catchsegv": _wrapper(),
    "faketime": _wrapper(("-f",), leading_positionals=1),
    "fakeroot": _wrapper(("-l", "--lib", "--faked", "-i", "-b"), outputs=("-s",)),
    "strace": _wrapper(("-e", "-p", "-s", "-u", "-E", "-a", "-b", "-I", "-P", "-S", "-X"),
                       outputs=("-o",)),
    "ltrace": _wrapper(("-e", "-p", "-s", "-u", "-a", "-A", "-D", "-n", "-x", "-L"),
                       outputs=("-o",)),
    "valgrind": _wrapper(outputs=("--log-file", "--xml-file")),
    "setsid": _setsid,
    "flock": _flock,
    "coproc": _coproc,
    "script": _script,
    "env": _env,
    "command": _command,
    "watch": _watch,
}
for _name in _SHELLS:
    HANDLERS[_name] = _shell
