"""Programs that change the machine itself rather than files: refused for every agent.

The clock, the host name, mounts, kernel modules and settings, services, users and the
firewall belong to the operator's machine, not to a worktree. A writer may change files in
its worktree; none of these is a file there. The sandbox stops most of them on its own (no
capabilities inside it); this table is what stops them with ``sandbox.mode: off``, and what
tells the agent why. Each program's read-only forms (``date``, ``mount`` with no argument,
``systemctl status``, ``iptables -L`` …) stay allowed.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _Agent
from overstory.guards.effects import _READ, _Effect, _Handler, _names, _parse_options


def _refuse(argv: list[str], agent: _Agent, what: str) -> _Effect:
    return _Effect("deny", reason=(
        f"{agent.who} may not {what} (`{os.path.basename(argv[0])}`): agents change files in their "
        "worktree, never the machine. Ask your parent with `ov mail send` if the task needs it."))


def _date(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-d", "--date", "-f", "--file", "-r", "--reference",
                                           "-s", "--set", "-I"))
    if _names(options) & {"-s", "--set"}:
        return _refuse(argv, agent, "set the system clock")
    return _READ


def _hostname(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-F", "--file"))
    if positionals or _names(options) & {"-F", "--file", "-b", "--boot"}:
        return _refuse(argv, agent, "set the host name")
    return _READ


def _reads_when(first_words: frozenset[str], what: str, *, bare_reads: bool = True) -> _Handler:
    """Read-only when the first non-option word is one of ``first_words`` (or absent, if ``bare_reads``)."""

    def handler(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
        _, positionals = _parse_options(argv[1:])
        if (not positionals and bare_reads) or (positionals and positionals[0] in first_words):
            return _READ
        return _refuse(argv, agent, what)

    return handler


def _reads_with_options(read_options: frozenset[str], what: str, *, bare_reads: bool = True,
                        with_value: tuple[str, ...] = ()) -> _Handler:
    """Read-only when every option is one of ``read_options`` and nothing else is given."""

    def handler(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
        options, positionals = _parse_options(argv[1:], with_value)
        names = _names(options)
        if not argv[1:] and bare_reads:
            return _READ
        if names and names <= read_options and not positionals:
            return _READ
        return _refuse(argv, agent, what)

    return handler


def _always(what: str) -> _Handler:
    def handler(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
        if argv[1:] in (["--help"], ["--version"], ["-h"], ["-V"]):
            return _READ
        return _refuse(argv, agent, what)

    return handler


def _sysctl(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    options, positionals = _parse_options(argv[1:])
    if _names(options) & {"-w", "--write", "-p", "--load", "--system"} or any("=" in word for word in positionals):
        return _refuse(argv, agent, "change kernel settings")
    return _READ


def _service(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    if argv[1:] == ["--status-all"] or (len(argv) == 3 and argv[2] == "status"):
        return _READ
    return _refuse(argv, agent, "start, stop or change services")


_SYSTEMCTL_READS = frozenset({"status", "show", "cat", "is-active", "is-enabled", "is-failed", "list-units",
                              "list-unit-files", "list-timers", "list-sockets", "list-dependencies",
                              "list-jobs", "help"})
_IPTABLES_READS = frozenset({"-L", "--list", "-S", "--list-rules", "-n", "--numeric", "-v", "--verbose",
                             "-t", "--table", "--line-numbers", "-x", "--exact", "-h", "--help", "--version"})

HANDLERS: dict[str, _Handler] = {
    "date": _date,
    "hostname": _hostname,
    "hostnamectl": _reads_when(frozenset({"status"}), "set the host name"),
    "timedatectl": _reads_when(frozenset({"status", "show", "list-timezones", "timesync-status",
                                          "show-timesync"}), "set the system clock"),
    "hwclock": _reads_with_options(frozenset({"-r", "--show", "--get", "--test", "--verbose", "-V",
                                              "--version", "-h", "--help"}), "set the hardware clock",
                                   bare_reads=True),
    "sysctl": _sysctl,
    "mount": _reads_with_options(frozenset({"-l", "--show-labels", "-t", "--types", "-h", "--help",
                                            "-V", "--version"}), "mount file systems", with_value=("-t", "--types")),
    "umount": _always("unmount file systems"),
    "swapon": _reads_with_options(frozenset({"-s", "--summary", "--show", "--noheadings", "--bytes",
                                             "-h", "--help", "-V", "--version"}), "change swap space"),
    "swapoff": _always("change swap space"),
    "modprobe": _always("load or unload kernel modules"),
    "insmod": _always("load kernel modules"),
    "rmmod": _always("unload kernel modules"),
    "reboot": _always("reboot the machine"),
    "shutdown": _always("shut the machine down"),
    "poweroff": _always("power the machine off"),
    "halt": _always("halt the machine"),
    "telinit": _always("change the machine's run level"),
    "systemctl": _reads_when(_SYSTEMCTL_READS, "start, stop or change services"),
    "service": _service,
    "useradd": _always("add users"),
    "userdel": _always("delete users"),
    "usermod": _always("change users"),
    "groupadd": _always("add groups"),
    "groupdel": _always("delete groups"),
    "passwd": _always("change passwords"),
    "chpasswd": _always("change passwords"),
    "iptables": _reads_with_options(_IPTABLES_READS, "change the firewall", bare_reads=False,
                                    with_value=("-t", "--table")),
    "ip6tables": _reads_with_options(_IPTABLES_READS, "change the firewall", bare_reads=False,
                                     with_value=("-t", "--table")),
    "nft": _reads_when(frozenset({"list"}), "change the firewall", bare_reads=False),
}
