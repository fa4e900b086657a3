"""Does bubblewrap work here? Asked once per process (a turn loop asks it once in its life).

The probe runs the same kind of sandbox a turn gets (read-only root, private /tmp, a pid
namespace, no capabilities) around ``true``. bwrap can be installed and still fail: no
user namespaces for an unprivileged user, a container without the rights to mount.
"""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass

BWRAP = "bwrap"
INSTALL_HINT = "apt-get install bubblewrap (or dnf/pacman install bubblewrap), or set sandbox.mode: off"


@dataclass(frozen=True)
class Probe:
    """Whether bubblewrap works here (a docstring: dataclasses then needs no inspect in an agent loop)."""

    ok: bool
    path: str | None
    detail: str  # the version, or why it does not work


def bwrap_path() -> str | None:
    explicit = os.environ.get("OV_BWRAP")  # tests and unusual installs
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    import shutil  # here: with bz2 and lzma, not in every agent loop

    return shutil.which(BWRAP)


@functools.lru_cache(maxsize=1)
def probe() -> Probe:
    path = bwrap_path()
    if path is None:
        return Probe(False, None, f"bubblewrap ({BWRAP}) is not installed")
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
