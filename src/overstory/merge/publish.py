"""Moving the target branch to a merge made in a scratch worktree, and recovering after a crash.

``merge_branch`` never merges in the operator's checkout. It makes the merge commit in a
temporary worktree, then publishes it: ``git update-ref`` with the old value (a
compare-and-swap) when the target is not checked out, or ``git merge --ff-only`` at the
root when it is (one git process moves index, files and branch together, and refuses
rather than overwrite local changes). The target's merge lock is passed to that git
process, so a killed ``ov merge`` cannot let another merge in before git is done.

A journal file next to the lock (``merge-<target>.journal``) records the scratch worktree
and the publish step before they happen. Whoever next holds the lock (the next merge into
that target, or the watchdog) reads it: a gate the merge left running is killed, the scratch
worktree goes, and a publish at the root that git itself did not finish is rolled back file
by file, touching only files whose content is exactly one of the two versions ov was moving
between.
"""

from __future__ import annotations

import json
import os
import shutil
import typing as t
from pathlib import Path

from overstory.errors import LockHeld, MergeError
from overstory.gitutil import worktree_admin_lock
from overstory.merge._git import Git, describe
from overstory.merge.gates import gate_record
from overstory.merge.lock import TargetLock, lock_path
from overstory.merge.worktree_state import branch_head, checkout_location, is_temporary_merge_worktree
from overstory.sandbox.checks import kill_leftover


def journal_path(lock_dir: Path, target: str) -> Path:
    return lock_path(lock_dir, target).with_suffix(".journal")


def write_journal(path: Path, data: dict[str, t.Any]) -> None:
    """Atomically (a rename), and on disk before the step it announces."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".new")
    with open(scratch, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(scratch, path)


def read_journal(path: Path) -> dict[str, t.Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def clear_journal(path: Path) -> None:
    for leftover in (path, path.with_name(path.name + ".new")):
        try:
            leftover.unlink()
        except FileNotFoundError:
            pass


def publish(root: Git, *, target: str, source: str, old: str, new: str, at_root: bool, lock: TargetLock) -> None:
    """Move ``target`` from ``old`` to the merge commit ``new``; MergeError (target unchanged) if it moved."""
    if at_root:
        if root.rev("HEAD") != old:
            raise MergeError(f"{target} moved while the merge was being made (a commit at {root.cwd}?); "
                             "nothing was changed; run `ov merge` again")
        proc = root.run("merge", "--ff-only", "--no-edit", "--quiet", new, check=False, pass_fds=lock.fds())
        if proc.returncode != 0:
            raise MergeError(f"could not move your checkout of {target} at {root.cwd} to the merge commit "
                             f"{new[:12]}: {describe(proc)}; {target} was not changed")
        return
    proc = root.run("update-ref", "-m", f"ov merge: {source} into {target}", f"refs/heads/{target}", new, old,
                    check=False)
    if proc.returncode != 0:
        raise MergeError(f"{target} moved while the merge was being made; nothing was changed; run `ov merge` again")


def recover(root: Git, root_path: Path, lock_dir: Path, target: str) -> list[str]:
    """Under the target's lock: clean up after a merge into ``target`` that was killed. Returns what was done."""
    done: list[str] = []
    location = checkout_location(root, target)
    if location is not None and is_temporary_merge_worktree(location, root_path):
        remove_worktree(root, root_path, location)  # left by an older ov that merged on the branch itself
        done.append(f"removed the scratch worktree {location}")
    path = journal_path(lock_dir, target)
    data = read_journal(path)
    if data is None:
        clear_journal(path)
        return done
    scratch = Path(str(data.get("worktree") or ""))
    if data.get("worktree") and kill_leftover(gate_record(scratch)):
        done.append(f"killed the gate the interrupted merge left running in {scratch}")
    if data.get("worktree") and (scratch.exists() or _registered(root, scratch)):
        remove_worktree(root, root_path, scratch)
        done.append(f"removed the scratch worktree {scratch} of an interrupted merge")
    if data.get("phase") == "publishing" and data.get("at_root") and data.get("new"):
        head = branch_head(root, target)
        if head == data["new"]:
            done.append(f"the interrupted merge had already moved {target} to {str(data['new'])[:12]}")
        elif head == data.get("old"):
            lock_file = Path(root.out("rev-parse", "--git-path", "index.lock"))
            if not lock_file.is_absolute():
                lock_file = root.cwd / lock_file
            if lock_file.exists():
                raise MergeError(f"an interrupted merge into {target} left {lock_file} (or a git command is running "
                                 f"in {root.cwd}); if no git command is running, remove it and run `ov merge` again")
            restored, kept = roll_back_checkout(root, str(data["old"]), str(data["new"]))
            if restored:
                done.append(f"rolled back the half-updated files of an interrupted merge: {', '.join(restored)}")
            if kept:
                done.append(f"left as they are (changed since): {', '.join(kept)}")
    clear_journal(path)
    return done


def recover_all(repo_root: Path, lock_dir: Path) -> dict[str, list[str]]:
    """The watchdog's pass: every journal whose merge is not running (its lock is free). {target: what was done}."""
    from overstory.merge.worktree_state import toplevel

    found: dict[str, list[str]] = {}
    if not lock_dir.is_dir():
        return found
    root_path = toplevel(repo_root)
    for path in sorted(lock_dir.glob("merge-*.journal")):
        data = read_journal(path)
        target = str(data.get("target")) if data else None
        if not target:
            clear_journal(path)
            continue
        try:
            with TargetLock(lock_dir, target, 0):
                done = recover(Git(root_path), root_path, lock_dir, target)
        except LockHeld:
            continue  # that merge is running
        except MergeError as exc:  # e.g. a leftover index.lock: said, and tried again next time
            done = [str(exc)]
        if done:
            found[target] = done
    return found


def remove_worktree(root: Git, root_path: Path, path: Path) -> None:
    with worktree_admin_lock(root_path):
        root.run("worktree", "remove", "--force", "--force", str(path), check=False)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        root.run("worktree", "prune", check=False)
    if path.exists():
        raise MergeError(f"could not remove the temporary merge worktree {path}")


def _registered(root: Git, path: Path) -> bool:
    return f"worktree {path}".encode() in root.run("worktree", "list", "--porcelain", check=False).stdout


def roll_back_checkout(root: Git, old: str, new: str) -> tuple[list[str], list[str]]:
    """Put files a killed fast-forward from ``old`` to ``new`` left at ``new`` back to ``old``.

    Only a path whose file and index entry each hold exactly the ``old`` or the ``new``
    version is touched (nobody else's change can look like that); the rest is reported.
    """
    restored, kept = [], []
    for path in root.paths("diff", "--name-only", "--no-renames", "-z", old, new):
        in_old, in_new = root.rev(f"{old}:{path}"), root.rev(f"{new}:{path}")
        file = root.cwd / path
        on_disk = (os.fsdecode(root.run("hash-object", "--", path).stdout).strip()
                   if file.is_file() and not file.is_symlink() else None)
        indexed = root.rev(f":0:{path}")
        if on_disk == in_old and indexed == in_old:
            continue
        if on_disk not in (in_old, in_new) or indexed not in (in_old, in_new):
            kept.append(path)
            continue
        if in_old is None:
            root.run("rm", "-q", "--cached", "--ignore-unmatch", "--", path)
            if file.is_file():
                file.unlink()
        else:
            root.run("checkout", old, "--", path)
        restored.append(path)
    return restored, kept
