"""From a program name to what it does: the handler table and ``_analyze``.

Plain readers (cat, grep, ls …) need no handler: no option of theirs writes a file or
runs a program, whatever their arguments. Every other known program has one in the
family modules (file tools, wrappers, toolchains, git, ov), merged into ``_HANDLERS``
here. Any python/pip version and the other language runtimes are matched by name; a
program nobody knows is ``unknown``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from overstory.guards.agent import _Agent
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _ShellState,
)
from overstory.guards.builtins import BUILTIN_HANDLERS
from overstory.guards.filetools import FILE_TOOL_HANDLERS
from overstory.guards.git import GIT_HANDLERS
from overstory.guards.ov import ov_command
from overstory.guards.textproc import TEXTPROC_HANDLERS
from overstory.guards.toolchains import TOOLCHAIN_HANDLERS, _pip, _python
from overstory.guards.wrappers import WRAPPER_HANDLERS

#: Read-only whatever their arguments (even ones computed at run time).
_PLAIN_READERS = frozenset(
    """
    cat ls ll dir vdir grep egrep fgrep head tail wc echo pwd which whereis
    type stat du df diff cmp comm cut tr nl od hexdump strings basename dirname
    realpath readlink jq column fold fmt paste join expand unexpand rev tac seq whoami id
    groups uname true false test [ sleep md5sum sha1sum sha224sum sha256sum sha384sum
    sha512sum b2sum cksum sum base32 base64 ps pgrep pidof lsof free uptime nproc
    printenv locale getconf arch lscpu cal bc expr yes look numfmt zcat zgrep bzcat
    xzcat set wait jobs exit return break continue : help printf
    tput tty stty clear umask ulimit unalias
    """.split()
)
#: Shell builtins that only set variables (the walker checks the names): read otherwise.
_VARIABLE_BUILTINS = frozenset(
    "export declare typeset local readonly unset read mapfile readarray getopts let".split()
)

_INTERPRETERS = frozenset(
    "node nodejs deno bun ruby irb php lua luajit Rscript julia java scala kotlin osascript "
    "tclsh wish guile racket ghci runghc swift".split()
)
_PYTHON_RE = re.compile(r"^(python(\d+(\.\d+)?)?|py|pypy3?|ipython3?)$")
_PIP_RE = re.compile(r"^pip(\d+(\.\d+)?)?$")


_HANDLERS: dict[str, _Handler] = {
    **FILE_TOOL_HANDLERS,
    **TEXTPROC_HANDLERS,
    **BUILTIN_HANDLERS,
    **WRAPPER_HANDLERS,
    **TOOLCHAIN_HANDLERS,
    **GIT_HANDLERS,
    "ov": ov_command,
}


def _analyze(
    name: str, argv: list[str], agent: _Agent, state: _ShellState, assignments: Mapping[str, str]
) -> _Effect:
    if name in _PLAIN_READERS or name in _VARIABLE_BUILTINS:
        return _READ
    handler = _HANDLERS.get(name)
    if handler is not None:
        return handler(argv, agent, state, assignments)
    if _PYTHON_RE.match(name):
        return _python(argv, agent, state, assignments)
    if _PIP_RE.match(name):
        return _pip(argv, agent, state, assignments)
    if name in _INTERPRETERS:
        if all(a in _VERSION_FLAGS for a in argv[1:]) and argv[1:]:
            return _READ
        return _Effect("code", what=f"`{name}`")
    return _Effect("unknown")
