"""Measuring tools shared by the figures: statistics, timed processes, throw-away projects.

Nothing here asserts a timing. Every number is a sample list summarised as
median/min/max (and p99 where a tail matters); ratios compare medians taken in the
same run, with the baseline interleaved with the measured command so that drift
(thermal, other load) hits both alike.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "ov bench", "GIT_AUTHOR_EMAIL": "bench@ov.invalid",
    "GIT_COMMITTER_NAME": "ov bench", "GIT_COMMITTER_EMAIL": "bench@ov.invalid",
}


# ---- statistics ------------------------------------------------------------------


@dataclass
class Stats:
    """A summary of samples (in the unit the caller chose)."""

    samples: list[float]

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile (p in 0..100)."""
        ordered = sorted(self.samples)
        rank = max(1, min(len(ordered), int(-(-p * len(ordered) // 100))))
        return ordered[rank - 1]

    def summary(self, digits: int = 2) -> dict[str, t.Any]:
        return {"median": round(self.median, digits), "min": round(self.min, digits),
                "max": round(self.max, digits), "n": self.n}


def row(figure: int, name: str, unit: str, stats: Stats | None = None, *, value: float | None = None,
        ratio: float | None = None, baseline: str | None = None, target: str | None = None,
        met: bool | None = None, note: str | None = None, digits: int = 2, **extra: t.Any) -> dict[str, t.Any]:
    """One line of the results table (and of the JSON file)."""
    entry: dict[str, t.Any] = {"figure": figure, "name": name, "unit": unit}
    if stats is not None:
        entry.update(stats.summary(digits))
    elif value is not None:
        entry["value"] = round(value, digits)
    if ratio is not None:
        entry["ratio"] = round(ratio, 3)
        entry["baseline"] = baseline
    if target is not None:
        entry["target"] = target
        entry["met"] = met
    if note:
        entry["note"] = note
    entry.update(extra)
    return entry


def add_note(rows: list[dict[str, t.Any]], text: str, figure: int | None = None) -> None:
    """A free-text line in the table (a failed check, a caveat)."""
    number = figure if figure is not None else (rows[0]["figure"] if rows else 0)
    rows.append({"figure": number, "name": "note", "unit": "", "note": text})


def not_available(figure: int, name: str, why: str) -> dict[str, t.Any]:
    return {"figure": figure, "name": name, "unit": "", "not_available": why}


# ---- the machine and the interpreter ----------------------------------------------


def find_ov() -> str:
    """The `ov` script of the Python running the bench (skips pyenv shims); else PATH."""
    candidate = Path(sys.executable).parent / "ov"
    if candidate.is_file():
        return str(candidate)
    found = shutil.which("ov")
    if found is None:
        raise SystemExit("bench: no `ov` script next to this Python or on PATH; `pip install -e .` first")
    return found


def script_interpreter(script: str) -> str | None:
    """The interpreter named on a script's #! line (None for a binary or a shim without one)."""
    try:
        with open(script, "rb") as handle:
            first = handle.readline(300)
    except OSError:
        return None
    return first[2:].decode(errors="replace").strip() if first.startswith(b"#!") else None


def _first_line(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def machine_info() -> dict[str, t.Any]:
    memory_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_kb = int(line.split()[1])
    except OSError:
        pass
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "kernel": platform.release(), "python": sys.version.split()[0], "python_executable": sys.executable,
        "sqlite": sqlite3.sqlite_version, "git": _first_line(["git", "--version"]),
    }


def commit_info() -> dict[str, t.Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                              check=False).stdout.strip()

    dirty = bool(git("status", "--porcelain", "--untracked-files=no", "--", "src"))
    untracked_src = bool(git("status", "--porcelain", "--", "src"))
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown", "src_modified_since_commit": dirty or untracked_src}


def bytecode_state(environ: t.Mapping[str, str] = os.environ) -> dict[str, t.Any]:
    """Whether imports of ov's own modules can use cached bytecode in this environment."""
    import overstory

    package_dir = Path(overstory.__file__).parent
    return {
        "PYTHONDONTWRITEBYTECODE": environ.get("PYTHONDONTWRITEBYTECODE"),
        "PYTHONPYCACHEPREFIX": environ.get("PYTHONPYCACHEPREFIX"),
        "overstory_pycache_present": (package_dir / "__pycache__").is_dir(),
        "overstory_source": str(package_dir),
    }


# ---- environments ---------------------------------------------------------------------


def clean_env(bytecode: str = "asis", pycache_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The bench's environment without any OVERSTORY_* or OV_* variables, plus a git identity.

    ``bytecode``: ``asis`` leaves the caller's setting; ``on`` lets Python write and
    read .pyc files under ``pycache_dir`` (PYTHONPYCACHEPREFIX, so the source tree is
    not touched); ``off`` sets PYTHONDONTWRITEBYTECODE=1, as this sandbox does.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERSTORY_", "OV_"))}
    for name in ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT"):
        env.pop(name, None)
    env.update(GIT_IDENTITY)
    if bytecode == "on":
        if pycache_dir is None:
            raise ValueError("bytecode 'on' needs a pycache_dir")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache_dir)
    elif bytecode == "off":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    env.update(extra)
    return env


# ---- timed processes --------------------------------------------------------------


@dataclass
class Command:
    """A whole process to time: argv, stdin bytes, environment, working directory."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path | str | None = None
    stdin: bytes = b""
    # Called with the CompletedProcess; returns an error text or None. Default: exit 0.
    check: t.Callable[[subprocess.CompletedProcess[bytes]], str | None] | None = None
    before: t.Callable[[], None] | None = None  # untimed preparation before each run


def _run_once(command: Command, cpu: list[float] | None = None) -> tuple[float, str | None]:
    """Wall time of one run; with ``cpu``, its user + system CPU time (ms) is appended there too."""
    import resource

    if command.before is not None:
        command.before()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command.argv, input=command.stdin, capture_output=True, env=command.env,
                          cwd=command.cwd, check=False)
    elapsed_ms = (time.perf_counter() - started) * 1000
    if cpu is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    if command.check is not None:
        problem = command.check(done)
    else:
        problem = None if done.returncode == 0 else f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
    return elapsed_ms, problem


def time_interleaved(commands: dict[str, Command], *, rounds: int, warmup: int,
                     cpu: dict[str, list[float]] | None = None) -> tuple[dict[str, Stats], list[str]]:
    """Run every command once per round, in a rotating order; returns ms stats and errors.

    Warm-up rounds (page cache, .pyc files, SQLite pages) are run and discarded. With ``cpu``,
    each command's CPU time per measured run (ms) is collected there, by name.
    """
    names = list(commands)
    samples: dict[str, list[float]] = {name: [] for name in names}
    errors: list[str] = []
    for index in range(warmup + rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            spent: list[float] | None = [] if cpu is not None and index >= warmup else None
            elapsed, problem = _run_once(commands[name], spent)
            if cpu is not None and spent:
                cpu.setdefault(name, []).extend(spent)
            if problem:
                errors.append(f"{name}: {problem}")
            if index >= warmup:
                samples[name].append(elapsed)
    return {name: Stats(values) for name, values in samples.items()}, errors


def time_calls(function: t.Callable[[], t.Any], *, repeat: int, warmup: int,
               before: t.Callable[[], t.Any] | None = None) -> Stats:
    """In-process timing of ``function`` in milliseconds (``before`` runs untimed)."""
    samples = []
    for index in range(warmup + repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        function()
        elapsed = (time.perf_counter() - started) * 1000
        if index >= warmup:
            samples.append(elapsed)
    return Stats(samples)


# ---- processes the bench starts ----------------------------------------------------


def start_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rfind(")") + 2:].split()[19])


def alive(pid: int | None, ticks: int | None) -> bool:
    if not pid:
        return False
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0] not in ("Z", "X") and (ticks is None or int(fields[19]) == ticks)


@dataclass
class Started:
    pid: int
    ticks: int | None
    popen: subprocess.Popen[bytes] | None = None


@dataclass
class ProcessRegistry:
    """Process groups the bench started (directly, or through `ov sling`), killed at the end.

    Each entry is a group leader recorded with its start ticks, so a reused pid is
    never signalled.
    """

    groups: list[Started] = field(default_factory=list)

    def start(self, argv: list[str], **kwargs: t.Any) -> Started:
        popen = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs)
        entry = Started(popen.pid, start_ticks(popen.pid), popen)
        self.groups.append(entry)
        return entry

    def adopt(self, pid: int, ticks: int | None) -> None:
        """A group leader someone else started for us (an agent loop `ov sling` started)."""
        self.groups.append(Started(pid, ticks))

    def stop(self, entry: Started, grace: float = 2.0) -> None:
        if entry.popen is not None and entry.popen.poll() is not None:
            return
        if not alive(entry.pid, entry.ticks):
            return
        try:
            os.killpg(entry.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and alive(entry.pid, entry.ticks):
            if entry.popen is not None and entry.popen.poll() is not None:
                break
            time.sleep(0.02)
        if alive(entry.pid, entry.ticks):
            try:
                os.killpg(entry.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if entry.popen is not None:
            try:
                entry.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def stop_all(self) -> None:
        for entry in reversed(self.groups):
            self.stop(entry)
        self.groups.clear()


def start_sleeper(registry: ProcessRegistry) -> Started:
    """A live process to stand in for agent loops in synthetic rows (so liveness checks pass)."""
    return registry.start(["sleep", "3600"])


# ---- repositories and projects ----------------------------------------------------------


def git(cwd: Path, *args: str, env: t.Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env=dict(env) if env is not None else {**os.environ, **GIT_IDENTITY})


def make_repo(root: Path, files: int = 3) -> Path:
    """A git repository on `main` with ``files`` small tracked files in one commit."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("# bench project\n")
    per_dir = 100
    for index in range(max(0, files - 1)):
        folder = root / "src" / f"pkg{index // per_dir:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"module_{index % per_dir:03d}.py").write_text(
            f'"""module {index}"""\n\n\ndef value_{index}():\n    return {index}\n')
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial commit")
    return root


def tracked_files(root: Path) -> int:
    return len(git(root, "ls-files").stdout.splitlines())


def init_project(root: Path) -> Path:
    from overstory.project.init import init_project as do_init

    do_init(root)
    return root


def temp_dir(parent: Path, prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def write_json(path: Path, document: t.Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")


def rss_kib(pid: int) -> dict[str, int] | None:
    """VmRSS/VmHWM from /proc/PID/status and Pss from smaps_rollup (KiB), or None if gone."""
    values: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0])
    except OSError:
        return None
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                values["Pss"] = int(line.split()[1])
    except OSError:
        pass
    return values
