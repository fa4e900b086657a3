"""Pushing: the one narrow exception to "nobody pushes from an ov agent".

A writer (builder, merger) may push its own branch to a remote that config
``guards.push_remotes`` names (the turn runner exports them as ``OVERSTORY_PUSH_REMOTES``),
so that work can leave the machine where a project wants it to, for example to open a
pull request. Nothing else is allowed: see ``push_refusal``. The tool-call ledger makes
such a push a ``side_effect``, so a retried turn does not push twice.
"""

from __future__ import annotations

from overstory.guards.agent import _Agent
from overstory.guards.effects import _names, _parse_options

PUSH_REMOTES_ENV = "OVERSTORY_PUSH_REMOTES"
_PUSH_VALUE = ("-o", "--push-option", "--repo", "--receive-pack", "--exec", "--signed", "--recurse-submodules")
_PUSH_HARMLESS = frozenset({"-u", "--set-upstream", "-q", "--quiet", "-v", "--verbose", "-n", "--dry-run",
                            "--porcelain", "--progress", "--no-progress"})


def push_refusal(sub_args: list[str], agent: _Agent) -> str | None:
    """Writers may push their own branch to a remote named in config ``guards.push_remotes``; nothing else.

    Allowed: ``git push [-u] REMOTE BRANCH`` where BRANCH is the agent's own branch (also
    written ``HEAD``, ``HEAD:BRANCH``, ``BRANCH:BRANCH`` or with ``refs/heads/``). Refused:
    no remotes configured, read-only agents, URLs or unlisted remotes, other branches,
    tags, force (``-f``, ``--force-with-lease``, a ``+`` refspec), deletes, ``--all``,
    ``--mirror``, a bare ``git push``, and every other option.
    """
    own = agent.own_branch
    allowed = [r.strip() for r in agent.env.get(PUSH_REMOTES_ENV, "").split(",") if r.strip()]
    nobody = (
        f"nobody pushes from an ov agent ({agent.who} tried `git push`). Commit on your "
        f"branch {own}; `ov merge` brings it into the project. Tell your parent it is "
        "ready with `ov mail send`."
    )
    if not allowed or not agent.writable:
        return nobody
    options, positionals = _parse_options(sub_args, _PUSH_VALUE)
    others = sorted(_names(options) - _PUSH_HARMLESS)
    how = f"only `git push {allowed[0]} {own}` is allowed ({agent.who} may push its own branch {own} to " \
          f"{', '.join(allowed)}; config guards.push_remotes)"
    if others:
        return f"`git push {' '.join(others)}` is refused for every agent: {how}."
    if len(positionals) != 2:
        return f"name the remote and the branch: {how}."
    remote, refspec = positionals
    if remote not in allowed:
        return f"{remote!r} is not a remote agents may push to: {how}."
    if refspec.startswith("+"):
        return f"force pushes are refused for every agent: {how}."
    source, colon, destination = refspec.partition(":")
    if not source:
        return f"`git push {remote} {refspec}` deletes a remote branch and is refused for every agent: {how}."
    if not colon:
        destination = own if source == "HEAD" else source
    own_names = {own, f"refs/heads/{own}"}
    if source not in own_names | {"HEAD"} or destination not in own_names:
        return f"`git push {remote} {refspec}` would change a branch that is not {agent.who}'s own: {how}."
    return None
