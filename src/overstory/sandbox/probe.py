"""Does bubblewrap work here? Asked once per process (a turn loop asks it once in its life).

The probe runs the same kind of sandbox a turn gets (read-only root, private /tmp, a pid
namespace, no capabilities) around ``true``. bwrap can be installed and still fail: no
user namespaces for an unprivileged user, a container without the rights to mount.

A probe that found bwrap working is remembered for this user until something it depends on
changes (``_key``: the bwrap binary, the boot, the user-namespace settings), in a file of
their own in $XDG_RUNTIME_DIR (else $TMPDIR, /tmp): `ov sling` and then the new agent's loop
each asked it before, two processes each, on the way to the agent's first turn (issue 34).
A failing probe is never remembered.
"""

from __future__ import annotations

import functools
import os
import subprocess

from overstory.records import Record

BWRAP = "bwrap"
INSTALL_HINT = "apt-get install bubblewrap (or dnf/pacman install bubblewrap), or set sandbox.mode: off"


class Probe(Record):
    """Whether bubblewrap works here (a docstring: dataclasses then needs no inspect in an agent loop)."""

    __slots__ = ("ok", "path", "detail")

    ok: bool
    path: str | None
    detail: str  # the version, or why it does not work


def bwrap_path() -> str | None:
    explicit = os.environ.get("OV_BWRAP")  # tests and unusual installs
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    from overstory.procs import which

    return which(BWRAP)


@functools.lru_cache(maxsize=1)
def probe() -> Probe:
    path = bwrap_path()
    if path is None:
        return Probe(False, None, f"bubblewrap ({BWRAP}) is not installed")
    key = _key(path)
    remembered = _remembered(key)
    if remembered is not None:
        return Probe(True, path, remembered)
    found = _run_probe(path)
    if found.ok and key is not None:
        _remember(key, found.detail)
    return found


# What a working probe depends on besides the binary: the boot, and the user-namespace switches.
_SETTINGS = ("/proc/sys/kernel/random/boot_id", "/proc/sys/kernel/unprivileged_userns_clone",
             "/proc/sys/user/max_user_namespaces", "/proc/sys/kernel/apparmor_restrict_unprivileged_userns")


def _key(path: str) -> list[object] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    settings: list[str | None] = []
    for name in _SETTINGS:
        try:
            with open(name, encoding="utf-8") as handle:
                settings.append(handle.read().strip())
        except OSError:
            settings.append(None)
    return [path, stat.st_ino, stat.st_size, stat.st_mtime_ns, os.getuid(), settings]


def memory_file() -> str:
    folder = os.environ.get("XDG_RUNTIME_DIR") or os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(folder, f"ov-bwrap-probe-{os.getuid()}.json")


def _remembered(key: list[object] | None) -> str | None:
    """The detail of a working probe with this key, from a file this user owns and only it can write."""
    if key is None:
        return None
    from overstory import jsontext  # not the json package: every agent's loop asks this once, then idles

    try:
        fd = os.open(memory_file(), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        stat = os.fstat(fd)
        if stat.st_uid != os.getuid() or stat.st_mode & 0o022:
            return None
        with os.fdopen(os.dup(fd), encoding="utf-8") as handle:
            document = jsontext.loads(handle.read())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if isinstance(document, dict) and document.get("key") == jsontext.loads(jsontext.dumps(key)):
        detail = document.get("detail")
        return detail if isinstance(detail, str) else None
    return None


def _remember(key: list[object], detail: str) -> None:
    from overstory import jsontext

    target = memory_file()
    temporary = f"{target}.{os.getpid()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(jsontext.dumps({"key": key, "detail": detail}))
        os.replace(temporary, target)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _run_probe(path: str) -> Probe:
    argv = [path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--unshare-pid",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--", "true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Probe(False, path, f"{path} could not run: {exc}")
    if done.returncode != 0:
        reason = " ".join(done.stderr.split())[:200] or f"exit {done.returncode}"
        return Probe(False, path, f"{path} does not work here: {reason}")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
    return Probe(True, path, f"{version or 'bubblewrap'} at {path}")
