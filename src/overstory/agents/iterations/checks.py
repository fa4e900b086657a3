"""ov's own judgement of an iteration: the check command or a phase's gate, over the agent's branch.

The model never runs these for ov: the loop process does, after the iteration's turn. A
check runs agent-written code, so it runs as the agent's turns do (``sandbox.checks``): in
bubblewrap, with no agent secret, in a process group of its own that dies with the loop.
What it judges is a fresh checkout of the agent's branch (``sandbox.check_tree``), never the
worktree: ov first commits what the iteration left uncommitted (as a checkpoint does), so
the check judges exactly what the branch holds (no ignored file, nothing beside it), and the
loop's protected paths are put back as they are at the base; a change to one of them that
the operator did not allow (``--allow-protected``) fails the check. Its full output is kept
under the agent's logs; the loop keeps the tail (for the next iteration's message) and a
fingerprint of the failure (for "the same failure again": the exit code and output with
times, durations, addresses and temp paths blanked out).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory.agents.iterations.spec import PROGRESS_FILE
from overstory.errors import SandboxError
from overstory.sandbox import check_tree
from overstory.sandbox.checks import kill_leftover, loop_record, run_check

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths
    from overstory.store.sessions import Session

TIMED_OUT = 124
CANNOT_RUN = 126
_READ_LIMIT = 8 << 20
_NOISE = [
    re.compile(r"0x[0-9a-fA-F]+"),                                  # addresses
    re.compile(r"\d+(?:\.\d+)?\s*(?:ms|s|sec|secs|seconds|minutes?)\b"),  # durations
    re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?Z?"),  # timestamps
    re.compile(r"\d{2}:\d{2}:\d{2}"),                               # clock times
    re.compile(r"/tmp/\S+|/var/folders/\S+"),                        # temp paths
]


@dataclass(frozen=True)
class CheckResult:
    label: str          # what was checked, for people and the next message
    exit_code: int
    seconds: float
    tail: str           # the end of the output
    fingerprint: str | None  # None when it passed
    problem: str | None = None  # why it failed besides its exit code (a protected path changed)
    log: str | None = None      # the file that holds its whole output
    environment: dict[str, t.Any] | None = None  # where it ran: directory, commit, virtual environment, python

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


class CheckInterrupted(Exception):
    """The loop is stopping: the check was killed; the next loop process checks the iteration again."""


def fingerprint(exit_code: int, output: str) -> str:
    text = output
    for pattern in _NOISE:
        text = pattern.sub("#", text)
    text = " ".join(text.split())
    return hashlib.sha256(f"{exit_code}\n{text}".encode()).hexdigest()[:16]


def _result(label: str, code: int, started: float, output: str, tail: int, problem: str | None = None,
            log: Path | None = None, environment: dict[str, t.Any] | None = None, where: str = "") -> CheckResult:
    """``where`` (the checkout and the Python a failure ran with) ends the tail but not the fingerprint: the
    checkout's name is new each time, and the same failure must look the same."""
    shown = output + ("\n" + where if where else "")
    return CheckResult(label, code, time.monotonic() - started, shown[-tail:],
                       None if code == 0 else fingerprint(code, output), problem,
                       str(log) if log is not None else None, environment)


class LoopChecker:
    """The checks of one finished iteration: one checkout of the agent's last commit, every gate run over it.

    ``with LoopChecker(...) as checker: checker.run(gate, log_file)``. Entering kills a check that a
    dead loop of this agent left running and removes its checkout; the first gate makes the
    checkout, leaving removes it.
    """

    def __init__(self, project: ProjectPaths, config: Config, agent: Session, definition: t.Mapping[str, t.Any], *,
                 env: t.Mapping[str, str], should_stop: t.Callable[[], bool] | None = None,
                 commit_message: str | None = None) -> None:
        self.project, self.config, self.agent, self.env, self.should_stop = project, config, agent, env, should_stop
        self.commit_message = commit_message  # what ov commits the agent's leftovers with (None: it does not)
        self.root = project.root.resolve()
        self.ov_dir = self.root / project.ov_dir.name
        self.protected = list(definition.get("protected_paths") or [])
        self.allowed = list(definition.get("allow_protected") or [])
        self.record = loop_record(project.run_dir, agent.name)
        self.tree: Path | None = None
        self.head: str | None = None          # the commit checked
        self.broken: str | None = None        # why no checkout could be made (every gate fails with it)
        self.changes: list[check_tree.Change] = []
        self.notes: list[str] = []            # told to the model after the output

    def __enter__(self) -> t.Self:
        kill_leftover(self.record)
        for old in check_tree.leftovers(self.ov_dir, self.agent.name):
            check_tree.remove(self.root, old)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.tree is not None:
            check_tree.remove(self.root, self.tree)

    @property
    def violations(self) -> list[check_tree.Change]:
        return [c for c in self.changes if not c.allowed]

    def _checkout(self) -> None:
        agent = self.agent
        from overstory import sandbox

        if agent.branch and agent.worktree and sandbox.effective_mode(self.config).name == "bwrap":
            sandbox.take_back(self.project, agent)  # the turn's last commits, if its loop died before it took them
        if agent.branch and agent.worktree and self.commit_message:
            check_tree.commit_leftovers(Path(agent.worktree), agent.branch, self.commit_message)
        head = check_tree.commit_of(self.root, f"refs/heads/{agent.branch}" if agent.branch else "HEAD")
        if head is None:
            raise OSError(f"{agent.branch or 'HEAD'} names no commit")
        base = check_tree.base_of(self.root, head, (agent.spec or {}).get("base_commit"), agent.base_branch)
        if self.protected and base is None:
            self.notes.append("[ov] the loop's base commit is unknown: its protected paths are not pinned")
        if self.protected and base is not None:
            self.changes = check_tree.protected_changes(self.root, base, head, self.protected, self.allowed)
        tree = check_tree.scratch_dir(self.ov_dir, agent.name)
        self.tree, self.head = tree, head
        check_tree.checkout(self.root, head, tree, base=base, pinned=[c.path for c in self.violations])
        if agent.worktree:
            left = check_tree.uncommitted(Path(agent.worktree), ignore=[PROGRESS_FILE])
            if left:
                shown = ", ".join(left[:10]) + (" ..." if len(left) > 10 else "")
                self.notes.append(f"[ov] not checked, because git would not commit them: {shown}")
        if self.violations:
            pinned = ", ".join(c.path for c in self.violations)
            self.notes.append(f"[ov] {self.problem}: the check ran with them as they are at the base "
                              f"{(base or '')[:12]}, and fails until they are back (git checkout {(base or '')[:12]} -- "
                              f"{pinned}; a file the base lacks: git rm it); only the operator can allow a change "
                              "there (ov loop --allow-protected PATH)")

    @property
    def problem(self) -> str | None:
        return f"protected path(s) changed: {check_tree.describe(self.violations)}" if self.violations else None

    def run(self, gate: dict[str, t.Any], log_file: Path | None = None) -> CheckResult:
        settings = self.config.loop
        label = gate["command"] if gate["kind"] == "command" else f"files: {gate['glob']} >= {gate['min']}"
        started = time.monotonic()
        if self.tree is None and self.broken is None:
            try:
                self._checkout()
            except (subprocess.CalledProcessError, OSError, SandboxError) as exc:
                detail = " ".join(str(getattr(exc, "stderr", None) or exc).split())[:400]
                self.broken = f"[ov] could not check out the agent's last commit: {detail}"
        if self.broken is not None or self.tree is None:
            return _result(label, CANNOT_RUN, started, self.broken or "[ov] no checkout", settings.output_tail)
        environment: dict[str, t.Any] | None = None
        log: Path | None = None
        if gate["kind"] == "files":
            code, output = _count_files(gate, self.tree)
        else:
            log = self._log(log_file)
            code, output, environment = self._command(gate["command"], log)
        notes = "\n".join(self.notes)
        output = output + ("\n" + notes if notes else "")
        if self.violations and code == 0:
            code = 1
        where = str(environment.pop("note", "")) if environment else ""
        return _result(label, code, started, output, settings.output_tail, self.problem, log, environment,
                       where=where if code != 0 else "")

    def _log(self, log_file: Path | None) -> Path:
        return log_file or (self.project.run_dir / self.agent.name / "check-output.txt")

    def _command(self, command: str, log: Path) -> tuple[int, str, dict[str, t.Any]]:
        """(exit code, output, where it ran). A failure's output ends with where and with which Python."""
        assert self.tree is not None
        settings = self.config.loop
        where: dict[str, t.Any] = {"cwd": str(self.tree), "commit": self.head, "venv": None, "python": None}
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            out.write(f"$ {command}\n".encode())
            out.flush()
            try:
                ran = run_check(self.project, self.config, command, self.tree, capability=self.agent.capability,
                                environ=self.env, timeout=settings.check_timeout, output=out, record=self.record,
                                should_stop=self.should_stop)
            except SandboxError as exc:
                out.write(f"[ov] the check did not run: {exc}\n".encode())
                return CANNOT_RUN, f"[ov] the check did not run: {exc}", where
            if ran.stopped:
                raise CheckInterrupted(command)
            code = TIMED_OUT if ran.timed_out else t.cast(int, ran.exit_code)
            note = f"\n[ov] the check was stopped after {settings.check_timeout:g}s (loop.check_timeout)" \
                if ran.timed_out else ""
            if ran.environment is not None:
                where.update(ran.environment.as_dict())
                # What a person (or the next iteration) needs to tell a broken set-up from a bug.
                shown = self.tree.relative_to(self.root) if self.tree.is_relative_to(self.root) else self.tree
                where["note"] = (f"[ov] the check ran in a checkout of {(self.head or '?')[:12]} ({shown}); "
                                 f"{ran.environment.describe()}")
            # After the footer: the output (and so the failure's fingerprint) ends before it.
            after = where["note"] + "\n" if code != 0 and where.get("note") else ""
            out.write(f"{note}\n[exit {code}]\n{after}".encode())
        return code, _output_of(log, len(f"$ {command}\n".encode())), where


def _output_of(log: Path, skip: int) -> str:
    """The check's output from its log (the header line skipped, the footer left out; at most the end)."""
    with open(log, "rb") as handle:
        size = handle.seek(0, 2)
        start = max(skip, size - _READ_LIMIT)
        handle.seek(start)
        data = handle.read()
    text = data.decode("utf-8", errors="replace")
    footer = text.rfind("\n[exit ")
    return text[:footer] if footer >= 0 else text


def _count_files(gate: dict[str, t.Any], tree: Path) -> tuple[int, str]:
    matches = sorted(str(p.relative_to(tree)) for p in tree.glob(gate["glob"])
                     if p.is_file() and ".git" not in p.relative_to(tree).parts)
    enough = len(matches) >= int(gate["min"])
    listing = ", ".join(matches[:50]) + (" ..." if len(matches) > 50 else "")
    output = (f"{len(matches)} file(s) match `{gate['glob']}` in the last commit (the gate needs at least "
              f"{gate['min']})" + (f": {listing}" if matches else ""))
    return (0 if enough else 1), output


def progress_text(worktree: Path | None, limit: int = 8000) -> str | None:
    """The progress file the agent keeps (its end, when long); None when there is none."""
    if worktree is None:
        return None
    try:
        text = (worktree / PROGRESS_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text if len(text) <= limit else "[...]\n" + text[-limit:]


def progress_summary(text: str | None) -> str | None:
    """The progress file's summary: its first non-empty line, without markdown heading marks."""
    for line in (text or "").splitlines():
        line = line.strip().lstrip("#").strip()
        if line and line != "[...]":
            return line[:200]
    return None
