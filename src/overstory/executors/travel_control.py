"""The control node's side of a remote turn's workspace (issue 30): the agent's branch, its uncommitted files and
its runtime's state go out to a node, and come back exactly once. Served by the agent's loop through its
endpoint (``workspace.*`` routes), so only the current turn's secret reaches them.

The node never writes to this repository: it uploads a git bundle, and this side chooses every ref it writes,
all named from the authenticated turn. Per turn, under ``refs/ov/turns/<agent>/<turn id>/``:

- ``base``, ``start``: the branch's tip the turn starts from and the worktree's snapshot then
  (``travel_git.snapshot``), created by the first fetch; a second fetch (a node retrying) answers the same;
- ``head``, ``end``: the branch's tip and the snapshot the node sent back, created together, only if
  neither exists: the first finish wins, a repeat of it changes nothing, a different second one is refused;
- ``applied`` or ``stale``: written last. ``applied``: ``ov/<agent>`` moved from ``base`` to ``head`` by
  compare-and-swap and the worktree's files went from ``start`` to ``end``. ``stale``: the branch had
  moved meanwhile (a retry of the turn finished first), so nothing was changed.

``settle`` does the last step and can run again after a crash at any point of it (the loop runs it after
every remote turn and before the next one); until it has run, nothing else moves the branch.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import tarfile
import tempfile
import threading
import typing as t

from overstory.errors import WorkspaceRefused
from overstory.executors import travel_git as g

if t.TYPE_CHECKING:
    from pathlib import Path

    from overstory.paths import ProjectPaths
    from overstory.store.sessions import Session

TURN_REFS = "refs/ov/turns"
LOCAL_ONLY = ("turns", "ov.sock")
FAULT_ENV = "OV_TEST_TRAVEL_DIE"  # test hook: "after_cas" kills this process between the branch's move and the files  # in the run dir: the local executor's folders, the endpoint's socket
_lock = threading.Lock()  # one settle at a time in this process (the finish route and the loop's own settle)


def refs_of(agent: str, turn_id: str) -> str:
    return f"{TURN_REFS}/{agent}/{turn_id}"


def _worktree(agent: Session, turn_id: str) -> tuple[str, str]:
    if not agent.worktree or not agent.branch:
        raise WorkspaceRefused(turn_id, f"{agent.name} has no worktree of its own: its turns cannot travel")
    return agent.worktree, agent.branch


def send(project: ProjectPaths, agent: Session, turn_id: str, state: Path | None) -> dict[str, t.Any]:
    """What a node needs to run ``turn_id``: the repository as a bundle, the agent's run dir as a tar, and the
    commits the turn starts from. The same base and start however often it is asked. ``state``: the runtime's
    state dir (in the run dir), put back together first if a crash left it half swapped."""
    worktree, branch = _worktree(agent, turn_id)
    repo, prefix = project.root, refs_of(agent.name, turn_id)
    with _lock:
        settle_pending(project, agent, but=turn_id)
        base, start = g.read_ref(repo, prefix + "/base"), g.read_ref(repo, prefix + "/start")
        if base is None or start is None:
            tip = g.read_ref(repo, f"refs/heads/{branch}")
            if tip is None:
                raise WorkspaceRefused(turn_id, f"branch {branch} does not exist")
            g.create_refs(repo, {prefix + "/base": tip, prefix + "/start": g.snapshot(worktree, tip)})
            base, start = g.read_ref(repo, prefix + "/base"), g.read_ref(repo, prefix + "/start")
    with tempfile.TemporaryDirectory(prefix="ov-send-") as scratch:
        bundle = os.path.join(scratch, "repo.bundle")
        g.git(repo, "bundle", "create", "-q", bundle, "--branches", prefix + "/start")
        data = open(bundle, "rb").read()
    identity = {key: value for key in ("user.name", "user.email")
                if (value := g.out(repo, "config", "--get", key, check=False))}
    if state is not None:
        _recover_state(state)
    return {"base": base, "start": start, "branch": branch, "bundle": _b64(data), "identity": identity,
            "run": _b64(pack_dir(project.run_dir / agent.name, skip=LOCAL_ONLY))}


def finish(project: ProjectPaths, agent: Session, turn_id: str, head: str, end: str, bundle: bytes) -> str:
    """The node's result of ``turn_id``: its objects stored, its per-turn refs created once, then ``settle``.
    Answers "applied", "stale", or "unchanged" (the turn changed nothing)."""
    _worktree(agent, turn_id)
    repo, prefix = project.root, refs_of(agent.name, turn_id)
    if g.read_ref(repo, prefix + "/base") is None:
        raise WorkspaceRefused(turn_id, "no workspace was sent out for this turn")
    for name in (head, end):
        if len(name) not in (40, 64) or any(c not in "0123456789abcdef" for c in name):
            raise WorkspaceRefused(turn_id, f"{name[:80]!r} is not an object name")
    with _lock:
        known = g.read_ref(repo, prefix + "/head"), g.read_ref(repo, prefix + "/end")
        if known[0] is not None:
            if known != (head, end):
                raise WorkspaceRefused(turn_id, f"it finished before with {known[0][:12]}; a second, different "
                                                "finish is refused")
            return _settle(project, agent, turn_id)  # a repeat: whatever happened the first time stands
        if bundle:
            _store(repo, turn_id, bundle)
        for name in (head, end):
            if g.git(repo, "cat-file", "-t", name, check=False).stdout.strip() != b"commit":
                raise WorkspaceRefused(turn_id, f"{name[:12]} is not a commit here (the bundle did not bring it)")
            unusable = g.unusable_tree(repo, name)
            if unusable:
                raise WorkspaceRefused(turn_id, f"the files of {name[:12]} cannot be checked out: {unusable}")
        if not g.create_refs(repo, {prefix + "/head": head, prefix + "/end": end}):
            if (g.read_ref(repo, prefix + "/head"), g.read_ref(repo, prefix + "/end")) != (head, end):
                raise WorkspaceRefused(turn_id, "another finish of this turn came first")
        return _settle(project, agent, turn_id)


def _store(repo: t.Any, turn_id: str, bundle: bytes) -> None:
    """The bundle's objects into the repository; no ref is written from it."""
    with tempfile.TemporaryDirectory(prefix="ov-recv-") as scratch:
        path = os.path.join(scratch, "turn.bundle")
        with open(path, "wb") as handle:
            handle.write(bundle)
        checked = g.git(repo, "bundle", "verify", "-q", path, check=False)
        if checked.returncode != 0:
            raise WorkspaceRefused(turn_id, "the bundle is not usable here: "
                                   + " ".join(checked.stderr.decode("utf-8", "replace").split())[:200])
        g.git(repo, "bundle", "unbundle", path)


def settle(project: ProjectPaths, agent: Session, turn_id: str) -> str:
    """Complete what the turn's finish started (idempotent); "pending" when nothing came back for it."""
    with _lock:
        return _settle(project, agent, turn_id)


def _settle(project: ProjectPaths, agent: Session, turn_id: str) -> str:
    worktree, branch = _worktree(agent, turn_id)
    repo, prefix = project.root, refs_of(agent.name, turn_id)
    if g.read_ref(repo, prefix + "/stale"):
        return "stale"
    if g.read_ref(repo, prefix + "/applied"):
        return "applied"
    base, start = g.read_ref(repo, prefix + "/base"), g.read_ref(repo, prefix + "/start")
    head, end = g.read_ref(repo, prefix + "/head"), g.read_ref(repo, prefix + "/end")
    if base is None or start is None or head is None or end is None:
        return "pending"
    ref = f"refs/heads/{branch}"
    current = g.read_ref(repo, ref)
    if current == base and head != base:
        moved = g.git(repo, "update-ref", "-m", f"ov: turn {turn_id} from its node", ref, head, base, check=False)
        current = g.read_ref(repo, ref)
        if moved.returncode != 0 and current != head:
            g.create_refs(repo, {prefix + "/stale": head})
            return "stale"
    if os.environ.get(FAULT_ENV) == "after_cas":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    if current != head:  # the branch moved away from the turn's start meanwhile: its result is out of date
        g.create_refs(repo, {prefix + "/stale": head})
        return "stale"
    g.apply_tree(worktree, start, end)
    g.create_refs(repo, {prefix + "/applied": head})
    return "applied" if (head, end) != (base, start) else "unchanged"


def settle_pending(project: ProjectPaths, agent: Session, *, but: str = "") -> list[tuple[str, str]]:
    """Settle every earlier turn of ``agent`` that came back and was not settled (a crash in between)."""
    if not agent.worktree:
        return []
    prefix = f"{TURN_REFS}/{agent.name}/"
    listed = g.out(project.root, "for-each-ref", "--format=%(refname)", prefix)
    turns = sorted({name[len(prefix):].split("/", 1)[0] for name in listed.splitlines() if name.endswith("/head")})
    done = []
    for turn_id in turns:
        if turn_id != but and not (g.read_ref(project.root, refs_of(agent.name, turn_id) + "/applied")
                                   or g.read_ref(project.root, refs_of(agent.name, turn_id) + "/stale")):
            done.append((turn_id, _settle(project, agent, turn_id)))
    return done


# ---- the runtime's state -------------------------------------------------------------------------------------

def pack_dir(directory: t.Any, *, skip: t.Sequence[str] = ()) -> bytes:
    """A tar of ``directory``'s files, directories and symlinks (sockets and the ``skip`` names at its top left out)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as archive:
        if os.path.isdir(directory):
            for name in sorted(os.listdir(directory)):
                if name not in skip:
                    archive.add(os.path.join(directory, name), arcname=name, filter=_plain)
    return buffer.getvalue()


def _plain(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return member if (member.isfile() or member.isdir() or member.issym()) else None


def unpack_dir(data: bytes, directory: t.Any) -> None:
    os.makedirs(directory, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(directory, filter="data")


def receive_state(project: ProjectPaths, agent: Session, turn_id: str, data: bytes, state: Path | None,
                  pinned: t.Sequence[Path] = ()) -> str:
    """The runtime's state dir as the node left it (its session, for the next ``--resume``), swapped in whole,
    for a turn that was sent out. ``pinned``: the files ov wrote there (the hooks' config, the instructions),
    read-only in the sandbox: they are kept as they are here, whatever came back."""
    if g.read_ref(project.root, refs_of(agent.name, turn_id) + "/base") is None:
        raise WorkspaceRefused(turn_id, "no workspace was sent out for this turn")
    if state is None:
        return "none"
    _recover_state(state)
    incoming, old = state.with_name(f".{state.name}.in-{turn_id}"), state.with_name(f".{state.name}.old")
    shutil.rmtree(incoming, ignore_errors=True)
    unpack_dir(data, incoming)
    for path in pinned:
        kept = incoming / path.relative_to(state.resolve())
        if kept.is_dir() and not kept.is_symlink():
            shutil.rmtree(kept)
        elif kept.is_symlink() or kept.exists():
            kept.unlink()
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, kept)
    if state.exists():
        os.replace(state, old)  # a crash from here to the next rename is undone by _recover_state
    os.replace(incoming, state)
    shutil.rmtree(old, ignore_errors=True)
    return "replaced"


def _recover_state(state: Path) -> None:
    old = state.with_name(f".{state.name}.old")
    if not state.exists() and old.exists():
        os.replace(old, state)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
