"""Where everything one agent's sandbox shows, hides or makes writable lives on the host.

All paths are resolved (no symlinks): bubblewrap mounts on the real path, and a
symlink in a bind destination would be followed inside the sandbox.
"""

from __future__ import annotations

import typing as t
from dataclasses import dataclass
from pathlib import Path

from overstory import jsontext
from overstory.capabilities import WRITERS as WRITER_CAPABILITIES
from overstory.errors import SandboxError
from overstory.paths import ProjectPaths

if t.TYPE_CHECKING:
    from overstory.runtimes.base import Runtime
    from overstory.store.sessions import Session

PRIVATE_DIR = "sandbox"
# In the run dir: the files `ov sling` wrote into a runtime's own home (its instructions, the config that
# calls ov's guard). The home is writable in the sandbox; these files are bound read-only over themselves.
PINNED_FILES = "pinned-files.json"  # under the agent's run dir: what ov hands into (and reads back from) its sandbox
OWN_REFS = "refs/heads/ov"  # where every agent's branch ov/<agent> lives in the common git dir
OWN_LOGS = "logs/refs/heads/ov"


@dataclass(frozen=True)
class Layout:
    """Where one agent's sandbox puts things (the docstring also spares dataclasses an inspect.signature)."""

    root: Path                 # the main checkout
    ov_dir: Path               # <root>/.overstory
    runs: Path                 # <root>/.overstory/run (every agent's run dir)
    run: Path                  # this agent's run dir: ov's files, the endpoint socket
    worktrees: Path            # <root>/.overstory/worktrees
    worktree: Path | None      # this agent's worktree (None at the project root)
    cwd: Path
    writer: bool               # a writer gets its worktree (and its own branch) writable
    state_dir: Path | None     # the runtime's own state, writable
    git_dir: Path | None       # the common git dir of the project
    admin_dir: Path | None     # <git>/worktrees/<adm> of this agent's worktree
    branch: str | None         # ov/<agent>
    serve_token: Path | None = None  # `ov serve`'s secret, masked inside the sandbox
    pinned: tuple[Path, ...] = ()    # files in the state dir that ov wrote: read-only inside

    @property
    def private(self) -> Path:
        return self.run / PRIVATE_DIR

    @property
    def private_refs(self) -> Path:
        """Mounted over <git>/refs/heads/ov: the agent's branch and copies of the others'."""
        return self.private / "refs"

    @property
    def private_logs(self) -> Path:
        return self.private / "logs"

    @property
    def base_file(self) -> Path:
        """The agent's branch as ov handed it in, for the compare-and-swap when it is taken back."""
        return self.private / "base"

    @property
    def own_ref_name(self) -> str | None:
        """The agent's file name inside refs/heads/ov (its branch minus ``ov/``)."""
        if self.branch and self.branch.startswith("ov/") and "/" not in self.branch[3:]:
            return self.branch[3:]
        return None


def _git_dirs(root: Path, worktree: Path | None) -> tuple[Path | None, Path | None]:
    dot_git = root / ".git"
    if not dot_git.is_dir():
        return None, None  # a checkout whose .git is a file (itself a worktree, a submodule): no git view
    git_dir = dot_git.resolve()
    if worktree is None:
        return git_dir, None
    try:
        pointer = (worktree / ".git").read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SandboxError(f"cannot read {worktree / '.git'}: {exc.strerror or exc}") from None
    if not pointer.startswith("gitdir:"):
        raise SandboxError(f"{worktree / '.git'} is not a worktree's gitdir pointer")
    admin = Path(pointer[len("gitdir:"):].strip())
    admin = (worktree / admin).resolve() if not admin.is_absolute() else admin.resolve()
    if admin.parent != git_dir / "worktrees" or not admin.is_dir():
        raise SandboxError(f"{worktree} points at {admin}, not at an admin dir of {git_dir}")
    return git_dir, admin


def layout_for(project: ProjectPaths, agent: Session, runtime: Runtime) -> Layout:
    root = project.root.resolve()
    ov_dir = root / project.ov_dir.name
    run = ov_dir / "run" / agent.name
    worktree = Path(agent.worktree).resolve() if agent.worktree else None
    if worktree is not None and worktree.parent != ov_dir / "worktrees":
        raise SandboxError(f"the worktree of {agent.name} ({worktree}) is not under {ov_dir / 'worktrees'}")
    git_dir, admin_dir = _git_dirs(root, worktree)
    state = runtime.state_dir(run)
    return Layout(root=root, ov_dir=ov_dir, runs=ov_dir / "run", run=run, worktrees=ov_dir / "worktrees",
                  worktree=worktree, cwd=worktree or root,
                  writer=worktree is not None and agent.capability in WRITER_CAPABILITIES,
                  state_dir=state.resolve() if state is not None else None, git_dir=git_dir, admin_dir=admin_dir,
                  branch=agent.branch, serve_token=ov_dir / project.serve_token_file.name,
                  pinned=_pinned(run, state.resolve() if state is not None else None))


def _pinned(run: Path, state_dir: Path | None) -> tuple[Path, ...]:
    """The files ov wrote into the runtime's home at sling (only those inside it, only real files)."""
    if state_dir is None:
        return ()
    try:
        names = jsontext.loads((run / PINNED_FILES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    files = [Path(name).resolve() for name in names if isinstance(name, str)]
    return tuple(f for f in files if state_dir in f.parents and f.is_file())
