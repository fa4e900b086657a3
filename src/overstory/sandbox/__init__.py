"""Every turn of every agent runs inside a bubblewrap sandbox (docs/security.md).

The one entry point is ``prepare_turn``: the headless turn runner and tmux mode call it
with the runtime's command line and get back the command line to run. It also does the
housekeeping that must happen outside, while no sandbox of the agent runs: the runtime's
state dir, the writer's private copy of its branch (``gitrefs``), stale lock files.
``take_back`` brings a writer's branch out after a turn (and periodically for tmux).

``sandbox.mode``: ``auto`` (bwrap where the probe shows it works, else off), ``bwrap``
(required) or ``off``. Off means the guard is the only layer: ``ov sling`` and ``ov doctor``
say so.
"""

from __future__ import annotations

import os
import typing as t

from overstory.config.snapshot import network_for
from overstory.errors import OrchestratorError, SandboxError
from overstory.records import Record
from overstory.runtimes import get_runtime
from overstory.sandbox import gitrefs
from overstory.sandbox.bwrap import build_argv
from overstory.sandbox.layout import Layout, layout_for
from overstory.sandbox.probe import INSTALL_HINT
from overstory.sandbox.probe import probe as probe_bwrap

if t.TYPE_CHECKING:
    from overstory.config.model import Config
    from overstory.paths import ProjectPaths
    from overstory.store.sessions import Session

OFF_WARNING = ("sandbox.mode is off: agents run without a kernel boundary and ov's guard is the only layer "
               "between them and your files (docs/security.md)")

TakeBack = gitrefs.TakeBack

__all__ = ["OFF_WARNING", "Prepared", "TakeBack", "effective_mode", "prepare_turn", "take_back"]


class Mode(Record):
    """The sandbox a turn gets here (``effective_mode``)."""

    __slots__ = ("name", "reason")

    name: str     # "bwrap" or "off"
    reason: str   # why: configured, or what the probe found


def effective_mode(config: Config) -> Mode:
    """What ``sandbox.mode`` means on this machine; SandboxError when ``bwrap`` is required but does not work."""
    wanted = config.sandbox.mode
    if wanted == "off":
        return Mode("off", "sandbox.mode: off")
    found = probe_bwrap()
    if found.ok:
        return Mode("bwrap", found.detail)
    if wanted == "bwrap":
        raise SandboxError(f"sandbox.mode is bwrap but {found.detail}: {INSTALL_HINT}")
    return Mode("off", f"sandbox.mode: auto, and {found.detail}")


class Prepared(Record):
    """A turn's command line and environment, ready to start (``prepare_turn``)."""

    __slots__ = ("argv", "env", "layout", "sandboxed", "took_back")

    argv: list[str]
    env: dict[str, str]
    layout: Layout
    sandboxed: bool
    took_back: gitrefs.TakeBack  # what was pending from the last turn (see gitrefs.prepare)


def prepare_turn(project: ProjectPaths, config: Config, agent: Session, argv: t.Sequence[str],
                 env: t.Mapping[str, str], *, launch_env: t.Mapping[str, str], tty: bool = False) -> Prepared:
    """Housekeeping for ``agent``'s next turn and the command line that runs ``argv`` (with the turn's
    ``env``) in its sandbox.

    ``launch_env``: the environment the agent was slung from (the runtime seeds its state dir from
    the user's own config there). ``tty``: the command is a TUI that needs its terminal (tmux mode).
    """
    runtime = get_runtime(agent.runtime)
    layout = layout_for(project, agent, runtime)
    if layout.state_dir is not None:
        runtime.prepare_state(layout.state_dir, launch_env, layout.cwd)
    mode = effective_mode(config)
    if mode.name == "off":
        return Prepared(list(argv), dict(env), layout, False, gitrefs.TakeBack("none"))
    took_back = gitrefs.prepare(layout)
    # `ov serve`'s secret must exist to be masked (a mount needs its target): make it now if it does not.
    from overstory.serve_token import ensure_token

    try:
        ensure_token(project)
    except (OrchestratorError, OSError):
        pass  # an unusable token file is still masked; `ov serve` reports it
    inside = dict(env)
    params = bwrap_params(config, agent, layout, env, tty=tty)
    if _own_tmpdir(env.get("TMPDIR"), layout) is None:
        inside["TMPDIR"] = "/tmp"  # a host temp dir would be read-only (or shared) in here
    for name in runtime.tmp_env_vars:
        if name in inside:
            inside[name] = "/tmp"
    if not layout.writer:
        inside["GIT_OPTIONAL_LOCKS"] = "0"  # a read-only tree: git need not even try to refresh an index
        inside["PYTHONDONTWRITEBYTECODE"] = "1"
    found = probe_bwrap()
    assert found.path is not None
    wrapped = build_argv(found.path, layout, argv, **params)
    return Prepared(wrapped, inside, layout, True, took_back)


def bwrap_params(config: Config, agent: Session, layout: Layout, env: t.Mapping[str, str], *,
                 tty: bool = False) -> dict[str, t.Any]:
    """``build_argv``'s settings for ``agent``'s turn (a node that runs the turn builds the same command line)."""
    writable = list(config.sandbox.writable)
    own_tmp = _own_tmpdir(env.get("TMPDIR"), layout)
    if own_tmp is not None:  # the runtime keeps a temp dir of its own in the agent's run dir: writable
        writable.append(own_tmp)
    return {"network": network_for(config.sandbox, agent.capability), "tty": tty,
            "tmp_size_mb": config.sandbox.tmp_size_mb, "writable": writable}


def _own_tmpdir(tmpdir: str | None, layout: Layout) -> str | None:
    """TMPDIR when the runtime put it in the agent's own run dir (codex beside its home), else None."""
    if not tmpdir:
        return None
    real = os.path.realpath(tmpdir)
    return real if os.path.isdir(real) and real.startswith(str(layout.run) + os.sep) else None


def take_back(project: ProjectPaths, agent: Session) -> gitrefs.TakeBack:
    """Bring a writer's branch out of its sandbox (a no-op for readers, and when nothing changed)."""
    try:
        layout = layout_for(project, agent, get_runtime(agent.runtime))
    except SandboxError as exc:
        return gitrefs.TakeBack("none", str(exc))
    return gitrefs.take_back(layout)
