"""One seeded chaos run: the team works, the kill schedule hits it, a scripted operator does what a
person would (approve, reject, merge, stop and re-sling, pause a schedule, re-run a killed command,
restart the watchdog and the server), and when the team has settled the invariants are checked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import typing as t
from pathlib import Path

import chaos_plan
import chaos_procs as procs
import chaos_team as team
from chaos_daemons import OV, Daemon, Model, SSEClient, free_port, serve_ready

PERSISTENT = ("coordinator", "monitor")
DECISIONS = {team.GATED_APPROVE: True, team.GATED_REJECT: False, team.LOOP: True}
SCHEDULE_DECIDE_AFTER = 8.0   # the operator looks at the schedule's requests less often than it fires
SCHEDULE_RUNS_FOR = 12.0
OUTLIVE_SECONDS = 2.0     # what a killed loop started must be gone by then (the loop's check runs 4 s)  # seconds from `ov schedule add` to `ov schedule pause`


class Run:
    def __init__(self, plan: dict[str, t.Any], scratch: Path, *, claude_bin: str | None, settle_timeout: float,
                 quick: bool = False) -> None:
        self.plan = plan
        self.quick = quick  # CI: one lead instead of two, no builder-spend (the burner crosses a scripted limit)
        self.layout = team.Layout(scratch)
        self.claude_bin = claude_bin
        self.settle_timeout = settle_timeout
        self.events: list[dict[str, t.Any]] = []
        self.kills: list[dict[str, t.Any]] = []
        self.findings: list[dict[str, t.Any]] = []  # problems seen while running (a re-run that failed ...)
        self.t0 = time.monotonic()
        self.done = threading.Event()
        self.frozen = threading.Event()  # set when the checks start: no more kills
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {"sling": 0, "merge": 0}
        self.pending = [dict(k, state="armed") for k in plan["kills"]]
        self.markers: list[tuple[float, str, str]] = []  # (time, marker, agent)
        self.env: dict[str, str] = {}
        self.logs = scratch / "logs"
        self.watchdog: Daemon | None = None
        self.serve: Daemon | None = None
        self.clients: list[SSEClient] = []
        self.model: Model | None = None
        self.stopped_by_operator: set[str] = set()
        self.base: dict[str, str] = {}
        self.outlived: list[dict[str, t.Any]] = []  # processes alive 3 s after the loop that started them was killed

    # ---- bookkeeping

    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def note(self, what: str, **details: t.Any) -> None:
        with self.lock:
            self.events.append({"t": self.elapsed(), "what": what, **details})

    def finding(self, invariant: str, detail: str) -> None:
        self.note("finding", invariant=invariant, detail=detail)
        with self.lock:
            self.findings.append({"invariant": invariant, "detail": detail})

    # ---- commands

    def ov(self, *args: str, kind: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """An `ov` command as the operator types it; a sling or merge the schedule kills is run again."""
        argv = [*OV, *args]
        kill = None
        if kind in self.counts:
            with self.lock:
                self.counts[kind] += 1
                number = self.counts[kind]
                kill = next((k for k in self.pending if k["kind"] == kind and k.get("nth") == number
                             and k["state"] == "armed"), None)
        if kill is not None:
            popen = subprocess.Popen(argv, cwd=self.layout.root, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
            command = procs.Command(argv, popen, procs.start_ticks(popen.pid))
            try:
                popen.wait(timeout=kill["after"])
            except subprocess.TimeoutExpired:
                pass
            hit = command.kill()
            out, err = popen.communicate(timeout=60)
            kill["state"] = "hit" if hit else "missed"
            record = {"kind": kind, "nth": kill["nth"], "after": kill["after"], "hit": hit, "t": self.elapsed(),
                      "command": " ".join(args)[:200], "exit": popen.returncode}
            self.kills.append(record)
            self.note("kill", **record, stderr=err[-300:])
            if not hit:
                return subprocess.CompletedProcess(argv, popen.returncode, out, err)
            for _ in range(3):  # the operator runs it again
                again = subprocess.run(argv, cwd=self.layout.root, env=self.env, capture_output=True, text=True,
                                       timeout=timeout)
                self.note("rerun", command=" ".join(args)[:200], exit=again.returncode, stderr=again.stderr[-300:])
                if again.returncode == 0:
                    return again
                time.sleep(0.5)
            name = _spawned_name(args)
            agents = {a["name"] for a in (self.ov_json("status", "--json", "--all") or {}).get("agents", [])}
            if name is not None and name in agents:  # the killed command had done its work: nothing to run again
                self.note("rerun_not_needed", agent=name)
                return again
            self.finding("rerun", f"`ov {' '.join(args)[:150]}` killed after {kill['after']} s fails when run again: "
                                  f"{again.stderr.strip()[-300:]}")
            return again
        done = subprocess.run(argv, cwd=self.layout.root, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            self.note("command_failed", command=" ".join(args)[:200], exit=done.returncode, stderr=done.stderr[-300:])
        return done

    def ov_json(self, *args: str) -> t.Any:
        done = self.ov(*args)
        try:
            return json.loads(done.stdout) if done.returncode == 0 else None
        except ValueError:
            return None

    # ---- the whole run

    def execute(self) -> None:
        from claude_cli import claude_env

        layout = self.layout
        self.logs.mkdir(parents=True, exist_ok=True)
        model = Model(team.claude_model()) if self.claude_bin else None
        self.model = model
        if model is not None:
            model.__enter__()
        try:
            extra = claude_env(model.base_url if model else "http://127.0.0.1:9", layout.scratch / "claude")
            extra = {k: v for k, v in extra.items() if k.startswith(("ANTHROPIC_", "CLAUDE_", "DISABLE_", "IS_"))}
            self.env = team.operator_env(layout, extra)
            self.base = team.make_project(layout, self.env, claude_bin=self.claude_bin, quick=self.quick)
            self.note("project", root=str(layout.root))
            self._start_daemons()
            threads = [threading.Thread(target=self._killer, name="killer", daemon=True),
                       threading.Thread(target=self._marker_watch, name="markers", daemon=True),
                       threading.Thread(target=self._keeper, name="keeper", daemon=True)]
            self.t0 = time.monotonic()
            self.note("start", epoch_ms=int(time.time() * 1000))  # t = 0 of every event and kill
            for thread in threads:
                thread.start()
            self._operator()
        finally:
            self.done.set()

    def _start_daemons(self) -> None:
        restart = float(self.plan["restart"])
        self.watchdog = Daemon("watchdog", [*OV, "watchdog", "--interval", "1"], cwd=self.layout.root, env=self.env,
                               logs=self.logs, note=self.note, restart=restart)
        self.watchdog.start()
        port = free_port()
        token = (self.layout.root / ".overstory" / "serve-token").read_text().strip()
        base = f"http://127.0.0.1:{port}"
        self.serve = Daemon("serve", [*OV, "serve", "--port", str(port), "--heartbeat", "1"], cwd=self.layout.root,
                            env=self.env, logs=self.logs, note=self.note, restart=restart,
                            ready=serve_ready(base, token))
        self.serve.start()
        self.clients = [SSEClient(f"client{i}", base, token).start() for i in (1, 2)]

    def _keeper(self) -> None:
        while not self.done.is_set():
            for daemon in (self.watchdog, self.serve):
                if daemon is not None:
                    daemon.keep_alive()
            time.sleep(0.1)

    # ---- kills

    def _victims(self, kind: str) -> list[t.Any]:
        state = self.layout.root / ".overstory" / "state.db"
        try:
            if kind == "loop":
                return procs.loops(state)
            if kind == "turn":
                return procs.turns(state)
        except Exception:  # noqa: BLE001 - a busy database: look again
            return []
        if kind == "scheduler":
            return procs.schedule_runners(self.layout.root)
        daemon = self.watchdog if kind == "watchdog" else self.serve if kind == "serve" else None
        if daemon is not None and daemon.running():
            return [procs.Victim(kind, None, daemon.pid, daemon.ticks)]  # type: ignore[arg-type]
        return []

    def _hit(self, kill: dict[str, t.Any], victim: procs.Victim) -> None:
        below = procs.descendants(victim.pid) if kill["kind"] == "loop" else []
        hit = victim.kill()
        if hit and below:  # what the loop started must die with it (its turn, a check or gate it runs)
            threading.Timer(OUTLIVE_SECONDS, self._outlived, args=(victim, below)).start()
        kill["state"] = "hit" if hit else "missed"
        record = {**{k: v for k, v in kill.items() if k != "state"}, "hit": hit, "t": self.elapsed(),
                  "victim": victim.describe()}
        self.kills.append(record)
        self.note("kill", **record)

    def _outlived(self, victim: procs.Victim, below: list[tuple[int, int | None, str]]) -> None:
        for pid, ticks, argv in below:
            if procs.alive(pid, ticks):
                self.note("outlived", agent=victim.agent, pid=pid, argv=argv)
                with self.lock:
                    self.outlived.append({"agent": victim.agent, "pid": pid, "argv": argv})

    def _killer(self) -> None:
        while not self.done.is_set() and not self.frozen.is_set():
            now = self.elapsed()
            for kill in self.pending:
                if kill["state"] != "armed" or "at" not in kill or now < kill["at"]:
                    continue
                victims = self._victims(kill["kind"])
                if victims:
                    self._hit(kill, chaos_plan.pick(victims, kill["pick"]))
                elif now > kill["at"] + 15:  # nothing of that kind ran for 15 s: the kill found no target
                    kill["state"] = "missed"
                    self.kills.append({**kill, "hit": False, "t": now})
                    self.note("kill_missed", kind=kill["kind"], at=kill["at"])
            for kill in self.pending:
                if kill["state"] != "armed" or "marker" not in kill:
                    continue
                seen = [m for m in self.markers if m[1] == kill["marker"] and m[0] + kill["delay"] <= now]
                for _when, _, agent in seen:
                    victims = [v for v in self._victims(kill["kind"]) if v.agent == agent]
                    if victims:
                        self._hit(kill, victims[0])
                        break
            time.sleep(0.05)

    def _marker_watch(self) -> None:
        """Side effects as they happen (the logs they write, the operator's mail): the kills aimed at seams."""
        seen: dict[str, int] = {}
        state = self.layout.root / ".overstory" / "state.db"
        while not self.done.is_set():
            for log, marker, agent_of in (("deploys", "deploy", None), ("releases", "release", None),
                                          ("checks", "check", team.LOOP)):
                lines = _lines(self.layout.log(log))
                for line in lines[seen.get(log, 0):]:
                    if marker == "check" and not line.startswith("start"):
                        continue
                    agent = agent_of or line.split()[0]
                    self._mark(marker, agent)
                    if marker == "deploy":
                        self._mark("deploy_turn", agent)
                seen[log] = len(lines)
            if not any(m[1] == "iter2" for m in self.markers):
                try:
                    conn = procs.read_only(state)
                    try:
                        row = conn.execute("SELECT 1 FROM mail WHERE recipient = 'operator' AND subject = ?",
                                           (f"iter2 {team.LOOP}",)).fetchone()
                    finally:
                        conn.close()
                    if row is not None:
                        self._mark("iter2", team.LOOP)
                except Exception:  # noqa: BLE001 - busy: next round
                    pass
            time.sleep(0.1)

    def _mark(self, marker: str, agent: str) -> None:
        with self.lock:
            self.markers.append((self.elapsed(), marker, agent))
        self.note("marker", marker=marker, agent=agent)

    # ---- the operator

    def _operator(self) -> None:
        scenario = str(self.layout.team_json)
        scripted = ("--runtime", "scripted", "--scenario", scenario)

        def first() -> None:  # builder-rs is stopped during its first turn, cleaned up and slung again
            self.ov("sling", "builder", "rs", *scripted, "--prompt", "OLD TASK rs", kind="sling")
            self._resling(scripted)

        def second() -> None:
            if self.claude_bin:
                self.ov("sling", "builder", "cl", "--runtime", "claude", "--max-usd", str(team.CLAUDE_MAX_USD),
                        "--prompt", "deploy, commit and report", kind="sling")
            if not self.quick:
                self.ov("sling", "builder", "spend", *scripted, "--max-usd", str(team.SPEND_MAX_USD),
                        "--prompt", "think expensively", kind="sling")

        def third() -> None:
            self.ov("sling", "builder", "g1", *scripted, "--prompt", "release v1", kind="sling")
            self.ov("sling", "builder", "g2", *scripted, "--prompt", "release v1 (will be refused)", kind="sling")
            self.ov("loop", "builder", "lp", *scripted, "--prompt", "make the check pass", "--check", "sh check.sh",
                    "--max-iterations", "4", kind="sling")

        # The operator works in three terminals at first (on a loaded machine one after the other takes a minute).
        starters = [threading.Thread(target=self._guarded, args=(step,), daemon=True) for step in (first, second, third)]
        for thread in starters:
            thread.start()
        for thread in starters:
            thread.join()
        added = self.ov("schedule", "add", team.SCHEDULE, "--every", "5s", "--", "sling", "builder", "sch-{n}",
                        *scripted, "--prompt", "sweep {n}")
        if added.returncode != 0:  # (a six-field cron, refused since issue 32, once kept schedules out unnoticed)
            self.finding("settles", f"`ov schedule add` failed: {added.stderr.strip()[-300:]}")
        pauser = threading.Timer(SCHEDULE_RUNS_FOR, self._pause_schedule)
        pauser.daemon = True
        pauser.start()
        self.ov("coordinator", "start", *scripted, "--budget-usd", str(team.RUN_MAX_USD), kind="sling")
        self.ov("coordinator", "send", "build parts a and b")
        self.note("team_started")
        merged: dict[str, int] = {}
        first_pending: dict[str, float] = {}
        deadline = time.monotonic() + self.settle_timeout
        if not self._work_until_settled(deadline, merged, first_pending, pauser):
            return
        # The run's budget is crossed last, by a builder that thinks expensively (its limit: what the run has left).
        self.ov("sling", "builder", "burn", *scripted, "--prompt", "think very expensively", kind="sling")
        self.note("burner_slung")
        self._work_until_settled(deadline, merged, first_pending, None)

    def _guarded(self, step: t.Callable[[], None]) -> None:
        try:
            step()
        except Exception:  # noqa: BLE001 - reported as a harness problem, the run goes on
            self.finding("settles", f"the operator's step failed: {traceback.format_exc()[-400:]}")

    def _pause_schedule(self) -> None:
        done = self.ov("schedule", "pause", team.SCHEDULE)
        self.note("schedule_paused", exit=done.returncode)

    def _work_until_settled(self, deadline: float, merged: dict[str, int], first_pending: dict[str, float],
                            pauser: threading.Timer | None) -> bool:
        """What the operator does while the team works: decide requests, pause the schedule, merge."""
        quiet = 0
        while time.monotonic() < deadline:
            status = self.ov_json("status", "--json", "--all") or {"agents": []}
            agents = {a["name"]: a for a in status.get("agents", [])}
            self._decide(first_pending)
            merging = self._merge(agents, merged)
            if (pauser is None or pauser.finished.is_set()) and not merging and self._settled():
                quiet += 1
                if quiet >= 3:
                    self.note("settled")
                    return True
            else:
                quiet = 0
            time.sleep(1.0)
        self.finding("settles", f"the team did not settle within {self.settle_timeout:.0f} s")
        return False

    def _decide(self, first_pending: dict[str, float]) -> None:
        pending = self.ov_json("approvals", "--json") or []
        for request in pending:
            if request.get("status") != "pending":
                continue
            ident, agent = request["id"], request["agent"]
            first_pending.setdefault(ident, self.elapsed())
            scheduled = agent.startswith("builder-sch-")
            wait = SCHEDULE_DECIDE_AFTER if scheduled else float(self.plan["approve_delay"])
            if self.elapsed() - first_pending[ident] < wait:
                continue
            if DECISIONS.get(agent, False):
                done = self.ov("approve", ident, "--note", "go ahead")
            else:
                done = self.ov("reject", ident, "--reason", "not today")
            self.note("decided", id=ident, agent=agent, approve=DECISIONS.get(agent, False), exit=done.returncode)

    def _resling(self, scripted: tuple[str, ...]) -> None:
        """Stop builder-rs during its first turn, clean it up, and sling the name again with a new task."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            agents = {a["name"]: a for a in (self.ov_json("status", "--json", "--all") or {}).get("agents", [])}
            state = agents.get(team.RESLING, {}).get("state")
            if state in ("in_turn", "completed", "zombie", "parked") or (state is None and agents):
                break
            time.sleep(0.3)
        done = self.ov("stop", team.RESLING)
        self.stopped_by_operator.add(team.RESLING)
        self.note("resling_stopped", state=state, exit=done.returncode, out=(done.stdout + done.stderr)[-300:])
        self.ov("merge", team.RESLING, kind="merge")  # whatever it committed, if anything
        done = self.ov("stop", team.RESLING, "--clean")
        self.note("resling_cleaned", exit=done.returncode, stderr=done.stderr[-200:])
        done = self.ov("sling", "builder", "rs", *scripted, "--prompt", "NEW TASK rs", kind="sling")
        if done.returncode != 0:
            self.finding("rerun", f"slinging {team.RESLING} again after stop --clean failed: {done.stderr[-300:]}")

    def _merge(self, agents: dict[str, t.Any], merged: dict[str, int]) -> bool:
        """Merge each finished agent once (children before their lead); True while some are still to merge."""
        waiting = False
        for name, agent in sorted(agents.items(), key=lambda item: item[1].get("depth", 0), reverse=True):
            if agent.get("capability") not in ("builder", "lead") or not agent.get("branch"):
                continue
            if name == team.RESLING and agent.get("generation", 1) == 1:
                continue  # the re-sling flow handles the first generation
            if agent["state"] != "completed" or merged.get(name, 0) >= 3 or merged.get(name) == -1:
                if agent["state"] not in ("completed", "zombie", "parked"):
                    waiting = waiting or agent.get("capability") == "builder"
                continue
            children = [a for a in agents.values() if a.get("parent") == name]
            if any(c["state"] not in ("completed", "zombie", "parked") for c in children):
                waiting = True
                continue
            if not self._has_new_commits(agent["branch"]):
                merged[name] = -1
                continue
            done = self.ov("merge", name, kind="merge")
            merged[name] = -1 if done.returncode == 0 else merged.get(name, 0) + 1
            self.note("merged", agent=name, exit=done.returncode, out=(done.stdout + done.stderr)[-200:])
        return waiting

    def _has_new_commits(self, branch: str) -> bool:
        """Whether the branch holds a commit main lacks (`ov merge` of nothing is a no-op, and slow on a busy machine)."""
        done = subprocess.run(["git", "rev-list", "--count", f"main..{branch}"], cwd=self.layout.root,
                              capture_output=True, text=True, check=False)
        return done.returncode != 0 or done.stdout.strip() != "0"

    def _settled(self) -> bool:
        """Nothing moves any more: no turn, no spawn or merge half done, no mail waiting for an agent that
        would take it, no request waiting for the operator, no schedule fire running."""
        try:
            conn = procs.read_only(self.layout.root / ".overstory" / "state.db")
        except Exception:  # noqa: BLE001
            return False
        try:
            busy = conn.execute("SELECT count(*) FROM sessions WHERE state IN ('booting', 'in_turn')").fetchone()[0]
            idle = conn.execute("SELECT count(*) FROM sessions WHERE state = 'between_turns' AND capability NOT IN "
                                "('coordinator', 'monitor')").fetchone()[0]
            waiting_mail = conn.execute(
                "SELECT count(*) FROM mail m JOIN sessions s ON s.name = m.recipient WHERE m.read_at IS NULL "
                "AND m.claimed_by IS NULL AND s.state IN ('booting', 'between_turns')").fetchone()[0]
            intents = conn.execute("SELECT (SELECT count(*) FROM spawn_intents) + (SELECT count(*) FROM merge_intents)"
                                   ).fetchone()[0]
            approvals = conn.execute("SELECT count(*) FROM approvals WHERE status = 'pending'").fetchone()[0]
            fires = conn.execute("SELECT count(*) FROM schedule_fires WHERE ended_at IS NULL").fetchone()[0]
        except Exception:  # noqa: BLE001 - busy: not settled yet
            return False
        finally:
            conn.close()
        return busy == idle == waiting_mail == intents == approvals == fires == 0

    # ---- the end

    def stop_everything(self) -> dict[str, t.Any]:
        """Stop the clients, the server, the watchdog, then every agent with `ov stop`; what outlives that."""
        for client in self.clients:
            client.stop()
        if self.serve is not None:
            self.serve.stop()
        if self.watchdog is not None:
            self.watchdog.stop()
        conn = procs.read_only(self.layout.root / ".overstory" / "state.db")
        try:
            # A completed agent's processes are gone already (its loop ends with it): what is left of one is
            # reported like what outlives an `ov stop`.
            names = [r["name"] for r in conn.execute("SELECT name FROM sessions WHERE state != 'completed' "
                                                     "ORDER BY depth DESC, name")]
        finally:
            conn.close()
        from concurrent.futures import ThreadPoolExecutor

        def stop(name: str) -> dict[str, t.Any]:
            done = self.ov("stop", name)
            return {"agent": name, "exit": done.returncode, "stderr": done.stderr[-200:]}

        with ThreadPoolExecutor(max_workers=4) as pool:  # the operator stops them from a few terminals
            stops = list(pool.map(stop, names))
        self.note("stopped", agents=names)
        first = procs.project_processes(self.layout.root)
        if not first:
            return {"stops": stops, "left": []}
        time.sleep(2.0)  # one still exiting (its last write, a reap) is not a survivor: alive in both looks counts
        again = {entry["pid"] for entry in procs.project_processes(self.layout.root)}
        return {"stops": stops, "left": [entry for entry in first if entry["pid"] in again]}

    def cleanup(self) -> None:
        """Nothing the run started stays: daemons by their group, then any process still in the project."""
        self.done.set()
        for kill in self.pending:
            if kill["state"] == "armed":  # the team settled (or the run failed) before its moment came
                kill["state"] = "not reached"
                self.kills.append({**{k: v for k, v in kill.items() if k != "state"}, "hit": False,
                                   "not_reached": True})
        for daemon in (self.serve, self.watchdog):
            if daemon is not None:
                daemon.stop()
                daemon.kill_group()
        for client in self.clients:
            client.stop()
        for _ in range(3):
            left = procs.project_processes(self.layout.root)
            if not left:
                break
            for entry in left:
                procs.kill_pid(entry["pid"], None)
            time.sleep(0.3)
        if self.model is not None:
            self.model.__exit__(None, None, None)


def _spawned_name(args: tuple[str, ...]) -> str | None:
    """The agent an `ov sling CAP TASK` / `ov loop CAP TASK` / `ov coordinator start` makes (no --name used here)."""
    if args[:2] == ("coordinator", "start"):
        return "coordinator"
    if args and args[0] in ("sling", "loop") and len(args) >= 3:
        return f"{args[1]}-{args[2]}"
    return None


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return []


def run_seed(plan: dict[str, t.Any], *, claude_bin: str | None, settle_timeout: float = 150, keep: bool = False,
             parent: Path | None = None, quick: bool = False) -> dict[str, t.Any]:
    """One seed from start to verdict; the scratch folder is deleted unless ``keep``."""
    from chaos_checks import check_all

    scratch = Path(tempfile.mkdtemp(prefix=f"ov-chaos-{plan['seed']}-", dir=parent))
    run = Run(plan, scratch, claude_bin=claude_bin, settle_timeout=settle_timeout, quick=quick)
    started = time.monotonic()
    result: dict[str, t.Any] = {"seed": plan["seed"], "schedule": plan, "scratch": str(scratch), "quick": quick}
    try:
        run.execute()
        result["verdicts"] = check_all(run)
    except Exception:  # noqa: BLE001 - a crash of the harness is a failed seed, with its traceback
        result["harness_error"] = traceback.format_exc()
    except KeyboardInterrupt:
        result["harness_error"] = "interrupted (Ctrl-C): this seed was cut short"
    finally:
        run.cleanup()
    result.update({"seconds": round(time.monotonic() - started, 1), "kills": run.kills, "findings": run.findings,
                   "events": run.events, "model": run.model.figures() if run.model else None})
    if not keep and "harness_error" not in result:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


if __name__ == "__main__":  # pragma: no cover - `python bench/chaos.py` is the entry point
    sys.exit("run `python bench/chaos.py` instead")
