"""What the sandbox tests share: the real bubblewrap, and a snapshot of everything an agent must not change.

``Snapshot.take`` hashes the main checkout, other worktrees, ``.overstory/`` (config files and
the databases' logical content, minus what belongs to the agents under test), every ref, the
git config, hooks and info, and optional extra paths. Comparing two snapshots names what changed.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.paths import ProjectPaths
from overstory.sandbox.probe import probe
from requires import requires

MISSING = "bubblewrap is not installed or does not work here (apt-get install bubblewrap)"


def requires_bwrap(test: t.Callable[..., t.Any]) -> t.Any:
    """Skip without bubblewrap; on CI (CI=true) a missing bubblewrap fails instead."""
    return requires(probe().ok, MISSING)(test)


def _hash_tree(root: Path, skip: t.Collection[str] = ()) -> dict[str, str]:
    """path -> digest of (mode, content or link target) for every entry under ``root``."""
    found: dict[str, str] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if str(rel_dir / d) not in skip)
        for name in sorted(filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]):
            path = Path(dirpath) / name
            rel = str(rel_dir / name)
            if rel in skip:
                continue
            info = path.lstat()
            if path.is_symlink():
                digest = "link:" + os.readlink(path)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "special"
            found[rel] = f"{oct(info.st_mode)} {digest}"
        for name in dirnames:
            found[str(rel_dir / name) + "/"] = "dir"
    return found


def _rows(db: Path, query: str, params: t.Sequence[t.Any] = ()) -> list[tuple[t.Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return [tuple(r) for r in conn.execute(query, params).fetchall()]
    finally:
        conn.close()


def git_out(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True).stdout


@dataclass
class Snapshot:
    parts: dict[str, t.Any] = field(default_factory=dict)

    @classmethod
    def take(cls, project: ProjectPaths, *, owned_agents: t.Collection[str], owned_worktrees: t.Collection[str] = (),
             extra: t.Mapping[str, Path] = t.cast(t.Mapping[str, Path], {})) -> Snapshot:
        """Everything outside what ``owned_agents`` own: their own branch ov/<name>, the worktrees
        named in ``owned_worktrees`` (writers' own), their rows, mail and events."""
        root = project.root
        git = root / ".git"
        owned_refs = {f"refs/heads/ov/{name}" for name in owned_agents}
        marks = ",".join("?" * len(owned_agents)) or "''"
        names = tuple(owned_agents)
        parts: dict[str, t.Any] = {
            "main checkout": _hash_tree(root, skip={".git", ".overstory"}),
            "git config, hooks, info": {name: _hash_tree(git / name) if (git / name).is_dir() else
                                        _hash_tree(git, skip=set(os.listdir(git)) - {name})
                                        for name in ("config", "hooks", "info", "HEAD", "packed-refs")},
            "refs": sorted(line for line in git_out(root, "for-each-ref", "--format=%(refname) %(objectname)")
                           .splitlines() if line.split(" ")[0] not in owned_refs),
            "loose ref files": {k: v for k, v in _hash_tree(git / "refs").items()
                                if f"refs/{k}" not in owned_refs},
            "worktree admin dirs": {k: v for k, v in _hash_tree(git / "worktrees").items()
                                    if k.split("/")[0] not in owned_worktrees},
            "other worktrees": {k: v for k, v in _hash_tree(project.worktrees_dir).items()
                                if k.split("/")[0] not in owned_worktrees},
            "ov config": {name: _hash_tree(project.ov_dir, skip=set(os.listdir(project.ov_dir)) - {name})
                          for name in ("config.yaml", "config.local.yaml", "agents", "templates")},
            "sessions": _rows(project.state_db, f"SELECT name, generation, state, capability, parent, branch, worktree "
                                                f"FROM sessions WHERE name NOT IN ({marks}) ORDER BY name", names),
            "mail": _rows(project.state_db, f"SELECT id, sender, recipient, type, subject, body, payload, read_at "
                                            f"FROM mail WHERE sender NOT IN ({marks}) AND recipient NOT IN ({marks}) "
                                            "ORDER BY id", names + names),
            "mail as someone else": _rows(project.state_db, f"SELECT count(*) FROM mail WHERE sender = 'operator' "
                                                            f"AND recipient NOT IN ({marks})", names),
            "runs": _rows(project.state_db, "SELECT * FROM runs ORDER BY id"),
            "merge queue": _rows(project.state_db, "SELECT * FROM merge_queue ORDER BY id"),
            "events": _rows(project.events_db, f"SELECT id, kind, agent, summary FROM events WHERE agent NOT IN ({marks}) "
                                               "AND kind NOT IN ('mail_sent') ORDER BY id", names),
            # (An endpoint socket comes and goes with its loop: ov's own, not an agent's doing.)
            "other run dirs": {k: v for k, v in _hash_tree(project.run_dir).items()
                               if k.split("/")[0] not in owned_agents and not k.endswith("/ov.sock")},
        }
        for label, path in extra.items():
            parts[label] = _hash_tree(path) if path.is_dir() else (path.read_bytes() if path.exists() else None)
        return cls(parts)

    def differences(self, other: Snapshot) -> dict[str, t.Any]:
        """What changed from ``self`` to ``other``: per part, the keys that differ (or both values)."""
        changed: dict[str, t.Any] = {}
        for label, before in self.parts.items():
            after = other.parts.get(label)
            if before == after:
                continue
            if isinstance(before, dict) and isinstance(after, dict):
                changed[label] = {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
                                  if before.get(k) != after.get(k)}
            else:
                changed[label] = (before, after)
        return changed


def events_of(project: ProjectPaths, agent: str, kind: str) -> list[str]:
    """The summaries of ``agent``'s events of ``kind``, oldest first."""
    from overstory.store.db import open_events

    conn = open_events(project.events_db)
    try:
        return [r[0] for r in conn.execute("SELECT summary FROM events WHERE agent = ? AND kind = ? ORDER BY id",
                                           (agent, kind))]
    finally:
        conn.close()


def processes_with(token: str) -> list[int]:
    """Live pids whose command line contains ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text()
        except OSError:
            continue
        if token.encode() in cmdline and state[state.rfind(")") + 2] not in "ZX":
            found.append(int(entry.name))
    return found
