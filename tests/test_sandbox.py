"""The bubblewrap sandbox around every turn: its command line, a writer's branch, and escapes that fail.

Agents here run the built-in scripted runtime (no model needed) inside the real bubblewrap.
Escape commands are wrapped in ``python3 -c`` with the shell text base64-encoded, which the
guard allows for writers by design and cannot read: what stops them is the kernel. The
real-claude table is tests/e2e/test_containment.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from agent_helpers import wait_terminal
from conftest import run_git, run_ov
from overstory.config.model import load_config
from overstory.errors import SandboxError
from overstory.paths import ProjectPaths
from overstory.sandbox import effective_mode, gitrefs
from overstory.sandbox.bwrap import build_argv
from overstory.sandbox.layout import Layout
from sandbox_helpers import Snapshot, events_of, git_out, processes_with, requires_bwrap


def hidden(command: str) -> str:
    """A shell command the guard cannot read (an attacker's move): base64 in a python -c."""
    encoded = base64.b64encode(command.encode()).decode()
    return f"python3 -c \"import base64,subprocess;subprocess.run(base64.b64decode('{encoded}').decode(),shell=True)\""


def sling_scripted(project: ProjectPaths, task: str, turns: list[dict], *, capability: str = "builder",
                   env: dict[str, str] | None = None, base: str | None = None) -> str:
    scenario = project.ov_dir / f"scenario-{task}.json"
    scenario.write_text(json.dumps({"turns": turns}))
    args = ["sling", capability, task, "--runtime", "scripted", "--scenario", str(scenario)]
    done = run_ov(*args, *(["--base-branch", base] if base else []), cwd=project.root, env=env)
    assert done.returncode == 0, done.stderr
    return f"{capability}-{task}"


REPORT = {"bash": 'ov mail send --type worker_done --subject "done ${OVERSTORY_TASK_ID}" --body finished'}


# ---- the command line -------------------------------------------------------------------------


def _layout(tmp_path: Path, *, writer: bool) -> Layout:
    root = tmp_path / "repo"
    for path in (root / ".git" / "objects" / "pack", root / ".git" / "refs" / "heads" / "ov",
                 root / ".git" / "worktrees" / "b", root / ".overstory" / "run" / "b" / "claude",
                 root / ".overstory" / "worktrees" / "b"):
        path.mkdir(parents=True, exist_ok=True)
    (root / ".git" / "config").write_text("")
    (root / ".overstory" / "serve-token").write_text("t" * 32)
    run = root / ".overstory" / "run" / "b"
    return Layout(root=root, ov_dir=root / ".overstory", runs=run.parent, run=run,
                  worktrees=root / ".overstory" / "worktrees", worktree=root / ".overstory" / "worktrees" / "b",
                  cwd=root / ".overstory" / "worktrees" / "b", writer=writer, state_dir=run / "claude",
                  git_dir=root / ".git", admin_dir=root / ".git" / "worktrees" / "b", branch="ov/b",
                  serve_token=root / ".overstory" / "serve-token")


def _pairs(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == option]


def test_the_command_line_drops_capabilities_and_mounts_in_order(tmp_path: Path) -> None:
    layout = _layout(tmp_path, writer=True)
    argv = build_argv("bwrap", layout, ["claude", "-p"], network=True, tty=False, tmp_size_mb=64)
    assert argv[:4] == ["bwrap", "--ro-bind", "/", "/"]  # the machine, read-only, first
    assert argv[argv.index("--cap-drop") + 1] == "ALL"  # mandatory as root
    for flag in ("--unshare-pid", "--die-with-parent", "--new-session", "--unshare-ipc"):
        assert flag in argv
    assert "--unshare-net" not in argv
    assert argv[-3:] == ["--", "claude", "-p"] and argv[argv.index("--chdir") + 1] == str(layout.cwd)
    # `ov serve`'s secret (its API acts as the operator) is masked.
    assert ("--ro-bind", "/dev/null", str(layout.serve_token)) in list(zip(argv, argv[1:], argv[2:]))
    runs, own_run = str(layout.runs), str(layout.run)
    # Other agents' run dirs (sockets, keys) are hidden: a tmpfs over them, then the own one, read-only.
    assert argv.index(runs) < argv.index(own_run) and own_run in _pairs(argv, "--ro-bind")
    assert str(layout.state_dir) in _pairs(argv, "--bind")
    # The own worktree writable, its .git pointer not; other worktrees hidden.
    assert str(layout.worktree) in _pairs(argv, "--bind")
    assert str(layout.worktree / ".git") in _pairs(argv, "--ro-bind")
    assert str(layout.worktrees) in _pairs(argv, "--tmpfs")
    # git: a private top level, config read-only, objects writable but packs not, refs/heads/ov private.
    git = layout.git_dir
    assert str(git) in _pairs(argv, "--tmpfs") and str(git / "config") in _pairs(argv, "--ro-bind")
    assert str(git / "objects") in _pairs(argv, "--bind") and str(git / "objects" / "pack") in _pairs(argv, "--ro-bind")
    assert argv.index(str(git / "objects")) < argv.index(str(git / "objects" / "pack"))
    binds = list(zip(argv, argv[1:], argv[2:]))
    assert ("--bind", str(layout.private_refs), str(git / "refs" / "heads" / "ov")) in binds
    # tmux: the TUI keeps its terminal; network off is its own namespace.
    tui = build_argv("bwrap", layout, ["claude"], network=False, tty=True, tmp_size_mb=64)
    assert "--new-session" not in tui and "--unshare-net" in tui


def test_a_reader_gets_no_writable_worktree_and_no_git_view(tmp_path: Path) -> None:
    layout = _layout(tmp_path, writer=False)
    argv = build_argv("bwrap", layout, ["claude"], network=True, tty=False, tmp_size_mb=64)
    assert str(layout.worktree) not in _pairs(argv, "--bind")
    assert str(layout.git_dir) not in _pairs(argv, "--tmpfs")
    assert _pairs(argv, "--bind") == [str(layout.state_dir)]


def test_mode_off_auto_and_a_required_bwrap_that_is_missing(project: ProjectPaths, monkeypatch) -> None:
    from overstory.sandbox import probe as probe_module

    config = load_config(project.config_file, environ={"OV_SANDBOX_MODE": "off"})
    assert effective_mode(config).name == "off"
    monkeypatch.setenv("OV_BWRAP", str(project.root / "no-such-bwrap"))
    probe_module.probe.cache_clear()
    try:
        auto = effective_mode(load_config(project.config_file, environ={}))
        assert auto.name == "off" and "not installed" in auto.reason
        with pytest.raises(SandboxError, match="sandbox.mode is bwrap but"):
            effective_mode(load_config(project.config_file, environ={"OV_SANDBOX_MODE": "bwrap"}))
        refused = run_ov("sling", "builder", "x", "--runtime", "scripted", cwd=project.root,
                         env={"OV_SANDBOX_MODE": "bwrap", "OV_BWRAP": str(project.root / "no-such-bwrap")})
        assert refused.returncode == 1 and "sandbox.mode is bwrap" in refused.stderr
        assert run_git(project.root, "branch", "--list", "ov/*").strip() == ""  # refused before anything
        warned = run_ov("sling", "builder", "y", "--runtime", "scripted", cwd=project.root,
                        env={"OV_SANDBOX_MODE": "off"})
        assert warned.returncode == 0 and "warning: sandbox.mode is off" in warned.stderr
    finally:
        probe_module.probe.cache_clear()


# ---- a writer's branch ---------------------------------------------------------------------------


@requires_bwrap
def test_a_builder_commits_amends_and_rebases_its_own_branch(project: ProjectPaths) -> None:
    run_git(project.root, "branch", "start")
    (project.root / "later.txt").write_text("main moved on\n")
    run_git(project.root, "add", "later.txt")
    run_git(project.root, "commit", "-q", "-m", "main moves on")
    main = run_git(project.root, "rev-parse", "main").strip()
    work = [
        {"write": {"path": "feature.txt", "content": "one\n"}},
        {"bash": "git add feature.txt && git commit -q -m 'feature: one'"},
        {"bash": "echo two >> feature.txt && git commit -q -a --amend -m 'feature: one and two'"},
        {"bash": "git rebase -q main"},                  # takes packed-refs.lock in the private .git top level
        {"bash": "git gc --auto"},
        {"bash": "git status --porcelain > /tmp/status && test ! -s /tmp/status"},
        REPORT,
    ]
    name = sling_scripted(project, "good", [{"actions": work}], base="start")
    assert wait_terminal(project, name).state == "completed"
    log = run_git(project.root, "log", "--format=%s", f"main..ov/{name}").splitlines()
    assert log == ["feature: one and two"]
    assert run_git(project.root, "merge-base", "main", f"ov/{name}").strip() == main
    assert run_git(project.root, "show", f"ov/{name}:feature.txt") == "one\ntwo\n"
    assert run_git(project.root, "rev-parse", "main").strip() == main
    assert any("moved" in e for e in events_of(project, name, "branch_take_back"))
    assert run_git(project.root, "fsck", "--no-dangling").strip() == ""


@requires_bwrap
def test_escapes_of_a_scripted_builder_change_nothing_outside_its_own(project: ProjectPaths, tmp_path: Path) -> None:
    victim = sling_scripted(project, "victim", [{"actions": [{"write": {"path": "v.txt", "content": "v\n"}},
                                                             {"bash": "git add v.txt && git commit -q -m v"}, REPORT]}])
    assert wait_terminal(project, victim).state == "completed"
    root, git, ov = project.root, project.root / ".git", project.ov_dir
    victim_wt = project.worktree(victim)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    me = "builder-evil"
    before = Snapshot.take(project, owned_agents=[me], owned_worktrees=[me],
                           extra={"outside": outside, "hook marker": tmp_path / "hooked"})
    escapes = [
        f"echo x > {root}/README.md",
        f"git -C {root} update-ref refs/heads/main HEAD",
        f"git update-ref refs/heads/ov/{victim} HEAD",            # moves only its private copy
        f"git config core.hooksPath {project.worktree(me)}/hooks",
        f"printf '#!/bin/sh\\ntouch {tmp_path}/hooked\\n' > {git}/hooks/post-merge",
        f"echo x > {victim_wt}/v.txt",
        f"rm -rf {victim_wt}",
        f"echo 'sandbox: {{mode: off}}' >> {ov}/config.yaml",
        f"python3 -c \"import sqlite3;c=sqlite3.connect('{ov}/state.db');c.execute('delete from mail');c.commit()\"",
        f"echo x > {outside}",
        f"ls {project.run_dir / victim}/ > /tmp/seen",              # another agent's run dir is hidden
        "env -u OVERSTORY_TURN_ID setsid bash -c 'exec -a ov-escape-token-1 sleep 300' >/dev/null 2>&1 &",
        f"printf 'ref: refs/heads/main\\n' > {git}/refs/heads/ov/{me}",  # a symbolic ref planted in its own copy
    ]
    name = sling_scripted(project, "evil", [{"actions": [{"bash": hidden(c)} for c in escapes] + [REPORT]}],
                          env={"OV_TURNS_KILL_GRACE": "1"})
    assert name == me
    agent = wait_terminal(project, me)
    assert agent.state == "completed"
    after = Snapshot.take(project, owned_agents=[me], owned_worktrees=[me],
                          extra={"outside": outside, "hook marker": tmp_path / "hooked"})
    assert before.differences(after) == {}
    assert (root / "README.md").read_text() == "hello\n"
    assert git_out(root, "config", "--get", "core.hooksPath") == ""
    assert run_git(root, "rev-parse", f"ov/{victim}").strip() == run_git(victim_wt, "rev-parse", "HEAD").strip()
    assert (victim_wt / "v.txt").read_text() == "v\n"
    assert "sandbox" not in (ov / "config.yaml").read_text().split("# Model providers")[-1]
    assert processes_with("ov-escape-token-1") == []
    refused = events_of(project, me, "branch_refused")
    assert refused and "not an object name" in refused[-1]
    assert git_out(root, "symbolic-ref", "-q", f"refs/heads/ov/{me}") == ""  # still a plain ref


@requires_bwrap
def test_a_reader_cannot_write_even_its_own_worktree(project: ProjectPaths) -> None:
    """The guard refuses these for a scout before they run; here they run in the scout's sandbox without
    it (the command line ov gives its turn, around a shell), to show the kernel refuses them too."""
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.sandbox import prepare_turn
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    config = load_config(project.config_file, environ={})
    try:
        sling(project, config, conn, SlingRequest(capability="scout", task_id="look", runtime="scripted"),
              dict(os.environ), start=False)
        agent = sessions.get(conn, "scout-look")
    finally:
        conn.close()
    before = run_git(project.root, "rev-parse", "ov/scout-look").strip()
    attempts = (f"echo x > notes.md; touch {project.root}/scouted; git commit -q --allow-empty -m x; "
                "env | grep -q '^GIT_OPTIONAL_LOCKS=0$' && echo LOCKS-OFF")
    boxed = prepare_turn(project, config, agent, ["sh", "-c", attempts], dict(os.environ), launch_env=os.environ)
    done = subprocess.run(boxed.argv, env=boxed.env, capture_output=True, text=True, timeout=60)
    assert boxed.sandboxed and not boxed.layout.writer
    assert not (project.worktree("scout-look") / "notes.md").exists() and not (project.root / "scouted").exists()
    assert run_git(project.root, "rev-parse", "ov/scout-look").strip() == before
    assert "Read-only file system" in done.stderr and "LOCKS-OFF" in done.stdout


# ---- taking a branch back -------------------------------------------------------------------------


def _writer_layout(project: ProjectPaths, name: str) -> Layout:
    from overstory.runtimes import get_runtime
    from overstory.sandbox.layout import layout_for
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        agent = sessions.get(conn, name)
    finally:
        conn.close()
    assert agent is not None
    return layout_for(project, agent, get_runtime(agent.runtime))


def test_take_back_refuses_what_is_not_a_commit_and_never_moves_a_branch_that_moved_outside(
        project: ProjectPaths) -> None:
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:  # no loop: the test plays the loop's part by hand
        sling(project, load_config(project.config_file, environ={}), conn,
              SlingRequest(capability="builder", task_id="tb", runtime="scripted"), dict(os.environ), start=False)
    finally:
        conn.close()
    layout = _writer_layout(project, "builder-tb")
    gitrefs.prepare(layout)
    own = layout.private_refs / "builder-tb"
    base = own.read_text().strip()
    assert base == run_git(project.root, "rev-parse", "ov/builder-tb").strip()

    def tip() -> str:
        return run_git(project.root, "rev-parse", "ov/builder-tb").strip()

    blob = subprocess.run(["git", "hash-object", "-w", "--stdin"], input="x", capture_output=True, text=True,
                          cwd=project.root).stdout.strip()
    own.write_text(blob + "\n")
    assert gitrefs.take_back(layout).status == "refused" and tip() == base
    own.unlink()
    own.symlink_to(project.root / ".git" / "refs" / "heads" / "main")
    assert gitrefs.take_back(layout).status == "none" and tip() == base  # a symlink is never followed
    own.unlink()
    inside = run_git(project.root, "commit-tree", "-p", base, "-m", "inside", "HEAD^{tree}").strip()
    own.write_text(inside + "\n")
    outside = run_git(project.root, "commit-tree", "-p", base, "-m", "outside", "HEAD^{tree}").strip()
    run_git(project.root, "update-ref", "refs/heads/ov/builder-tb", outside)
    conflict = gitrefs.take_back(layout)
    assert conflict.status == "conflict" and tip() == outside  # what moved outside wins, and it is reported
    run_git(project.root, "update-ref", "refs/heads/ov/builder-tb", base)
    assert gitrefs.take_back(layout).status == "moved" and tip() == inside
    assert gitrefs.take_back(layout).status == "unchanged"


@requires_bwrap
def test_network_off_for_a_capability_still_reaches_its_endpoint(project: ProjectPaths) -> None:
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    probe_net = (f"python3 -c \"import urllib.request,sys\ntry:\n urllib.request.urlopen('{url}', timeout=5)\n"
                 " print('NET-OPEN')\nexcept OSError as e:\n print('NET-CLOSED', e)\"")
    try:
        off = sling_scripted(project, "off", [{"actions": [{"bash": probe_net}, REPORT]}],
                             env={"OV_SANDBOX_NETWORK": '{"default": true, "builder": false}'})
        on = sling_scripted(project, "on", [{"actions": [{"bash": probe_net}, REPORT]}])
        for name in (off, on):
            assert wait_terminal(project, name).state == "completed"  # its worker_done went through the endpoint
    finally:
        server.shutdown()
    output = {name: "\n".join(p.read_text() for p in (project.logs_dir / name).glob("*/stdout.ndjson"))
              for name in (off, on)}
    assert '"content": "NET-CLOSED' in output[off] and '"content": "NET-OPEN' not in output[off]
    assert '"content": "NET-OPEN' in output[on]


@requires_bwrap
def test_a_graceful_stop_reaches_the_command_inside_not_bwraps_reaper(tmp_path: Path) -> None:
    from overstory import procs
    from overstory.sandbox.probe import probe

    shared = tmp_path / "shared"
    shared.mkdir()
    script = f"trap 'echo terminated > {shared}/marker; exit 0' TERM; touch {shared}/ready; while :; do sleep 0.1; done"
    argv = [probe().path, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", str(shared), str(shared),
            "--unshare-pid", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--", "sh", "-c", script]
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        from agent_helpers import wait_for

        wait_for(lambda: (shared / "ready").exists(), 20, message="the command to start")
        assert procs.sandboxed_commands(proc.pid), "the command inside is found under bwrap's reaper"
        assert procs.kill_group(proc.pid, procs.start_ticks(proc.pid), grace=10)
        assert (shared / "marker").read_text() == "terminated\n"  # it got SIGTERM and could clean up
        assert proc.wait(timeout=10) == 0  # bwrap exits with the command's status
    finally:
        if proc.poll() is None:
            proc.kill()
