"""The secret that `ov serve` requires on every request: ``.overstory/serve-token``.

Created by `ov init` (or the first `ov serve` of an older project) with mode 0600,
and kept out of git by ``.overstory/.gitignore``. Standard library only.

Creation is atomic: the token is written to a private temporary file named for the
writing process, then hard-linked into place, so two processes creating it at once
agree on one token and a reader never sees a half-written file. A process killed
before the link leaves only its temporary file, which the next creation removes
(its process is gone); killed after it, the token is complete.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from overstory import jsontext, procs
from overstory.errors import TokenError
from overstory.paths import ProjectPaths
from overstory.records import Record

TOKEN_BYTES = 32
GITIGNORE_LINE = "serve-token"


class Token(Record):
    """The project's `ov serve` token, and whether this call created it."""

    __slots__ = ("value", "created")

    value: str
    created: bool


def read_token(project: ProjectPaths) -> str | None:
    """The token, or None when there is none yet. Tightens a file others could read to 0600."""
    path = project.serve_token_file
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        os.chmod(path, 0o600)
    value = path.read_text(encoding="ascii", errors="replace").strip()
    if len(value) < 16 or not all(c.isalnum() or c in "-_" for c in value):
        raise TokenError(f"{path} does not hold a usable token; delete it and run `ov serve` again to make a new one")
    return value


def ensure_token(project: ProjectPaths) -> Token:
    """Read the token, creating it (0600, git-ignored) when it does not exist yet."""
    existing = read_token(project)
    if existing is not None:
        return Token(existing, created=False)
    path = project.serve_token_file
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(project)
    temporary = path.with_name(f".serve-token.{os.getpid()}.tmp")
    import secrets  # here: random, hmac, hashlib, not in every agent loop

    value = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(value + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o600)
        try:
            os.link(temporary, path)
        except FileExistsError:  # another process made one first: use theirs
            found = read_token(project)
            assert found is not None
            return Token(found, created=False)
    finally:
        temporary.unlink(missing_ok=True)
    _keep_out_of_git(project)
    return Token(value, created=True)


def _remove_abandoned(project: ProjectPaths) -> None:
    """Temporary files of creators that died before linking theirs into place."""
    for leftover in project.ov_dir.glob(".serve-token.*.tmp"):
        pid = leftover.name.split(".")[2]
        if pid.isdigit() and not procs.is_alive(int(pid)):
            leftover.unlink(missing_ok=True)


def _keep_out_of_git(project: ProjectPaths) -> None:
    """Projects initialized before the token existed: add it to their `.overstory/.gitignore`."""
    ignore = project.ov_dir / ".gitignore"
    try:
        lines = ignore.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return
    present = {line.strip() for line in lines}
    if "/*" in present:  # the ignore-everything-but-what-a-team-shares file `ov init` writes today
        return
    if GITIGNORE_LINE not in present:
        with ignore.open("a", encoding="utf-8") as handle:
            handle.write(("" if not lines or ignore.read_text(encoding="utf-8").endswith("\n") else "\n")
                         + GITIGNORE_LINE + "\n")


# ---- where a running `ov serve` listens (for links in notifications; never the token) -------------

def address_file(project: ProjectPaths) -> Path:
    return project.run_dir / "serve.json"


def record_address(project: ProjectPaths, base: str) -> None:
    """Written once the socket is bound; a page opened from a link made from it still has to sign in."""
    pid = os.getpid()
    target = address_file(project)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".serve.{pid}.json")
    temporary.write_text(jsontext.dumps({"base": base, "pid": pid, "ticks": procs.start_ticks(pid)}), encoding="utf-8")
    os.replace(temporary, target)


def forget_address(project: ProjectPaths) -> None:
    """Removed at exit, only while it still names this process (a newer server may have replaced it)."""
    target = address_file(project)
    try:
        if jsontext.loads(target.read_text(encoding="utf-8")).get("pid") == os.getpid():
            target.unlink()
    except (OSError, ValueError):
        pass


def running_address(project: ProjectPaths) -> str | None:
    """The base URL of the project's `ov serve` while that very process still runs, else None."""
    try:
        record = jsontext.loads(address_file(project).read_text(encoding="utf-8"))
        base, pid, ticks = str(record["base"]), int(record["pid"]), record.get("ticks")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return base if procs.is_alive(pid, ticks) else None

