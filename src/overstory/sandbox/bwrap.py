"""The bubblewrap command line around one turn (see docs/security.md for the why of each part).

bwrap applies its options left to right, so a mount nested in another comes after it. The
measured facts behind each choice are in the issue 12 notes (rows like K02, F01, A05 are
quoted where they decide something).
"""

from __future__ import annotations

import os
import sys
import typing as t
from pathlib import Path

from overstory.sandbox.layout import OWN_LOGS, OWN_REFS, Layout

GIT_TOP_TMPFS_BYTES = 16 << 20


def _bind(kind: str, path: Path | str) -> list[str]:
    return [kind, str(path), str(path)]


def _resolv_conf_dir() -> Path | None:
    """/etc/resolv.conf may point into /run (systemd-resolved): that dir must survive the /run tmpfs."""
    real = Path(os.path.realpath("/etc/resolv.conf"))
    return real.parent if real.parts[:2] == ("/", "run") and real.exists() else None


def _under_tmp(path: Path) -> bool:
    return len(path.parts) > 2 and path.parts[:2] == ("/", "tmp")


def _host_tmp_paths(root: Path, command: t.Sequence[str]) -> list[str]:
    """What must stay visible (read-only) from the host's /tmp under the private one: the program the
    turn runs and the Python environment ov runs from (an install there: its whole top-level dir,
    symlinks resolved or not), and the project (a checkout there)."""
    import overstory

    shown: list[Path] = []
    programs = [Path(p) for p in command[:1]] + [Path(sys.prefix), Path(overstory.__file__).parent]
    for program in programs:
        for path in (program if program.is_absolute() else Path.cwd() / program, Path(os.path.realpath(program))):
            top = Path(*path.parts[:3])
            if _under_tmp(path) and top not in shown:
                shown.append(top)
    if _under_tmp(root) and not any(p == root or p in root.parents for p in shown):
        shown.append(root)
    return [arg for path in shown for arg in _bind("--ro-bind", path)]


def _machine(tmp_size_mb: int) -> list[str]:
    """The part every sandbox shares: the machine read-only, a private /tmp, pids and ipc, no capabilities."""
    return ["--ro-bind", "/", "/",              # the whole machine, read-only
            "--dev", "/dev", "--proc", "/proc",
            "--size", str(tmp_size_mb << 20), "--tmpfs", "/tmp",   # private /tmp (also hides tmux sockets)
            "--unshare-pid", "--die-with-parent",  # every process of the turn dies with it
            "--unshare-ipc",
            "--cap-drop", "ALL"]                # mandatory as root: with capabilities, root remounts / rw (K02)


def build_argv(bwrap: str, layout: Layout, command: t.Sequence[str], *, network: bool, tty: bool,
               tmp_size_mb: int, writable: t.Sequence[str] = (), setenv: t.Mapping[str, str] | None = None) -> list[str]:
    """The full argv: ``bwrap <mounts> -- <command>``.

    ``tty``: the command needs its terminal (a TUI in tmux), so no ``--new-session``.
    """
    argv = [bwrap, *_machine(tmp_size_mb)]
    argv += _host_tmp_paths(layout.root, command)
    argv += _cut_off(network, tty)
    # The secret of `ov serve` (its HTTP API acts as the operator) is masked with an empty file.
    if layout.serve_token is not None and layout.serve_token.exists():
        argv += ["--ro-bind", "/dev/null", str(layout.serve_token)]
    # ov's per-agent files: only this agent's run dir (a socket on a read-only mount still
    # connects, so the others' endpoint sockets must be hidden, not just read-only: U04).
    argv += ["--tmpfs", str(layout.runs), *_bind("--ro-bind", layout.run)]
    if layout.state_dir is not None:
        argv += _bind("--bind", layout.state_dir)
        for pinned in layout.pinned:  # the runtime's hook config and instructions ov wrote there
            argv += _bind("--ro-bind", pinned)
    argv += ["--remount-ro", str(layout.runs)]
    if layout.writer and layout.worktree is not None:
        # Other agents' worktrees are hidden; the own one is writable, its gitdir pointer is not.
        argv += ["--tmpfs", str(layout.worktrees), *_bind("--bind", layout.worktree),
                 *_bind("--ro-bind", layout.worktree / ".git"), "--remount-ro", str(layout.worktrees)]
        argv += _git_view(layout)
    for path in writable:
        if os.path.exists(path):
            argv += _bind("--bind", os.path.realpath(path))
    for key, value in (setenv or {}).items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", str(layout.cwd), "--", *command]
    return argv


def _cut_off(network: bool, tty: bool) -> list[str]:
    """What a sandbox is cut off from: the terminal (unless a TUI), the network (unless shared), host sockets."""
    argv = [] if tty else ["--new-session"]     # no controlling terminal: nothing to push keystrokes into
    if not network:
        argv.append("--unshare-net")
    argv += ["--tmpfs", "/run"]                 # host unix sockets (databases, dbus) stay out of reach
    resolv = _resolv_conf_dir()
    if resolv is not None:
        argv += _bind("--ro-bind", resolv)
    return argv


def build_check_argv(bwrap: str, *, root: Path, ov_dir: Path, tree: Path, command: t.Sequence[str], network: bool,
                     tmp_size_mb: int, writable: t.Sequence[str] = (), serve_token: Path | None = None) -> list[str]:
    """The argv of a check or gate over agent-written code (a loop's check, a phase's gate, a merge gate).

    The same boundary as a turn, around a scratch checkout instead of the agent's worktree: the
    machine read-only, ``tree`` (the checkout the check judges) the one writable place besides the
    private /tmp and ``sandbox.writable``; every agent's run dir (their endpoint sockets) and
    worktree hidden; `ov serve`'s secret masked. No git view: the checkout's git metadata is
    read-only, so a check can read history but not move a branch.
    """
    argv = [bwrap, *_machine(tmp_size_mb)]
    argv += _host_tmp_paths(root, command)
    argv += _cut_off(network, tty=False)
    if serve_token is not None and serve_token.exists():
        argv += ["--ro-bind", "/dev/null", str(serve_token)]
    for hidden in (ov_dir / "run", ov_dir / "worktrees"):
        if hidden.is_dir():
            argv += ["--tmpfs", str(hidden), "--remount-ro", str(hidden)]
    argv += _bind("--bind", tree)
    for path in writable:
        if os.path.exists(path):
            argv += _bind("--bind", os.path.realpath(path))
    argv += ["--chdir", str(tree), "--", *command]
    return argv


def _git_view(layout: Layout) -> list[str]:
    """A writer's view of the shared git dir: a private top level, everything shared read-only,
    writable only what a commit on its own branch needs.

    - The top level is a private tmpfs, each real entry bound back read-only: lock files git
      takes there (packed-refs.lock for every ref deletion, e.g. CHERRY_PICK_HEAD during a
      rebase) land in the tmpfs and vanish with the sandbox (A05, V01).
    - objects/ is writable for new loose objects; packs and objects/info (alternates,
      commit-graph) are not.
    - the worktree's admin dir is writable (index, HEAD, rebase state), its commondir and
      gitdir pointers are not.
    - refs/heads/ov/ and its reflogs are the agent's private copies (ov takes its own branch
      back after the turn, checked): no shared ref is writable, not even another agent's.
    """
    git = layout.git_dir
    if git is None:
        return []
    argv = ["--size", str(GIT_TOP_TMPFS_BYTES), "--tmpfs", str(git)]
    for entry in sorted(os.listdir(git)):
        if entry != "objects":
            argv += _bind("--ro-bind", git / entry)
    objects = git / "objects"
    argv += _bind("--bind", objects)
    for pinned in ("pack", "info"):
        if (objects / pinned).is_dir():
            argv += _bind("--ro-bind", objects / pinned)
    if layout.admin_dir is not None:
        argv += _bind("--bind", layout.admin_dir)
        for pointer in ("commondir", "gitdir"):
            if (layout.admin_dir / pointer).exists():
                argv += _bind("--ro-bind", layout.admin_dir / pointer)
    if layout.own_ref_name is not None:
        argv += ["--bind", str(layout.private_refs), str(git / OWN_REFS),
                 "--bind", str(layout.private_logs), str(git / OWN_LOGS)]
    return argv
