"""Hostile input: each case gets one clear line naming the problem, a non-zero exit, and no change.

Every row of the table runs the real `ov` as a subprocess and checks the exit code, that
stderr names the problem (never "internal error" or a traceback) and that a checksum of
the logical content of state.db and events.db (their SQL dump) is the same before and
after. Usage errors are click's own format (``Usage: ...`` / ``Error: ...``, exit 2), as
the README describes.

The read-only `.overstory/` and the full disk are real: a read-only bind mount and a
small tmpfs mounted by the test (root is needed; without it those cases are skipped and
say why).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import subprocess
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import make_repo, ov_command, run_git, run_ov
from overstory.paths import ProjectPaths
from requires import missing

BIG = 2**64


def db_checksum(project: ProjectPaths) -> str:
    """sha256 of the SQL dump of both databases (logical content, not file bytes)."""
    digest = hashlib.sha256()
    for path in (project.state_db, project.events_db):
        conn = sqlite3.connect(path)
        try:
            for line in conn.iterdump():
                digest.update(line.encode())
        finally:
            conn.close()
    return digest.hexdigest()


def _drop_table(db: str, table: str) -> t.Callable[[ProjectPaths], None]:
    def setup(project: ProjectPaths) -> None:
        conn = sqlite3.connect(getattr(project, db))
        conn.execute(f"DROP TABLE {table}")
        conn.commit()
        conn.close()
    return setup


def _binary_config(project: ProjectPaths) -> None:
    project.config_file.write_bytes(bytes(range(256)) * 4)


@contextlib.contextmanager
def read_only(path: Path) -> t.Iterator[None]:
    """``path`` as a read-only bind mount of itself (root ignores permission bits, not mount flags)."""
    done = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        missing(f"cannot bind-mount {path} read-only (needs root and mount): {done.stderr.strip()}")
    try:
        remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], capture_output=True, text=True)
        if remount.returncode != 0:
            missing(f"cannot remount {path} read-only: {remount.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@dataclass
class Case:
    id: str
    args: list[str]
    message: str
    exit_code: int
    setup: t.Callable[[ProjectPaths], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    stdin: str | None = None  # a file to read stdin from
    read_only_ov_dir: bool = False
    click_usage: bool = False  # click's own "Usage: ... Error: ..." format


DEEP = "[" * 60_000 + "]" * 60_000
CASES = [
    Case("id over 2^63 (read)", ["mail", "read", str(BIG)], "not in the range 1<=x<=9223372036854775807", 2,
         click_usage=True),
    Case("id over 2^63 (reply-to)", ["mail", "send", "--to", "operator", "--subject", "s", "--reply-to", str(BIG)],
         "not in the range", 2, click_usage=True),
    Case("id over 2^63 (thread)", ["mail", "list", "--thread", str(BIG + 1)], "not in the range", 2, click_usage=True),
    Case("60k-deep JSON payload", ["mail", "send", "--to", "operator", "--subject", "s", "--payload", DEEP],
         "nested too deeply", 2, click_usage=True),
    Case("100-deep JSON payload", ["mail", "send", "--to", "operator", "--subject", "s", "--payload",
                                   '{"a": ' + "[" * 100 + "]" * 100 + "}"], "nested too deeply", 1),
    Case("--body-file /dev/zero", ["mail", "send", "--to", "operator", "--subject", "s", "--body-file", "/dev/zero"],
         "larger than the limit of 1048576 bytes", 2),
    Case("--body - from /dev/zero", ["mail", "send", "--to", "operator", "--subject", "s", "--body", "-"],
         "larger than the limit of 1048576 bytes", 2, stdin="/dev/zero"),
    Case("--spec /dev/zero", ["sling", "builder", "t1", "--runtime", "scripted", "--spec", "/dev/zero"],
         "larger than the limit", 2),
    Case("binary config.yaml", ["config"], "not a text file", 1, setup=_binary_config),
    Case("binary config.yaml (sling)", ["sling", "builder", "t1", "--runtime", "scripted"], "not a text file", 1,
         setup=_binary_config),
    Case("state.db missing a table (read)", ["mail", "check"], "state.db has no table 'mail'", 1,
         setup=_drop_table("state_db", "mail")),
    Case("state.db missing a table (write)", ["mail", "send", "--to", "operator", "--subject", "s"],
         "has no table 'mail': the database is damaged; run `ov doctor`", 1, setup=_drop_table("state_db", "mail")),
    Case("state.db missing a table (status)", ["status"], "has no table 'mail'", 1,
         setup=_drop_table("state_db", "mail")),
    Case("events.db missing a table", ["feed"], "events.db has no table 'events'", 1,
         setup=_drop_table("events_db", "events")),
    Case("watchdog on a read-only .overstory/", ["watchdog", "--once"],
         "the watchdog cannot write its lock", 1, read_only_ov_dir=True),
    Case("agent name ending in a newline", ["sling", "builder", "t1", "--runtime", "scripted", "--name", "x\n"],
         "invalid agent name 'x\\n'", 2),
    Case("task id ending in a newline", ["sling", "builder", "t1\n", "--runtime", "scripted"],
         "invalid task id 't1\\n'", 2),
    Case("unknown OV_ variable", ["config"], "unknown variable OV_TURNS_STALL_TIMOUT (expected one of: "
         "OV_TURNS_STALL_TIMEOUT", 1, env={"OV_TURNS_STALL_TIMOUT": "30"}),
    Case("unknown OV_ variable (sling)", ["sling", "builder", "t1", "--runtime", "scripted"],
         "unknown variable OV_BOGUS", 1, env={"OV_BOGUS": "1"}),
    Case("watchdog --interval nan", ["watchdog", "--interval", "nan"], "must be a number of seconds greater than 0",
         2, click_usage=True),
    Case("usage error stays click's", ["mail", "send", "--to", "operator"], "Missing option '--subject'", 2,
         click_usage=True),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(project: ProjectPaths, case: Case) -> None:
    if case.setup is not None:
        case.setup(project)
    before = db_checksum(project)
    with contextlib.ExitStack() as stack:
        if case.read_only_ov_dir:
            stack.enter_context(read_only(project.ov_dir))
        stdin = stack.enter_context(open(case.stdin, "rb")) if case.stdin else subprocess.DEVNULL
        done = subprocess.run([*ov_command(), *case.args], cwd=project.root, env={**os.environ, **case.env},
                              stdin=stdin, capture_output=True, timeout=60)
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == case.exit_code, stderr
    assert case.message in stderr, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    if case.click_usage:
        assert stderr.startswith("Usage: ov ") and "\nError: " in stderr, stderr
    else:
        assert stderr.startswith("ov: error: ") and len(stderr.strip().splitlines()) == 1, stderr
    assert db_checksum(project) == before
    assert run_git(project.root, "branch", "--list", "ov/*").strip() == ""  # no spawn got anywhere


def test_doctor_names_the_missing_table_and_repairs_it(project: ProjectPaths) -> None:
    _drop_table("state_db", "mail")(project)
    report = run_ov("doctor", cwd=project.root)
    assert report.returncode == 1
    assert "is missing table mail" in report.stdout and "ov doctor --repair" in report.stdout
    repaired = run_ov("doctor", "--repair", cwd=project.root)
    assert repaired.returncode == 0 and "recreated the missing table mail" in repaired.stdout
    assert run_ov("mail", "send", "--to", "operator", "--subject", "works again", cwd=project.root).returncode == 0
    assert run_ov("doctor", cwd=project.root).returncode == 0


# ---- a full disk -----------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> t.Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        missing(f"cannot mount a tmpfs for the full-disk test (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def _fill(disk: Path) -> None:
    """Write zeros until the file system refuses even a single block."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 16, 1 << 12, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


def test_full_disk_nothing_is_written(small_disk: Path, tmp_path: Path) -> None:
    from overstory.project.init import init_project

    root = make_repo(small_disk / "repo")
    init_project(root)
    project = ProjectPaths(root)
    assert run_ov("mail", "send", "--to", "operator", "--subject", "before", cwd=root).returncode == 0
    before = db_checksum(project)
    wal_files = [p for db in (project.state_db, project.events_db) for p in (Path(f"{db}-wal"), Path(f"{db}-shm"))]
    assert not any(p.exists() for p in wal_files), "every connection closed cleanly"

    # 1. No room for SQLite's -wal/-shm files: the database cannot even be opened.
    _fill(small_disk)
    opened = run_ov("mail", "send", "--to", "operator", "--subject", "s", cwd=root)
    assert opened.returncode == 1, opened.stderr
    assert "no space left on device" in opened.stderr and "nothing was written" in opened.stderr, opened.stderr
    assert len(opened.stderr.strip().splitlines()) == 1 and "Traceback" not in opened.stderr
    (small_disk / "filler").unlink()
    assert db_checksum(project) == before

    # 2. The files exist (a connection holds them open), the write itself meets the full disk.
    big = tmp_path / "big.txt"
    big.write_text("x" * 700_000)
    holders = [sqlite3.connect(db) for db in (project.state_db, project.events_db)]
    for conn in holders:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    _fill(small_disk)
    try:
        sent = run_ov("mail", "send", "--to", "operator", "--subject", "s", "--body-file", str(big), cwd=root)
        assert sent.returncode == 1, sent.stderr
        assert "no space left on device" in sent.stderr and "nothing was written" in sent.stderr, sent.stderr
        assert len(sent.stderr.strip().splitlines()) == 1 and "Traceback" not in sent.stderr
        slung = run_ov("sling", "builder", "t1", "--runtime", "scripted", cwd=root)
        assert slung.returncode == 1, slung.stderr
        assert "no space left" in slung.stderr and "nothing was written" in slung.stderr, slung.stderr
        assert len(slung.stderr.strip().splitlines()) == 1 and "Traceback" not in slung.stderr
    finally:
        (small_disk / "filler").unlink()
        for conn in holders:
            conn.close()
    assert db_checksum(project) == before
    assert run_git(root, "branch", "--list", "ov/*").strip() == ""
    assert not (project.worktrees_dir / "builder-t1").exists()
    assert run_ov("mail", "send", "--to", "operator", "--subject", "after", cwd=root).returncode == 0
