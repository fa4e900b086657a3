"""The git rules, and gh's.

Before anything else, whatever changes what git reads, writes or runs is refused for
every agent: the global options ``--exec-path=``, ``--git-dir``, ``--work-tree``,
``-c``, ``--config-env`` …, any option ov does not know, a subcommand that is not a
git command (it may be an alias, and ``alias.x = !cmd`` runs anything), and git run
outside the agent's own worktree (``-C`` or ``cd`` elsewhere: that repository's config
and hooks would run). ``GIT_*`` variables are refused by the shell walker.

Then some git commands are refused for every agent whatever its capability (push, except
a writer's own branch to a configured remote (``guards.push``), hard
reset, rewriting or deleting other branches and tags, worktree management, shared
config and remotes, ``stash clear``, options that run programs). Read-only agents get
the read-only forms; writers may change their own worktree and branch, but not switch
it to another branch. ``gh`` may only read.
"""

from __future__ import annotations

import os

from overstory.guards.agent import _Agent, _inside
from overstory.guards.effects import (
    _READ,
    _VERSION_FLAGS,
    _Effect,
    _Handler,
    _names,
    _parse_options,
    _ShellState,
    _values,
)

TYPE_CHECKING = False  # typing and collections.abc cost `ov guard` milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping


def _push_refusal(args: list[str], agent: _Agent) -> str | None:
    from overstory.guards.push import push_refusal  # only for `git push`: the other git calls do not load it

    return push_refusal(args, agent)


_GIT_COMMANDS = frozenset(
    """
    add am annotate apply archive bisect blame branch bundle cat-file check-attr check-ignore
    check-mailmap check-ref-format checkout checkout-index cherry cherry-pick clean clone
    column commit commit-graph commit-tree config count-objects describe diff diff-files
    diff-index diff-tree difftool fast-export fast-import fetch filter-branch fmt-merge-msg
    for-each-ref for-each-repo format-patch fsck gc get-tar-commit-id grep hash-object help
    hook index-pack init interpret-trailers log ls-files ls-remote ls-tree mailinfo mailsplit
    maintenance merge merge-base merge-file merge-tree mergetool mktag mktree
    multi-pack-index mv name-rev notes pack-objects pack-refs patch-id prune pull push
    range-diff read-tree rebase reflog remote repack replace rerere reset restore rev-list
    rev-parse revert rm shortlog show show-branch show-ref sparse-checkout stash status
    stripspace submodule switch symbolic-ref tag unpack-objects update-index update-ref var
    verify-commit verify-tag version whatchanged worktree write-tree credential
    """.split()
)
_GIT_GLOBAL_FLAGS = frozenset({"-p", "--paginate", "-P", "--no-pager", "--no-replace-objects",
                               "--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs",
                               "--icase-pathspecs", "--no-optional-locks", "--no-advice",
                               "--no-lazy-fetch"})
_GIT_GLOBAL_REFUSED = frozenset({"-c", "--config-env", "--exec-path", "--git-dir", "--work-tree",
                                 "--namespace", "--super-prefix", "--bare", "--attr-source",
                                 "--list-cmds"})
_GIT_READ = frozenset(
    """
    status log diff show rev-parse blame annotate grep ls-files ls-tree ls-remote cat-file
    describe shortlog merge-base name-rev rev-list show-ref for-each-ref whatchanged
    range-diff diff-tree diff-index diff-files check-ignore check-attr check-ref-format
    count-objects var version help verify-commit verify-tag cherry show-branch merge-tree
    check-mailmap get-tar-commit-id
    """.split()
)
_BRANCH_CHANGES = frozenset({"-d", "-D", "--delete", "-f", "--force", "-m", "-M", "--move",
                             "-C", "--copy", "-u", "--set-upstream-to", "--unset-upstream",
                             "--edit-description", "-c"})
#: Config keys a writer may set with `git config --worktree`: none of them runs a program.
_SAFE_CONFIG_PREFIXES = ("user.", "color.", "column.", "advice.", "i18n.", "status.", "log.",
                         "format.", "commit.", "pull.", "rebase.", "merge.conflictstyle",
                         "diff.renames", "diff.algorithm", "init.")
_RISKY_CONFIG = ("pager", "editor", "sshcommand", "external", "textconv", "fsmonitor", "hook",
                 "askpass", "credential", "filter", "program", "command", "cmd", "proxy", "exec",
                 "driver", "helper", "path", "include")
_RUNS_PROGRAMS = frozenset({"--upload-pack", "--receive-pack", "--exec"})


def _git(argv: list[str], agent: _Agent, state: _ShellState, _a: Mapping[str, str]) -> _Effect:
    args = argv[1:]
    directory = state.cwd
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, eq, value = args[i].partition("=")
        if key in ("--version", "--help", "-h", "--html-path", "--man-path", "--info-path") or (
                key == "--exec-path" and not eq and i == len(args) - 1):
            return _READ  # prints something and exits
        if key in _GIT_GLOBAL_REFUSED:
            if key in ("-c", "--config-env") and not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
            shown = f"{key} {value}".strip() if key in ("-c", "--config-env") else args[i]
            return _deny(
                f"`git {shown}` changes which repository, config or programs git uses and is "
                "refused for every agent, before anything else is checked. Run plain `git ...` "
                "inside your worktree."
            )
        if key == "-C":
            if not eq:
                value = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            directory = agent.expand(value, directory)
        elif key not in _GIT_GLOBAL_FLAGS:
            return _deny(f"`git {args[i]}` is not a git option ov guard knows; refused for every agent.")
        i += 1
    if i >= len(args):
        return _READ
    sub, sub_args = args[i], args[i + 1 :]
    if sub not in _GIT_COMMANDS:
        return _deny(
            f"`git {sub}` is not a git command ov guard knows. It may be an alias, and aliases "
            "can run any program; refused for every agent. Spell out the git command."
        )
    if sub in ("version", "help"):
        return _READ
    refusal = _directory_refusal(directory, agent, sub)
    if refusal:
        return _deny(refusal)

    options, positionals = _parse_options(sub_args, _GIT_SUB_VALUE)
    flags = _names(options)
    refusal = (_push_refusal(sub_args, agent) if sub == "push" else _git_refusal(sub, positionals, flags, agent)) \
        or _program_refusal(sub, sub_args, flags)
    if refusal:
        return _deny(refusal)

    outputs = _output_targets(sub, options, positionals, flags)
    scripts, inner = _commands_run(sub, sub_args, options, positionals)
    if _git_reads(sub, positionals, flags) and not outputs:
        if not agent.writable and sub == "grep" and flags & {"-O", "--open-files-in-pager"}:
            return _Effect("code", what="`git grep -O` (it runs a pager program)")
        return _Effect("read", scripts=scripts) if scripts else _READ

    if not agent.writable:
        if outputs:
            return _Effect("write", what=f"write a file with `git {sub} {outputs[0][0]}`")
        return _Effect("write", what=f"run `git {sub}`, which changes the repository")
    if sub in ("checkout", "switch"):
        reason = _git_branch_switch(sub, sub_args, positionals, flags, directory, agent)
        if reason:
            return _deny(reason)
    if sub in ("clean", "stash") and _removes_untracked(sub, positionals, flags) and (
            agent.hook_settings_inside(agent.worktree or "")):
        return _deny(
            f"`git {sub}` here would delete .claude/settings*.json, the hook settings that run "
            "`ov guard`; no agent may remove them. Remove the files you mean with `rm`."
        )
    targets = [directory] if directory else []
    return _Effect("write", what=f"git {sub}", targets=targets + [t for _, t in outputs],
                   chdir=directory, scripts=scripts, inner=inner)


def _deny(reason: str) -> _Effect:
    return _Effect("deny", reason=reason)


def _directory_refusal(directory: str | None, agent: _Agent, sub: str) -> str | None:
    """Git reads the config and runs the hooks of the repository it runs in: only our own."""
    if directory is None:
        return (
            f"ov guard cannot tell which directory `git {sub}` would run in (an earlier `cd` or "
            "`-C` it cannot follow); run git in your worktree without them."
        )
    place = agent.place(directory)
    if place is None or (agent.writable and not _inside(directory, agent.project_root or "\0")
                         and any(_inside(directory, t) for t in agent.temp_dirs)):
        return None
    return (
        f"`git {sub}` would run in {directory}, {place}; {agent.who} runs git only in "
        f"{agent.home_area or 'its worktree'}, because git reads the config and runs the hooks of "
        "the repository it runs in. Look at other work from your own worktree with "
        "`git log <branch>` or `git show <branch>:<path>`."
    )


_GIT_SUB_VALUE = (
    "-m", "--message", "-F", "--file", "-o", "--output", "--format", "--sort", "--points-at",
    "--contains", "--no-contains", "--merged", "--no-merged", "-u", "--set-upstream-to", "-X",
    "--strategy-option", "-s", "--strategy", "--author", "--date", "-S", "--gpg-sign", "--onto",
    "-x", "--exec", "-t", "--track", "--pretty", "-n", "--max-count", "--since", "--until",
    "--grep", "-G", "--depth", "--shallow-since", "--output-directory", "--prefix",
    "--export-marks", "--extcmd", "--upload-pack", "--receive-pack", "--template",
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


def _output_targets(sub: str, options: list[tuple[str, str | None]], positionals: list[str],
                    flags: set[str]) -> list[tuple[str, str]]:
    """Files git writes outside the repository: ``(how, path)``."""
    keys = ["--output", "--output-directory", "--export-marks"]
    if sub in ("format-patch", "archive", "index-pack", "mailsplit"):
        keys.append("-o")
    if sub == "checkout-index":
        keys.append("--prefix")
    found = [(key, value) for key, value in options if key in keys and value]
    if sub == "bundle" and positionals[:1] == ["create"] and len(positionals) > 1:
        found.append(("create", positionals[1]))
    if sub == "merge-file" and positionals and not flags & {"-p", "--stdout"}:
        found.append(("merge-file", positionals[0]))
    if sub in ("clone", "init") and positionals:
        found.append((sub, positionals[-1] if sub == "init" or len(positionals) > 1 else
                      os.path.basename(positionals[0].rstrip("/")).removesuffix(".git") or "."))
    if sub == "interpret-trailers" and "--in-place" in flags:
        found.extend(("--in-place", p) for p in positionals)
    return found


def _commands_run(sub: str, sub_args: list[str], options: list[tuple[str, str | None]],
                  positionals: list[str]) -> tuple[list[str], list[list[str]]]:
    """Shell commands and programs a git subcommand runs itself."""
    if sub == "rebase":
        return _values(options, "-x", "--exec"), []
    if sub in ("difftool", "mergetool"):
        return _values(options, "-x", "--extcmd"), []
    if sub == "grep":  # -O<pager> takes its value attached, or none
        return [a[2:] for a in sub_args if a.startswith("-O") and len(a) > 2] + [
            a.split("=", 1)[1] for a in sub_args if a.startswith("--open-files-in-pager=")], []
    if sub == "bisect" and positionals[:1] == ["run"]:
        start = sub_args.index("run") + 1
        return [], [sub_args[start:]]
    if sub == "submodule" and positionals[:1] == ["foreach"]:
        start = sub_args.index("foreach") + 1
        rest = [a for a in sub_args[start:] if a != "--recursive"]
        return [" ".join(rest)] if rest else [], []
    return [], []


def _program_refusal(sub: str, sub_args: list[str], flags: set[str]) -> str | None:
    """Options that make git run a program named on the command line, or act outside."""
    runs = flags & _RUNS_PROGRAMS
    if sub in ("ls-remote", "clone") and "-u" in flags:
        runs = runs | {"-u"}
    if sub in ("rebase", "difftool", "mergetool", "grep"):
        runs = runs - {"--exec"}
    if runs:
        return (f"`git {sub} {min(runs)}` makes git run a program named on the command line; "
                "refused for every agent.")
    if sub == "apply" and "--unsafe-paths" in flags:
        return "`git apply --unsafe-paths` writes outside the repository; refused for every agent."
    if sub == "for-each-repo" or (sub == "maintenance" and sub_args[:1] != ["run"]):
        return f"`git {sub}` acts on other repositories or the machine's schedule; refused."
    if sub == "credential":
        return "`git credential` talks to the operator's credential store; refused for every agent."
    return None


def _removes_untracked(sub: str, positionals: list[str], flags: set[str]) -> bool:
    if sub == "clean":
        return not flags & {"-n", "--dry-run"}
    return positionals[:1] in ([], ["push"], ["save"]) and bool(
        flags & {"-u", "--include-untracked", "-a", "--all"})


def _git_refusal(sub: str, positionals: list[str], flags: set[str], agent: _Agent) -> str | None:
    """Git commands refused for every agent, whatever its capability."""
    own = agent.own_branch
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
        sub in ("update-ref", "filter-branch")
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
        key = positionals[1] if positionals[:1] in (["set"], ["unset"]) and len(positionals) > 1 else (
            positionals[0] if positionals else "")
        if not (agent.writable and "--worktree" in flags and _safe_config_key(key)
                and not flags & {"-f", "--file", "--global", "--system", "--blob", "-e", "--edit"}):
            return (
                "the repository's git config is shared by every agent and the operator; "
                "agents may not change it (writers may set user.*, color.* and similar display "
                "settings with `git config --worktree`; never core.*, alias.*, include.* or "
                "anything that runs a program)."
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


def _safe_config_key(key: str) -> bool:
    lowered = key.lower()
    return lowered.startswith(_SAFE_CONFIG_PREFIXES) and not any(r in lowered for r in _RISKY_CONFIG)


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


def _gh(argv: list[str], *_rest: object) -> _Effect:
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


HANDLERS: dict[str, _Handler] = {
    "git": _git,
    "gh": _gh,
}
