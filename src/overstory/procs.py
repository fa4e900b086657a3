"""Process and process-group helpers that only ever touch what ov recorded.

A pid alone is not an identity (pids are reused), so ov records each process's
start time in clock ticks from /proc and checks it before believing or killing.
"""

from __future__ import annotations

import os
import time

_PROC = "/proc"  # a string, not a pathlib.Path: `ov status` imports this module


def which(name: str) -> str | None:
    """``shutil.which`` for a program name or path (executable files only), without importing shutil:
    with bz2 and lzma it is 0.3 MiB of every agent loop, which looks a program up before each turn."""
    candidates = [name] if os.sep in name else [os.path.join(folder or os.curdir, name)
                                                 for folder in os.get_exec_path()]
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name; None when the process is gone.

    Read with ``os.read``, not ``open()``: `ov status` reads one per agent, and a text file object costs
    more than the read (what follows the command name is ASCII digits and letters either way)."""
    chunks = []
    try:
        handle = os.open(f"{_PROC}/{pid}/stat", os.O_RDONLY)
        try:
            while chunk := os.read(handle, 4096):
                chunks.append(chunk)
        finally:
            os.close(handle)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    raw = b"".join(chunks)
    # The command name (field 2) is parenthesised and may hold spaces: split after it.
    closing = raw.rfind(b")")
    return raw[closing + 2:].decode("utf-8", "replace").split()


def start_ticks(pid: int) -> int | None:
    """The process's start time (field 22 of /proc/PID/stat), or None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int | None, ticks: int | None = None) -> bool:
    """True if ``pid`` runs, is not a zombie, and (when given) started at ``ticks``."""
    if not pid:
        return False
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def ancestors(pid: int) -> list[int]:
    """The parents of ``pid``, nearest first, up to (without) the init of its pid namespace."""
    chain: list[int] = []
    fields = _stat_fields(pid)
    while fields is not None:
        parent = int(fields[1])
        if parent <= 1 or parent in chain:
            break
        chain.append(parent)
        fields = _stat_fields(parent)
    return chain


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (/proc/PID/environ), or {} if it cannot be read. What a child
    does to its own variables does not change its parents' copies."""
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as handle:
            raw = handle.read()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {os.fsdecode(key): os.fsdecode(value) for key, _, value in pairs}


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    members = []
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def group_is_ours(pgid: int | None, leader_ticks: int | None) -> bool:
    """Whether ``pgid`` still names the group ov started.

    A group id cannot be reused while any member lives; it can only be reused once
    the group is empty, by a new leader with pid == pgid. So: if a process with
    pid == pgid exists, it must have our recorded start time.
    """
    if not pgid:
        return False
    leader = start_ticks(pgid)
    if leader is not None and leader_ticks is not None and leader != leader_ticks:
        return False
    return True


def group_alive(pgid: int | None, leader_ticks: int | None = None) -> bool:
    return bool(pgid) and group_is_ours(pgid, leader_ticks) and bool(group_members(pgid))  # type: ignore[arg-type]


def children(pid: int) -> list[int]:
    """Live children of ``pid`` (from /proc; pids in nested pid namespaces are seen by their outer pid)."""
    found = []
    for entry in os.scandir(_PROC):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[0] not in ("Z", "X") and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _comm(pid: int) -> str:
    try:
        with open(f"{_PROC}/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def sandboxed_commands(leader: int) -> list[int]:
    """The commands a bubblewrap sandbox runs, when ``leader`` is the bwrap ov started.

    Inside ``--unshare-pid`` the command's parent is bwrap's own pid-1 reaper, which ignores
    SIGTERM; SIGTERM to the outer bwrap kills everything at once (``--die-with-parent``
    sends SIGKILL). A graceful stop therefore signals the commands, the reaper's children.
    """
    if _comm(leader) != "bwrap":
        return []
    return [pid for reaper in children(leader) if _comm(reaper) == "bwrap" for pid in children(reaper)]


def kill_group(pgid: int | None, leader_ticks: int | None, *, grace: float = 5.0, force: bool = False) -> bool:
    """SIGTERM the group (SIGKILL after ``grace`` s, or at once with ``force``). True if it is gone.

    A bubblewrap sandbox as leader gets its commands signalled instead (``sandboxed_commands``);
    when they exit, the sandbox ends, and whatever is left is killed after ``grace``.
    """
    import _signal as signal  # type: ignore[import-not-found]  # the C half: signal imports enum (5 ms a shim)

    if not pgid or not group_is_ours(pgid, leader_ticks):
        return True
    if pgid in (os.getpgrp(), 0, 1):
        raise RuntimeError("refusing to signal our own or the init process group")
    inside = [] if force else sandboxed_commands(pgid)
    try:
        if inside:
            for pid in inside:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        else:
            os.killpg(pgid, signal.SIGKILL if force else signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + (0 if force else grace)
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not group_members(pgid):
            return True
        time.sleep(0.05)
    return not group_members(pgid)


TURN_TAG = "OVERSTORY_TURN_ID"


def tagged_processes(turn_id: str, *, tag: str = TURN_TAG) -> list[int]:
    """Live pids whose environment carries ``OVERSTORY_TURN_ID=<turn_id>`` (or ``<tag>=<turn_id>``).

    The runtime starts its tool processes in sessions of their own (so they leave
    the turn's process group), but they inherit the environment ov gave the turn,
    and the turn id in it is unique: this finds exactly what the turn started.
    """
    if not turn_id:
        return []
    needle = f"{tag}={turn_id}".encode()
    found = []
    me = os.getpid()
    for entry in os.scandir(_PROC):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"{entry.path}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            fields = _stat_fields(int(entry.name))
            if fields and fields[0] not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def kill_turn(pgid: int | None, leader_ticks: int | None, turn_id: str | None, *, grace: float = 5.0,
              force: bool = False, tag: str = TURN_TAG) -> bool:
    """Stop everything a turn (or a check: ``tag``) started: its process group, then any tagged stragglers.
    True if all gone."""
    import _signal as signal  # type: ignore[import-not-found]  # the C half: signal imports enum (5 ms a shim)

    gone = kill_group(pgid, leader_ticks, grace=grace, force=force)
    stragglers = tagged_processes(turn_id or "", tag=tag)
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGTERM if not force else signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + (0.5 if force else min(grace, 2.0))
    while stragglers and time.monotonic() < deadline:
        stragglers = tagged_processes(turn_id or "", tag=tag)
        time.sleep(0.05)
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return gone and not tagged_processes(turn_id or "", tag=tag)


KILL_AT_ENV = "OV_TEST_KILL_AT"  # fault injection for the tests: see kill_point


def kill_point(step: str) -> None:
    """Die here as `kill -9` would, if the tests asked for it (``OV_TEST_KILL_AT=<step>``).

    The crash-safety tests use this to stop a command exactly between two of its steps.
    """
    if os.environ.get(KILL_AT_ENV) == step:
        import _signal as signal  # type: ignore[import-not-found]  # signal's C half (signal imports enum)

        os.kill(os.getpid(), signal.SIGKILL)
