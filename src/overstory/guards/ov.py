"""Which ``ov`` commands an agent may run, by capability.

Inside an agent, ``ov`` acts for that agent: mail goes out under its name, ``sling``
makes it the parent. The authenticated endpoint that serves agents' ``ov`` commands
(issue 12 §3) enforces the same rules against the hierarchy; the guard says them first,
in words the model can act on. Reading (status, logs, mail) is open to everyone;
``sling`` (and ``loop``, which slings an agent that works in iterations) checks the caller's
capability and place in the hierarchy itself (only the coordinator and leads, their own
subtree), so the guard passes it on; ``merge`` belongs
to mergers and the
coordinator (its instructions merge finished work), stopping another agent to the
coordinator and leads, nudges to them and monitors, and nobody but the operator removes another agent's worktree
(``ov stop --clean``), purges mail or drives the coordinator (its ``status``, ``check-complete``
and ``output`` are reads). ``--from`` and ``--agent``
may only name the agent itself. ``approve``/``reject`` pass: the command decides only for the
caller's own descendants. A command ov does not list here is refused.
"""

from __future__ import annotations

from overstory.capabilities import MERGERS as _MERGERS
from overstory.capabilities import NUDGERS as _NUDGERS
from overstory.capabilities import STOPPERS as _STOPPERS
from overstory.guards.agent import _Agent
from overstory.guards.effects import _READ, _Effect, _parse_options, _values
from overstory.guards.shell import _SUBST

_READS = frozenset({"status", "logs", "feed", "tree", "config", "doctor", "guard", "diff", "approvals"})
_OPERATOR_ONLY = {
    "init": "sets up a project",
    "watch": "runs the watchdog",
    "watchdog": "runs the watchdog",
    "attach": "attaches a terminal to an agent",
    "demo": "runs a throw-away swarm",
    "clean": "removes what finished agents left behind (worktrees, branches)",
    "serve": "serves ov's HTTP API and dashboard",
    "schedule": "makes work start by itself (schedules and mail triggers)",
}
_VALUE_OPTIONS = ("--to", "--subject", "--body", "--body-file", "--type", "--priority", "--payload",
                  "--reply-to", "--from", "--agent", "--limit", "--thread", "--since", "--name",
                  "--prompt", "--spec", "--files", "--parent", "--runtime", "--model",
                  "--base-branch", "--scenario", "--branch", "--into", "--run", "--kind", "-n",
                  "--older-than", "--timeout", "--until", "--check", "--max-iterations", "--max-usd",
                  "--max-turns", "--max-tool-calls", "--max-wallclock", "--cron", "--on-mail", "--note",
                  "--reason")
#: Options whose value may be computed at run time (message text); any other may not.
_FREE_TEXT = frozenset({"--subject", "--body", "--body-file", "--payload", "--prompt", "--note", "--reason"})


def ov_command(argv: list[str], agent: _Agent, *_rest: object) -> _Effect:
    args = argv[1:]
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if arg in ("-V", "--version", "-h", "--help"):
            return _READ
        if arg in ("-v", "--verbose"):
            i += 1
            continue
        if arg == "--project" or arg.startswith("--project="):
            value = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            if agent.expand(value, None) != agent.project_root:
                return _deny(agent, f"`ov --project {value}` points ov at another project")
            i += 1 if "=" in arg else 2
            continue
        return _deny(agent, f"`ov {arg}` is not an option ov guard knows")
    if i >= len(args):
        return _READ
    sub, rest = args[i], args[i + 1 :]
    if _SUBST in sub:
        return _deny(agent, "an `ov` subcommand computed at run time cannot be checked")
    options, positionals = _parse_options(rest, _VALUE_OPTIONS)
    computed = next((key for key, value in options if value is not None and _SUBST in value
                     and key not in _FREE_TEXT), None)
    # A message id may be looked up at run time (`ov mail reply $(ov mail list … | …)`);
    # any other computed argument could name an agent or turn into an option.
    checked = positionals
    if sub == "mail" and positionals[:1] in (["reply"], ["read"]):
        checked = positionals[:1] + positionals[2:]
    if computed or any(_SUBST in p for p in checked):
        return _deny(agent, f"`ov {sub}` gets {computed or 'an argument'} computed at run time; "
                     "write the value out")
    cap = agent.capability

    if sub in _READS or (sub == "run" and positionals[:1] in ([], ["list"], ["show"])):
        return _READ
    if sub == "coordinator":
        if positionals[:1] in (["status"], ["check-complete"], ["output"]):  # reads: the run's state and report
            return _READ
        return _deny(agent, "`ov coordinator` starts, asks and stops the coordinator for the operator")
    if sub == "mail":
        return _mail(agent, positionals, options)
    if sub == "loop" and positionals[:1] == ["status"]:
        return _READ
    if sub in ("sling", "loop"):
        # `ov sling` itself refuses other capabilities, a --parent outside the caller's part of
        # the hierarchy and too deep a tree (agents.spawn.resolve_parent), in words the model
        # sees: the guard lets it through so that refusal is the one explanation.
        return _READ
    if sub in ("approve", "reject"):
        # Like `ov sling`: the command itself refuses a gate that is not a descendant's
        # (agents.approvals.authorize), and that refusal is what the model should see.
        return _READ
    if sub == "merge":
        if cap not in _MERGERS:
            return _deny(agent, "only mergers and the coordinator merge branches (`ov merge`); tell "
                         "your parent your branch is ready with `ov mail send --type merge_ready`")
        return _READ
    if sub == "stop":
        target = positionals[0] if positionals else ""
        if target and target != agent.name and cap not in _STOPPERS:
            return _deny(agent, f"`ov stop {target}`: only the coordinator and leads stop other agents "
                         "(their own children); ask your parent with `ov mail send`")
        if "--clean" in {key for key, _ in options} and target != agent.name:
            return _deny(agent, f"`ov stop {target} --clean` removes {target}'s worktree and branch; "
                         "only the operator does that, after `ov merge`")
        return _READ
    if sub == "run" and positionals[:1] == ["complete"] and cap == "coordinator":
        return _READ
    if sub == "nudge":
        if cap not in _NUDGERS:
            return _deny(agent, "only the coordinator, leads and monitors nudge agents; send mail "
                         "with `ov mail send` instead")
        return _READ
    if sub in _OPERATOR_ONLY:
        return _deny(agent, f"`ov {sub}` {_OPERATOR_ONLY[sub]}; only the operator runs it")
    return _deny(agent, f"`ov {' '.join([sub, *positionals[:1]])}` is not a command agents may run")


def _mail(agent: _Agent, positionals: list[str], options: list[tuple[str, str | None]]) -> _Effect:
    action = positionals[0] if positionals else ""
    if action in ("send", "reply"):
        sender = _values(options, "--from")
        if sender and sender[-1] != agent.name:
            return _deny(agent, f"`ov mail {action} --from {sender[-1]}` would sign mail as someone "
                         f"else; mail from {agent.name} is signed {agent.name} (leave out --from)")
        return _READ
    if action == "check":
        whose = _values(options, "--agent")
        if whose and whose[-1] != agent.name and "--peek" not in {key for key, _ in options}:
            return _deny(agent, f"`ov mail check --agent {whose[-1]}` would mark {whose[-1]}'s mail "
                         "as read; use `--peek` to look without taking it")
        return _READ
    if action in ("list", "read", ""):
        return _READ
    return _deny(agent, f"`ov mail {action}` is not a mail command agents may run")


def _deny(agent: _Agent, why: str) -> _Effect:
    return _Effect("deny", reason=f"{agent.who} may not run this: {why}.")
