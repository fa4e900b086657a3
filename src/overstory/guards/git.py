"""The git rules, and gh's.

Some git commands are refused for every agent whatever its capability (push, hard
reset, rewriting or deleting other branches and tags, worktree management, shared
config and remotes, ``stash clear``). Read-only agents get the read-only forms; writers
may change their own worktree and branch, but not switch it to another branch. ``gh``
may only read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from overstory.guards.agent import _Agent
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _ShellState,
)

_GIT_GLOBAL_VALUE = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace",
                               "--config-env", "--super-prefix", "--list-cmds"})
_GIT_READ = frozenset(
    """
    status log diff show rev-parse blame annotate grep ls-files ls-tree ls-remote cat-file
    describe shortlog merge-base name-rev rev-list show-ref for-each-ref whatchanged
    range-diff diff-tree diff-index diff-files check-ignore check-attr check-ref-format
    count-objects var version help verify-commit verify-tag cherry show-branch merge-tree
    check-mailmap get-tar-commit-id
    """.split()
)
_GIT_RISKY_CONFIG = ("pager", "editor", "alias.", "sshcommand", "external", "textconv",
                     "fsmonitor", "hookspath", "askpass", "credential", "filter.", "program",
                     "command", "proxy", "exec")
_BRANCH_CHANGES = frozenset({"-d", "-D", "--delete", "-f", "--force", "-m", "-M", "--move",
                             "-C", "--copy", "-u", "--set-upstream-to", "--unset-upstream",
                             "--edit-description", "-c"})


def _git(argv: list[str], agent: _Agent, state: _ShellState, assignments: Mapping[str, str]) -> _Effect:
    args = argv[1:]
    directory = state.cwd
    work_tree = assignments.get("GIT_WORK_TREE")
    configs: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, eq, value = args[i].partition("=")
        if key in _GIT_GLOBAL_VALUE and not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        if key == "-C":
            directory = agent.expand(value, directory)
        elif key == "-c":
            configs.append(value)
        elif key == "--work-tree":
            work_tree = value
        elif key in ("--version", "--help", "-h", "--exec-path", "--html-path", "--man-path",
                     "--info-path"):
            return _READ
        i += 1
    if work_tree:
        directory = agent.expand(work_tree, directory)
    if i >= len(args):
        return _READ
    sub, sub_args = args[i], args[i + 1 :]
    options, positionals = _parse_options(sub_args, _GIT_SUB_VALUE)
    flags = _names(options)

    if sub == "push" and configs:
        return _Effect("deny", reason=f"`git -c … push` is refused for every agent: the -c settings could change "
                                      f"where the push goes. Push with `git push REMOTE {agent.own_branch}`.")
    refusal = _git_refusal(sub, sub_args, positionals, flags, agent)
    if refusal:
        return _Effect("deny", reason=refusal)

    if _git_reads(sub, positionals, flags):
        if not agent.writable:
            risky = [c for c in configs
                     if any(r in c.split("=", 1)[0].lower() for r in _GIT_RISKY_CONFIG)]
            if risky:
                return _Effect("code", what=f"`git -c {risky[0]}` (it can run programs)")
            if flags & {"--output", "-o"} and sub in ("diff", "log", "show"):
                return _Effect("write", what=f"write a file with `git {sub} --output`")
            if sub == "grep" and flags & {"-O", "--open-files-in-pager"}:
                return _Effect("code", what="`git grep -O` (it runs a pager program)")
        return _READ

    if not agent.writable:
        return _Effect("write", what=f"run `git {sub}`, which changes the repository")
    if sub in ("checkout", "switch"):
        reason = _git_branch_switch(sub, sub_args, positionals, flags, directory, agent)
        if reason:
            return _Effect("deny", reason=reason)
    return _Effect("write", what=f"git {sub}", targets=[directory] if directory else [])


_GIT_SUB_VALUE = (
    "-m", "--message", "-F", "--file", "-o", "--output", "--format", "--sort", "--points-at",
    "--contains", "--no-contains", "--merged", "--no-merged", "-u", "--set-upstream-to", "-X",
    "--strategy-option", "-s", "--strategy", "--author", "--date", "-S", "--gpg-sign", "--onto",
    "-x", "--exec", "-t", "--track", "--pretty", "-n", "--max-count", "--since", "--until",
    "--grep", "-G", "--depth", "--shallow-since",
)


def _git_reads(sub: str, positionals: list[str], flags: set[str]) -> bool:
    """Is this git subcommand (in this form) read-only?"""
    first = positionals[:1]
    if sub in _GIT_READ:
        return True
    if sub == "branch":
        return not positionals or bool(flags & {"-l", "--list"})
    if sub == "tag":
        return not positionals or bool(flags & {"-l", "--list", "-v", "--verify"})
    if sub == "config":
        return not _git_config_writes(positionals, flags)
    return (sub, first[0] if first else "") in _GIT_READ_FORMS


_GIT_READ_FORMS = frozenset({
    ("stash", "list"), ("stash", "show"), ("remote", ""), ("remote", "show"),
    ("remote", "get-url"), ("worktree", ""), ("worktree", "list"), ("reflog", ""),
    ("reflog", "show"), ("notes", ""), ("notes", "list"), ("notes", "show"),
    ("submodule", ""), ("submodule", "status"), ("submodule", "summary"),
})


def _git_refusal(
    sub: str, sub_args: list[str], positionals: list[str], flags: set[str], agent: _Agent
) -> str | None:
    """Git commands refused for every agent, whatever its capability."""
    own = agent.own_branch
    if sub == "push":
        return _push_refusal(sub_args, agent)
    if sub == "reset" and "--hard" in flags:
        return (
            "`git reset --hard` throws work away and is refused for every agent. Use `git "
            "restore <path>` to undo changes to a file, or `git revert` to undo a commit."
        )
    if (sub == "checkout" and "-B" in flags) or (
        sub == "switch" and flags & {"-C", "--force-create"}
    ):
        return (
            f"`git {sub} {'-B' if sub == 'checkout' else '-C'}` force-resets a branch and is "
            f"refused for every agent. Your work belongs on {own}."
        )
    if (
        sub in ("update-ref", "filter-branch", "filter-repo")
        or (sub == "symbolic-ref" and (len(positionals) >= 2 or flags & {"-d", "--delete"}))
        or (sub == "replace" and not flags & {"-l", "--list"} and (positionals or flags))
    ):
        return f"`git {sub}` rewrites refs directly and is refused for every agent."
    if sub == "branch" and flags & _BRANCH_CHANGES:
        if flags & {"-m", "-M", "--move"}:
            return (
                f"renaming branches is refused: ov tracks your work as {own}, and other "
                "branches belong to other agents or the operator."
            )
        others = [p for p in positionals if p != own]
        if others:
            return (
                f"`git branch {' '.join(sorted(flags & _BRANCH_CHANGES))}` would change "
                f"{', '.join(others)}, which {agent.who} does not own; it may only work on "
                f"{own}. Ask your parent with `ov mail send` if a branch must change."
            )
    if sub == "tag" and flags & {"-d", "--delete", "-f", "--force"}:
        return "deleting or moving tags rewrites shared refs and is refused for every agent."
    if sub == "worktree" and positionals[:1] not in ([], ["list"]):
        return (
            "ov manages git worktrees (`ov sling` creates them, `ov stop`/`ov merge` clean "
            "them up); agents may not add, move or remove them."
        )
    if sub == "stash" and positionals[:1] == ["clear"]:
        return "`git stash clear` drops the stash shared by every worktree; refused."
    if sub == "config" and _git_config_writes(positionals, flags):
        key = next((p for p in positionals if p not in ("set", "unset")), "").lower()
        if not (agent.writable and "--worktree" in flags) or key.startswith(("remote.", "url.", "branch.")):
            return (
                "the repository's git config is shared by every agent and the operator; "
                "agents may not change it (writers may use `git config --worktree`)."
            )
    if sub == "remote" and positionals[:1] not in ([], ["show"], ["get-url"]):
        return "git remotes are shared by every agent and the operator; agents may not change them."
    if sub in ("fetch", "pull"):
        for spec in positionals[1:]:
            destination = spec.lstrip("+").partition(":")[2]
            if destination and not destination.startswith("refs/remotes/"):
                return (
                    f"`git {sub} {spec}` would overwrite the local branch {destination}; "
                    f"agents only update their own branch {own}. Fetch without `:dst`."
                )
    return None


PUSH_REMOTES_ENV = "OVERSTORY_PUSH_REMOTES"
_PUSH_VALUE = ("-o", "--push-option", "--repo", "--receive-pack", "--exec", "--signed", "--recurse-submodules")
_PUSH_HARMLESS = frozenset({"-u", "--set-upstream", "-q", "--quiet", "-v", "--verbose", "-n", "--dry-run",
                            "--porcelain", "--progress", "--no-progress"})


def _push_refusal(sub_args: list[str], agent: _Agent) -> str | None:
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


def _git_config_writes(positionals: list[str], flags: set[str]) -> bool:
    reads = {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l", "--list",
             "--show-origin", "--show-scope", "--get-color", "--get-colorbool", "--name-only"}
    if flags & reads or positionals[:1] in (["get"], ["list"]):
        return False
    writes = {"--unset", "--unset-all", "--add", "--replace-all", "--rename-section",
              "--remove-section", "-e", "--edit"}
    if flags & writes or positionals[:1] in (["set"], ["unset"], ["edit"],
                                             ["rename-section"], ["remove-section"]):
        return True
    return len(positionals) >= 2


def _git_branch_switch(
    sub: str,
    sub_args: list[str],
    positionals: list[str],
    flags: set[str],
    directory: str | None,
    agent: _Agent,
) -> str | None:
    own = agent.own_branch
    reason = (
        f"{agent.who} works on branch {own}; `git {sub}` to another branch would take its "
        f"worktree off that branch. Restore files with `git restore <path>`; look at other "
        f"branches with `git show <branch>:<path>` or `git diff {own}...<branch>`."
    )
    if sub == "switch":
        if flags & {"-c", "--create", "--orphan", "-d", "--detach"}:
            return reason
        return None if positionals in ([], [own]) else reason
    if flags & {"-b", "--orphan", "--detach", "-t", "--track"}:
        return reason
    if "--" in sub_args or flags & {"--ours", "--theirs", "-p", "--patch",
                                    "--pathspec-from-file"}:
        return None
    if not positionals or positionals == [own] or len(positionals) >= 2:
        return None
    base = directory
    if base and os.path.lexists(os.path.join(base, positionals[0])):
        return None
    return reason


def _gh(argv: list[str], agent: _Agent, *_: object) -> _Effect:
    args = argv[1:]
    words = [a for a in args if not a.startswith("-")]
    reads = {("pr", "view"), ("pr", "list"), ("pr", "diff"), ("pr", "status"), ("pr", "checks"),
             ("issue", "view"), ("issue", "list"), ("issue", "status"), ("repo", "view"),
             ("run", "view"), ("run", "list"), ("auth", "status"), ("release", "list"),
             ("release", "view"), ("search", "issues"), ("search", "prs"), ("search", "code")}
    if not words or any(a in _VERSION_FLAGS for a in args[:1]) or tuple(words[:2]) in reads:
        return _READ
    if words[0] == "api" and not {"-X", "--method", "-f", "-F", "--field", "--raw-field",
                                  "--input"} & {a.split("=", 1)[0] for a in args}:
        return _READ
    return _Effect("deny", reason=(
        f"`gh {' '.join(words[:2])}` changes the remote and is refused for every agent; "
        "`ov merge` and the operator handle what leaves this machine. Report with "
        "`ov mail send`."
    ))


GIT_HANDLERS: dict[str, _Handler] = {
    "git": _git,
    "gh": _gh,
}
