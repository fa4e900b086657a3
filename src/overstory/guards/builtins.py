"""Readers and shell builtins with one dangerous corner each.

``alias`` definitions and ``hash -p`` make a plain name run another program (``hash -p
/bin/rm ls``), and ``shopt -s expand_aliases``/``cdable_vars`` change what later words
mean: refused for everyone. ``history -w`` writes a file; ``[[ x -eq y ]]`` evaluates
variables' values as arithmetic (where ``a[$(cmd)]`` runs ``cmd``); pagers, ``man``,
``file -C``, ``zstdcat -o``, ``ag``/``ack --pager`` and ``rg --pre`` write files or run
programs. Their ordinary use is read-only.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _Agent
from overstory.guards.chars import is_decimal_number
from overstory.guards.effects import _READ, _Effect, _Handler, _names, _parse_options, _values


def _alias(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    if any("=" in a for a in argv[1:]):
        return _Effect("deny", reason=(f"{agent.who} may not define aliases: an alias makes a name "
                                       "ov checks as one program run another. Write the command out."))
    return _READ


def _hash(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-p",))
    if "-p" in _names(options):
        return _Effect("deny", reason=(f"{agent.who} may not use `hash -p`: it makes a name ov checks "
                                       "as one program run another."))
    return _READ


def _shopt(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, names = _parse_options(argv[1:])
    if "-s" in _names(options) and set(names) & {"expand_aliases", "cdable_vars", "autocd"}:
        return _Effect("deny", reason=(f"{agent.who} may not turn on `{' '.join(names)}`: it changes "
                                       "what later words mean in ways ov does not follow."))
    return _READ


def _history(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-d",))
    if _names(options) & {"-w", "-a", "-r", "-n"}:
        files = positionals or [agent.env.get("HISTFILE") or "~/.bash_history"]
        return _Effect("write", what="write the shell history to a file", targets=files)
    return _READ


_ARITHMETIC_TESTS = frozenset({"-eq", "-ne", "-lt", "-le", "-gt", "-ge"})


def _double_bracket(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    words = argv[1:]
    for index, word in enumerate(words):
        if word in _ARITHMETIC_TESTS:
            operands = words[index - 1 : index] + words[index + 1 : index + 2]
            if not all(is_decimal_number(o, "-") for o in operands):  # -?\d+
                return _Effect("read", unsafe="compare variables with `[[ … -eq … ]]` (bash evaluates "
                               "their values as arithmetic, which can run commands); use `[ … ]`")
    return _READ


def _less(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-o", "-O", "--log-file", "--LOG-FILE", "-k",
                                           "--lesskey-file", "-p", "--pattern", "-t", "--tag",
                                           "-x", "--tabs", "-y", "-z", "-j", "-b", "-h", "-P"))
    logs = _values(options, "-o", "-O", "--log-file", "--LOG-FILE")
    if logs:
        return _Effect("write", what="write a log file with `less -o`", targets=logs)
    if any(a.startswith("+") for a in argv[1:]):
        return _Effect("code", what="`less +command` (less commands can run programs)")
    return _READ


def _man(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-P", "--pager", "-p", "--preprocessor", "-M",
                                           "--manpath", "-C", "--config-file", "-E", "-L", "-m"))
    names = _names(options)
    if names & {"-P", "--pager", "-H", "--html", "-X", "--gxditview", "-C", "--config-file"} or any(
            k.startswith(("--html", "-H")) for k in names):
        return _Effect("code", what="`man` with a pager, browser or config of your choosing")
    return _READ


def _file(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-m", "--magic-file", "-f", "--files-from", "-F",
                                           "--separator", "-P", "--parameter", "-e", "--exclude"))
    if _names(options) & {"-C", "--compile"}:
        return _Effect("write", what="compile a magic file with `file -C`", writes_cwd=True)
    return _READ


def _zstdcat(argv: list[str], *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-o", "--output-dir-flat", "--output-dir-mirror", "-D"))
    outputs = [o for o in _values(options, "-o", "--output-dir-flat", "--output-dir-mirror")
               if o != "-"]
    if outputs:
        return _Effect("write", what="write files with `zstdcat -o`", targets=outputs)
    return _READ


def _pager_option(*options: str) -> _Handler:
    """A searcher whose pager (or output template) option runs a program."""

    def handler(argv: list[str], *_rest: object) -> _Effect:
        for arg in argv[1:]:
            if arg.split("=", 1)[0] in options:
                return _Effect("code", what=f"`{os.path.basename(argv[0])} {arg.split('=', 1)[0]}` "
                               "(it runs a program)")
        return _READ

    return handler


def _ripgrep(argv: list[str], *_rest: object) -> _Effect:
    for arg in argv[1:]:
        if (arg.startswith("--pre") and not arg.startswith("--pre-glob")) or arg.startswith(
                "--hostname-bin"):
            return _Effect("code", what=f"`rg {arg.split('=', 1)[0]}` (it runs a program)")
    return _READ


HANDLERS: dict[str, _Handler] = {
    "alias": _alias,
    "hash": _hash,
    "shopt": _shopt,
    "history": _history,
    "[[": _double_bracket,
    "less": _less,
    "zless": _less,
    "more": _less,
    "man": _man,
    "file": _file,
    "zstdcat": _zstdcat,
    "ag": _pager_option("--pager"),
    "ack": _pager_option("--pager", "--output"),
    "rg": _ripgrep,
}
