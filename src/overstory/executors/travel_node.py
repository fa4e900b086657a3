"""A remote turn on its node (issue 30): the workspace fetched by git over the turn's channel, the turn run in
the same paths and bubblewrap layout as on the control node, and its result sent back.

The node never sees the control node's files. Each phase runs in a mount namespace of its own
(``unshare --mount``) where a directory of the node's (``node_root``, under the node's temp dir) is mounted
over the project's path, so the turn's command line, environment and sandbox layout are the control node's,
unchanged, and they reach only the node's copy:

- ``prepare``: fetch (``workspace.fetch``): a bundle of the repository (the branches, and the worktree's
  snapshot), and the agent's run dir (its runtime's state: the session ``--resume`` needs, the sandbox's
  private refs); a repository and the agent's worktree at the same paths, its uncommitted files applied;
- ``exec``: the turn's command, exec'd (its process group is the one the shim records and a stop kills);
- ``finish``: the branch taken back from the sandbox as on the control node (``sandbox.gitrefs``), a
  snapshot of the working files, a bundle of what is new, ``workspace.finish``, then the runtime's state
  (``workspace.state``). The control node decides what moves (``travel_control``).

``Relay`` serves the endpoint's unix socket at its path in the node's copy and forwards each request to the
control node's TCP listener (``endpoint.remote``): a turn's `ov guard` and `ov mail` work unchanged. When the
control node cannot be reached, the relay answers 503 with one line, and a guarded call is refused (fail
closed). Run as ``python -m overstory.executors.travel_node PHASE TRAVEL_FILE [-- ARGV...]``.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import typing as t

from overstory.executors import travel_git as g

TOKEN_ENV = "OVERSTORY_ENDPOINT_TOKEN"
CALL_SECONDS = 300.0
OUT_HEAD, OUT_END = "refs/ov/out/head", "refs/ov/out/end"


def in_mount_namespace(argv: t.Sequence[str]) -> list[str]:
    """``argv`` in a fresh mount namespace of its own (in a user namespace too when not root)."""
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    return [*unshare, "--", *argv]


def namespace_command(phase: str, travel_file: str, argv: t.Sequence[str] = ()) -> list[str]:
    """The command line of one phase (``main``) in a fresh mount namespace."""
    return in_mount_namespace([sys.executable, "-m", "overstory.executors.travel_node", phase, travel_file,
                               *(["--", *argv] if argv else [])])


# ---- the channel to the control node ----------------------------------------------------------------------

class ControlUnreachable(Exception):
    pass


def call(info: t.Mapping[str, t.Any], route: str, args: t.Mapping[str, t.Any]) -> t.Any:
    """One request to the control node's endpoint with the turn's secret; its result, or ControlUnreachable."""
    import http.client

    host, _, port = str(info["endpoint"]).rpartition(":")
    body = json.dumps(dict(args)).encode("utf-8")
    try:
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=CALL_SECONDS)
        conn.request("POST", f"/v1/{route}", body=body, headers={
            "Authorization": f"Bearer {info['token']}", "Content-Type": "application/json", "Connection": "close"})
        answer = conn.getresponse()
        raw, status = answer.read(), answer.status
        conn.close()
    except OSError as exc:
        raise ControlUnreachable(f"cannot reach the control node at {info['endpoint']}: {exc}") from None
    try:
        document = json.loads(raw.decode("utf-8"))
    except ValueError:
        document = {}
    if status != 200 or not document.get("ok"):
        raise ControlUnreachable(f"{route}: HTTP {status}: {document.get('error') or raw[:200]!r}")
    return document.get("result")


class Relay:
    """The endpoint's unix socket on the node, forwarding each connection to the control node's listener."""

    def __init__(self, socket_path: str, endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        self.target = (host.strip("[]"), int(port))
        relay = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                relay.forward(self.request)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        from overstory.endpoint.client import unix_address

        address, fd = unix_address(socket_path)
        try:
            try:
                os.unlink(address)
            except FileNotFoundError:
                pass
            self.server = Server(address, Handler)
        finally:
            if fd is not None:
                os.close(fd)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()

    def forward(self, inner: socket.socket) -> None:
        try:
            outer = socket.create_connection(self.target, timeout=10)
        except OSError as exc:
            message = json.dumps({"ok": False, "exit_code": 1, "error": f"cannot reach ov's control node at "
                                  f"{self.target[0]}:{self.target[1]} from this node: {exc.strerror or exc}"})
            _read_request(inner)  # an answer sent before the request is read would be reset with it
            inner.sendall(f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length:"
                          f" {len(message)}\r\nConnection: close\r\n\r\n{message}".encode())
            return
        with outer:
            pair = {inner: outer, outer: inner}
            open_ends = {inner, outer}
            while open_ends:
                ready, _, _ = select.select(list(open_ends), [], [], 600)
                if not ready:
                    return
                for end in ready:
                    data = end.recv(65536)
                    if data:
                        pair[end].sendall(data)
                        continue
                    open_ends.discard(end)
                    try:
                        pair[end].shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    if end is outer:  # the answer is complete: the client reads until the close
                        return

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _read_request(conn: socket.socket) -> None:
    """Read one request (its head and its body) and drop it."""
    from overstory.endpoint import http1

    conn.settimeout(5)
    try:
        with conn.makefile("rb") as rfile:
            request = http1.read_head(rfile)
            if request is not None:
                rfile.read(min(http1.content_length(request), 1 << 20))
    except (OSError, http1.BadRequest):
        return


# ---- the phases (inside the mount namespace) ----------------------------------------------------------------

def _mount(info: t.Mapping[str, t.Any]) -> None:
    root = str(info["root"])
    os.makedirs(root, exist_ok=True)  # the mount point (on a machine that never had the project, empty)
    subprocess.run(["mount", "--bind", str(info["node_root"]), root], check=True, capture_output=True)


def prepare(info: t.Mapping[str, t.Any]) -> dict[str, t.Any]:
    from overstory.executors.travel_control import unpack_dir

    layout = info["layout"]
    sent = call(info, "workspace.fetch", {})
    root, worktree, branch = str(info["root"]), str(layout["worktree"]), str(sent["branch"])
    with tempfile.TemporaryDirectory(prefix="ov-fetch-") as scratch:
        bundle = os.path.join(scratch, "repo.bundle")
        with open(bundle, "wb") as handle:
            handle.write(base64.b64decode(sent["bundle"]))
        g.git(root, "init", "-q")
        g.git(root, "fetch", "-q", "--update-head-ok", bundle, "refs/*:refs/*")
    for key, value in dict(sent.get("identity") or {}).items():
        g.git(root, "config", key, str(value))
    g.git(root, "worktree", "add", "-q", worktree, branch)
    admin = str(layout.get("admin_dir") or "")
    if admin and not os.path.isdir(admin):
        raise RuntimeError(f"the worktree's admin dir is not where the control node has it ({admin})")
    g.apply_tree(worktree, sent["base"], sent["start"])
    unpack_dir(base64.b64decode(sent["run"]), str(layout["run"]))
    token_file = layout.get("serve_token")
    if token_file and not os.path.exists(token_file):
        open(token_file, "w").close()  # masked inside the sandbox: a mount needs its target
    return {"base": sent["base"], "start": sent["start"], "branch": branch}


def _layout(info: t.Mapping[str, t.Any]) -> t.Any:
    from pathlib import Path

    from overstory.sandbox.layout import Layout

    layout = info["layout"]
    paths: dict[str, t.Any] = {k: (Path(v) if isinstance(v, str) and k != "branch" else v) for k, v in layout.items()}
    paths["pinned"] = tuple(Path(p) for p in layout.get("pinned") or ())
    return Layout(**paths)


def _sandboxed(info: t.Mapping[str, t.Any]) -> list[str]:
    """The turn's bubblewrap command line as the control node would build it, over this node's copy."""
    from overstory.sandbox.bwrap import build_argv
    from overstory.sandbox.probe import probe

    found = probe()
    if not found.ok or found.path is None:
        raise RuntimeError(f"the turn is sandboxed and this node has no working bubblewrap: {found.detail}")
    return build_argv(found.path, _layout(info), list(info["command"]), **dict(info.get("bwrap") or {}))


def finish(info: t.Mapping[str, t.Any], node: str) -> dict[str, t.Any]:
    from overstory.executors.travel_control import pack_dir

    layout, start = info["layout"], info["started"]
    root, worktree, branch = str(info["root"]), str(layout["worktree"]), start["branch"]
    if info.get("sandboxed"):
        from overstory.sandbox import gitrefs

        gitrefs.take_back(_layout(info))
    head = g.read_ref(root, f"refs/heads/{branch}") or start["base"]
    end = g.snapshot(worktree, head)
    bundle = b""
    wanted = {ref: sha for ref, sha in ((OUT_HEAD, head), (OUT_END, end)) if sha not in (start["base"], start["start"])}
    if wanted:
        for ref, sha in wanted.items():
            g.git(root, "update-ref", ref, sha)
        with tempfile.TemporaryDirectory(prefix="ov-out-") as scratch:
            path = os.path.join(scratch, "turn.bundle")
            g.git(root, "bundle", "create", "-q", path, *wanted, "--not", start["base"], start["start"])
            bundle = open(path, "rb").read()
    outcome = call(info, "workspace.finish", {"head": head, "end": end, "node": node,
                                               "bundle": base64.b64encode(bundle).decode("ascii")})
    state = layout.get("state_dir")
    if state and os.path.isdir(state):
        call(info, "workspace.state", {"state": base64.b64encode(pack_dir(state)).decode("ascii")})
    return {"head": head, "end": end, **dict(outcome or {})}


def main(argv: t.Sequence[str]) -> int:
    phase, travel_file, rest = argv[0], argv[1], list(argv[3:]) if len(argv) > 2 and argv[2] == "--" else []
    with open(travel_file, encoding="utf-8") as handle:
        info = json.load(handle)
    try:
        _mount(info)
        if phase == "exec":
            os.chdir(str(info["cwd"]))
            command = _sandboxed(info) if info.get("sandboxed") else rest
            os.execvp(command[0], command)
        if phase == "prepare":
            result = prepare(info)
        elif phase == "finish":
            result = finish(info, str(info.get("node") or ""))
        else:
            raise RuntimeError(f"unknown phase {phase!r}")
    except (OSError, RuntimeError, ValueError, ControlUnreachable, g.GitFailed, subprocess.CalledProcessError,
            KeyError) as exc:
        detail = exc.stderr.decode("utf-8", "replace").strip() if isinstance(exc, subprocess.CalledProcessError) \
            and isinstance(exc.stderr, bytes) else str(exc)
        print(json.dumps({"error": f"{phase}: {type(exc).__name__}: {' '.join(detail.split())[:400]}"}))
        return 1
    print(json.dumps(result))
    return 0



class NodeTurn:
    """The Ray task's side of a remote turn (outside the mount namespaces): its folder on this node, the phases
    run as child processes, the relay. ``error`` says why a phase failed (one line), else is empty."""

    def __init__(self, turn_id: str, travel: t.Mapping[str, t.Any], env: t.Mapping[str, str], cwd: str,
                 node: str) -> None:
        self.folder = tempfile.mkdtemp(prefix=f"ov-turn-{turn_id[:12]}-")
        os.makedirs(os.path.join(self.folder, "root"))
        self.info: dict[str, t.Any] = {**travel, "node_root": os.path.join(self.folder, "root"), "cwd": cwd,
                                       "node": node, "token": env.get(TOKEN_ENV, "")}
        self.file = os.path.join(self.folder, "travel.json")
        self.relay: Relay | None = None
        self.error = ""

    def _phase(self, phase: str, timeout: float = 600) -> dict[str, t.Any] | None:
        with open(self.file, "w", encoding="utf-8") as handle:
            json.dump(self.info, handle)
        try:
            done = subprocess.run(namespace_command(phase, self.file), capture_output=True, timeout=timeout,
                                  cwd="/", check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.error = f"{phase}: {exc}"
            return None
        lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except ValueError:
            answer = {}
        if done.returncode != 0 or "error" in answer or not answer:
            tail = " ".join(done.stderr.decode("utf-8", "replace").split())[-300:]
            self.error = str(answer.get("error") or f"{phase} exited with {done.returncode}: {tail}")
            return None
        return dict(answer)

    def prepare(self) -> bool:
        started = self._phase("prepare")
        if started is None:
            return False
        self.info["started"] = started
        layout = self.info["layout"]
        run = os.path.relpath(str(layout["run"]), str(self.info["root"]))
        try:
            self.relay = Relay(os.path.join(self.info["node_root"], run, "ov.sock"), str(self.info["endpoint"]))
        except OSError as exc:
            self.error = f"the endpoint's relay: {exc}"
            return False
        with open(self.file, "w", encoding="utf-8") as handle:
            json.dump(self.info, handle)
        return True

    def command(self, argv: t.Sequence[str]) -> list[str]:
        return namespace_command("exec", self.file, argv)

    def finish(self) -> dict[str, t.Any] | None:
        return self._phase("finish")

    def close(self) -> None:
        import shutil

        if self.relay is not None:
            self.relay.close()
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
