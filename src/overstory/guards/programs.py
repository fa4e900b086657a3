"""From a program name to what it does: the handler table and ``_analyze``.

Plain readers (cat, grep, ls …) need no handler: no option of theirs writes a file or
runs a program, whatever their arguments. Every other known program has a handler in a
family module (file tools, text processors, builtins, wrappers, Python, toolchains, git,
ov). ``_FAMILIES`` says which module handles which name, and a module is imported the
first time one of its programs is seen, so `ov guard` compiles only what a command
needs (tests check the table against the modules). Any python/pip version and the other
language runtimes are matched by name; a program nobody knows is ``unknown``.
"""

from __future__ import annotations

import sys

from overstory.guards.agent import _Agent
from overstory.guards.chars import is_pip_program, is_python_program
from overstory.guards.effects import _READ, _VERSION_FLAGS, _Effect, _Handler, _ShellState

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping

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

#: family module -> the programs its HANDLERS table describes
_FAMILIES: dict[str, str] = {
    "builtins": """
        [[ ack ag alias file hash history less man more rg shopt zless zstdcat
    """,
    "filetools": """
        bunzip2 bzip2 chgrp chmod chown cp csplit curl dd find gunzip gzip iconv
        install ln mkdir mkfifo mknod mv patch perl rm rmdir rsync scp shred shuf
        split tee touch tree truncate uniq unlink unxz unzip wget xxd xz yq zstd
    """,
    "git": """
        gh git
    """,
    "machine": """
        date halt hostname hostnamectl hwclock groupadd groupdel insmod ip6tables iptables
        modprobe mount nft passwd chpasswd poweroff reboot rmmod service shutdown swapoff
        swapon sysctl systemctl telinit timedatectl umount useradd userdel usermod
    """,
    "python": """
        pip pip3 py.test pytest python
    """,
    "textproc": """
        awk gawk gsed mawk nawk sed sort tar
    """,
    "toolchains": """
        apk apt apt-cache apt-get aptitude black brew cargo conda dnf dpkg eslint flake8
        gem go isort make mamba micromamba mypy nox npm pacman pipx pnpm port prettier
        pyflakes pylint pyright ruff shellcheck snap tox tsc uv yarn yum zypper
    """,
    "wrappers": """
        . ash at bash batch builtin capsh catchsegv chronic chroot chrt command coproc
        crontab dash doas env eval exec fakeroot faketime fish flock ifne ionice killall
        ksh ltrace mksh newgrp nice nohup nsenter pkexec pkill prlimit runuser screen
        script setpriv setsid sg sh source stdbuf strace su sudo systemd-run taskset
        time timeout tmux trap unbuffer unshare valgrind watch xargs yash zsh
    """,
}
_MODULE_OF = {name: module for module, names in _FAMILIES.items() for name in names.split()}

_INTERPRETERS = frozenset(
    "node nodejs deno bun ruby irb php lua luajit Rscript julia java scala kotlin osascript "
    "tclsh wish guile racket ghci runghc swift".split()
)


def _handler(name: str) -> _Handler | None:
    if name == "ov":
        from overstory.guards.ov import ov_command

        return ov_command
    module = _MODULE_OF.get(name)
    if module is None:
        return None
    full_name = f"overstory.guards.{module}"
    __import__(full_name)  # not importlib.import_module: importlib (with warnings) costs every `ov guard` 0.3 ms
    table: dict[str, _Handler] = sys.modules[full_name].HANDLERS
    return table[name]


def _analyze(
    name: str, argv: list[str], agent: _Agent, state: _ShellState, assignments: Mapping[str, str]
) -> _Effect:
    if name in _PLAIN_READERS or name in _VARIABLE_BUILTINS:
        return _READ
    handler = _handler(name)
    if handler is None and (is_python_program(name) or is_pip_program(name)):  # python3.11, pip3 ...
        handler = _handler("python" if is_python_program(name) else "pip")
    if handler is not None:
        return handler(argv, agent, state, assignments)
    if name in _INTERPRETERS:
        if all(a in _VERSION_FLAGS for a in argv[1:]) and argv[1:]:
            return _READ
        return _Effect("code", what=f"`{name}`")
    return _Effect("unknown")
