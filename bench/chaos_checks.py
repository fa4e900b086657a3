"""The invariants of a chaos run, checked in code once the team has settled.

Each check reads ov's databases read-only (and the counts the harness keeps outside ov: the
side-effect logs, the bare remote, the SSE clients' ids) and returns what it looked at and every
violation it found, with enough detail to find the agent, the mail or the call.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import typing as t
from collections import Counter, defaultdict
from pathlib import Path

import chaos_procs as procs
import chaos_team as team
from chaos_budgets import check_budgets

if t.TYPE_CHECKING:
    from chaos_run import Run

MESSAGE = re.compile(r"^=== BEGIN MESSAGE #(\d+) ===$", re.M)
TERMINAL = ("completed", "zombie")


class Verdict:
    def __init__(self, name: str, what: str) -> None:
        self.name, self.what = name, what
        self.checked = 0
        self.violations: list[str] = []

    def fail(self, detail: str) -> None:
        self.violations.append(detail)

    def as_dict(self) -> dict[str, t.Any]:
        return {"invariant": self.name, "what": self.what, "checked": self.checked, "violations": self.violations}


def _state(run: Run) -> t.Any:
    return procs.read_only(run.layout.root / ".overstory" / "state.db")


def _rows(conn: t.Any, sql: str, *args: t.Any) -> list[dict[str, t.Any]]:
    return [dict(r) for r in conn.execute(sql, args)]


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False).stdout


# ---- the stream ---------------------------------------------------------------------------------


def check_sse(run: Run) -> Verdict:
    verdict = Verdict("sse", "each SSE client's events (across reconnects) equal the events table: no gap, no duplicate")
    events = procs.read_only(run.layout.root / ".overstory" / "events.db")
    try:
        newest = events.execute("SELECT max(id) FROM events").fetchone()[0] or 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any((c.ids[-1] if c.ids else 0) < newest for c in run.clients):
            time.sleep(0.2)
        for client in run.clients:
            last = client.ids[-1] if client.ids else 0
            table = [r[0] for r in events.execute("SELECT id FROM events WHERE id <= ? ORDER BY id", (last,))]
            verdict.checked += len(client.ids)
            copies = [i for i, n in Counter(client.ids).items() if n > 1]
            missing = sorted(set(table) - set(client.ids))
            extra = sorted(set(client.ids) - set(table))
            disordered = client.ids != sorted(client.ids)
            if last < newest:
                verdict.fail(f"{client.name} stopped at event {last} of {newest} ({client.connects} connections, "
                             f"errors {client.errors[-3:]})")
            if copies:
                verdict.fail(f"{client.name} got {len(copies)} events twice, e.g. {copies[:5]}")
            if missing:
                verdict.fail(f"{client.name} missed {len(missing)} events, e.g. {missing[:5]}")
            if extra:
                verdict.fail(f"{client.name} got {len(extra)} events the table does not hold, e.g. {extra[:5]}")
            if disordered:
                verdict.fail(f"{client.name} got events out of order")
    finally:
        events.close()
    return verdict


# ---- status and states --------------------------------------------------------------------------


FIELDS = ("state", "state_reason", "generation", "turns", "parent", "run_id", "capability")


def check_status(run: Run) -> Verdict:
    verdict = Verdict("status", "`ov status --json --all` shows every agent exactly as the store holds it")
    for _ in range(4):
        conn = _state(run)
        try:
            before = _rows(conn, "SELECT * FROM sessions ORDER BY name")
        finally:
            conn.close()
        shown = run.ov_json("status", "--json", "--all")
        conn = _state(run)
        try:
            after = _rows(conn, "SELECT * FROM sessions ORDER BY name")
        finally:
            conn.close()
        if before == after:
            break
        time.sleep(0.5)
    if shown is None:
        verdict.fail("`ov status --json --all` failed")
        return verdict
    agents = {a["name"]: a for a in shown.get("agents", [])}
    store = {r["name"]: r for r in after}
    verdict.checked = len(store)
    if set(agents) != set(store):
        verdict.fail(f"names differ: status only {sorted(set(agents) - set(store))}, "
                     f"store only {sorted(set(store) - set(agents))}")
    for name in sorted(set(agents) & set(store)):
        for field in FIELDS:
            if field in agents[name] and agents[name][field] != store[name][field]:
                verdict.fail(f"{name}.{field}: status {agents[name][field]!r}, store {store[name][field]!r}")
        if abs(float(agents[name].get("cost_usd") or 0) - float(store[name]["cost_usd"] or 0)) > 1e-4:
            verdict.fail(f"{name}.cost_usd: status {agents[name].get('cost_usd')}, store {store[name]['cost_usd']}")
    return verdict


def check_end_states(run: Run) -> list[Verdict]:
    ends = Verdict("end_states", "every agent ends terminal, parked with a reason, or waiting for a person "
                                 "(a persistent coordinator may wait for mail)")
    lost = Verdict("no_agent_lost", "no agent ends zombie: every kill was recovered")
    conn = _state(run)
    try:
        rows = _rows(conn, "SELECT name, capability, state, state_reason, park_kind FROM sessions ORDER BY name")
    finally:
        conn.close()
    for row in rows:
        ends.checked += 1
        lost.checked += 1
        state, reason = row["state"], (row["state_reason"] or "").strip()
        if state == "zombie":
            lost.fail(f"{row['name']} is zombie: {reason[:200]}")
        if state in TERMINAL or (state == "parked" and reason):
            continue
        if state == "between_turns" and row["capability"] in ("coordinator", "monitor"):
            continue
        ends.fail(f"{row['name']} ended {state} ({reason[:150] or 'no reason'})")
    return [ends, lost]


# ---- mail ---------------------------------------------------------------------------------------


def _generation_starts(conn: t.Any) -> dict[str, list[tuple[int, int]]]:
    starts: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in conn.execute("SELECT name, generation, min(at) AS at FROM transitions GROUP BY name, generation "
                            "ORDER BY name, generation"):
        starts[row["name"]].append((row["generation"], row["at"]))
    return starts


def _generation_at(starts: list[tuple[int, int]], at: int) -> int | None:
    found = None
    for generation, since in starts:
        if since <= at:
            found = generation
    return found


def check_mail(run: Run) -> Verdict:
    verdict = Verdict("mail_once", "every mail to an agent reached exactly one successful turn of the generation it "
                                   "was sent to (none lost, none twice, none to a later generation)")
    conn = _state(run)
    try:
        sessions = {r["name"]: r for r in _rows(conn, "SELECT name, generation, state, spec FROM sessions")}
        starts = _generation_starts(conn)
        turns = _rows(conn, "SELECT id, agent, generation, status, started_at, log_dir FROM turns ORDER BY started_at")
        mail = _rows(conn, "SELECT id, sender, recipient, type, subject, created_at, read_at, claimed_by FROM mail "
                           "WHERE recipient != 'operator' ORDER BY id")
    finally:
        conn.close()
    deliveries: dict[int, list[dict[str, t.Any]]] = defaultdict(list)
    last_ok: dict[tuple[str, int], int] = {}
    for turn in turns:
        if turn["status"] != "ok" or not turn["log_dir"]:
            continue
        last_ok[(turn["agent"], turn["generation"])] = max(last_ok.get((turn["agent"], turn["generation"]), 0),
                                                           turn["started_at"])
        try:
            prompt = (Path(turn["log_dir"]) / "prompt.txt").read_text(encoding="utf-8")
        except OSError:
            continue
        for number in MESSAGE.findall(prompt):
            deliveries[int(number)].append(turn)
    for message in mail:
        agent = sessions.get(message["recipient"])
        if agent is None:
            continue  # a broadcast or a name that never existed: refused when sent
        verdict.checked += 1
        label = f"mail #{message['id']} ({message['type']} from {message['sender']}: {message['subject'][:60]!r})"
        generation = _generation_at(starts.get(message["recipient"], []), message["created_at"])
        got = deliveries.get(message["id"], [])
        is_loop = '"loop"' in (agent["spec"] or "")
        if is_loop and message["type"] == "dispatch":
            continue  # a loop's objective is in every iteration's message, not rendered as mail
        if message["sender"] == message["recipient"] and message["type"] in ("merged", "merge_failed"):
            continue  # the report of an `ov merge` the agent ran itself: read as sent (its output said it)
        if len(got) > 1:
            verdict.fail(f"{label} to {message['recipient']} reached {len(got)} successful turns: "
                         f"{[g['id'] for g in got]}")
        wrong = [g for g in got if generation is not None and g["generation"] != generation]
        if wrong:
            verdict.fail(f"{label} sent to {message['recipient']} generation {generation} reached generation "
                         f"{wrong[0]['generation']} (turn {wrong[0]['id']})")
        if got:
            continue
        if generation is not None and generation != agent["generation"]:
            continue  # an earlier generation's mail: kept for the record, never handed to the new one
        if agent["state"] not in TERMINAL and agent["state"] != "between_turns":
            continue  # parked or waiting: it is still in the inbox for when the agent goes on
        if message["recipient"] in run.stopped_by_operator and agent["generation"] == 1:
            continue
        latest = last_ok.get((message["recipient"], agent["generation"]), 0)
        if message["created_at"] > latest and agent["state"] in TERMINAL:
            continue  # arrived during (or after) its last turn: the agent had finished by then
        verdict.fail(f"{label} to {message['recipient']} ({agent['state']}) never reached a successful turn "
                     f"(read_at {message['read_at']}, claimed_by {message['claimed_by']})")
    return verdict


# ---- side effects, approvals, schedules ------------------------------------------------------------


def _log_lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError:
        return []


def check_side_effects(run: Run) -> list[Verdict]:
    once = Verdict("side_effects_once", "no side effect the ledger classes as not re-runnable happened twice "
                                        "(deploy and release logs, pushes, mail to the operator)")
    gated = Verdict("approvals", "a gated call ran only when approved, at most once; no second gate for a call that "
                                 "already ran; no agent completed while its request was pending")
    layout = run.layout
    deploys = _log_lines(layout.log("deploys"))
    releases = _log_lines(layout.log("releases"))
    once.checked += len(deploys) + len(releases)
    for line, count in Counter(deploys + releases).items():
        if count > 1:
            once.fail(f"`{line}` happened {count} times")
    pushes = _log_lines(layout.log("pushes"))
    once.checked += len(pushes)
    for line, count in Counter(pushes).items():
        if count > 1:
            once.fail(f"push `{line}` happened {count} times")
    conn = _state(run)
    try:
        reports = _rows(conn, "SELECT sender, subject FROM mail WHERE recipient = 'operator' AND type = 'status' "
                              "AND (subject LIKE 'report %' OR subject LIKE 'iter2 %')")
        approvals = _rows(conn, "SELECT * FROM approvals ORDER BY requested_at")
        sessions = {r["name"]: r for r in _rows(conn, "SELECT name, generation, state FROM sessions")}
        completed_at = {(r["name"], r["generation"]): r["at"] for r in _rows(
            conn, "SELECT name, generation, min(at) AS at FROM transitions WHERE to_state = 'completed' "
                  "AND coalesce(reason, '') NOT LIKE 'stopped by the operator%' GROUP BY name, generation")}
    finally:
        conn.close()
    once.checked += len(reports)
    for (sender, subject), count in Counter((r["sender"], r["subject"]) for r in reports).items():
        if count > 1:
            once.fail(f"{sender} mailed the operator {subject!r} {count} times")
    by_agent: dict[str, list[dict[str, t.Any]]] = defaultdict(list)
    for request in approvals:
        by_agent[request["agent"]].append(request)
    gated.checked = len(approvals) + len(releases)
    for line in releases:
        agent = line.split()[0]
        decided = {r["status"] for r in by_agent.get(agent, [])}
        if "approved" not in decided:
            gated.fail(f"`./release.sh {line}` ran without an approval (requests: {sorted(decided) or 'none'})")
    for agent, requests in by_agent.items():
        approved: dict[str, dict[str, t.Any]] = {}
        for request in requests:
            earlier = approved.get(request["input"])
            if earlier is not None:
                ran = "approved and run" if earlier["used_at"] else "approved"
                gated.fail(f"{agent} asked again ({request['id']}, {request['status']}) for a call already {ran} "
                           f"({earlier['id']}): {request['input'][:120]}")
            if request["status"] == "approved":
                approved.setdefault(request["input"], request)
        row = sessions.get(agent)
        ended = completed_at.get((agent, row["generation"])) if row is not None else None
        if ended is None or agent in run.stopped_by_operator:
            continue
        open_then = [r["id"] for r in requests if r["generation"] == row["generation"] and r["requested_at"] <= ended
                     and (r["decided_at"] is None or r["decided_at"] > ended)]
        if open_then:
            gated.fail(f"{agent} completed while its request {', '.join(open_then)} was still pending "
                       f"(then: {', '.join(r['status'] + ' by ' + str(r['decided_by']) for r in requests if r['id'] in open_then)})")
    return [once, gated]


def check_schedule(run: Run) -> Verdict:
    verdict = Verdict("schedule", "a schedule does not fire while its previous fire's agent is still working, parked "
                                  "or waiting, and escalates failed fires once")
    conn = _state(run)
    try:
        fires = _rows(conn, "SELECT f.* FROM schedule_fires f JOIN schedules s ON s.id = f.schedule_id "
                            "WHERE s.name = ? ORDER BY f.n", team.SCHEDULE)
        ends = {r["name"]: r["at"] for r in conn.execute(
            "SELECT name, min(at) AS at FROM transitions WHERE to_state IN ('completed', 'zombie') GROUP BY name")}
        created = {r["name"] for r in conn.execute("SELECT name FROM sessions")}
        escalations = conn.execute("SELECT count(*) FROM mail WHERE recipient = 'operator' AND type = 'escalation' "
                                   "AND (subject LIKE ? OR body LIKE ?)",
                                   (f"%{team.SCHEDULE}%", f"%schedule {team.SCHEDULE}%")).fetchone()[0]
    finally:
        conn.close()
    previous: str | None = None
    for fire in fires:
        verdict.checked += 1
        argv = json.loads(fire["argv"]) if fire["argv"] else []
        task = next((a for a in argv if a.startswith("sch-")), None)
        name = f"builder-{task}" if task else None
        if name not in created:
            continue  # this fire started no agent (skipped, failed, lost)
        started = fire["started_at"] or fire["claimed_at"]
        if previous is not None and (ends.get(previous) is None or ends[previous] > started):
            verdict.fail(f"fire {fire['n']} ({name}) started while {previous} was still active")
        previous = name
    if escalations > 1:
        verdict.fail(f"{escalations} escalations about schedule {team.SCHEDULE} reached the operator")
    if not fires:
        verdict.fail(f"schedule {team.SCHEDULE} never fired: the run did not exercise schedules")
    return verdict


# ---- the operator's git ---------------------------------------------------------------------------


def check_operator_git(run: Run) -> Verdict:
    verdict = Verdict("operator_git", "the operator's branches, the main checkout and the remote's branches were "
                                      "written only by `ov merge`")
    root = run.layout.root
    base = run.base
    verdict.checked = 4
    if _git(root, "rev-parse", "keep").strip() != base["keep"]:
        verdict.fail("branch keep moved")
    if _git(root, "symbolic-ref", "HEAD").strip() != "refs/heads/main":
        verdict.fail(f"the main checkout is on {_git(root, 'symbolic-ref', 'HEAD').strip() or 'a detached HEAD'}")
    dirty = [line for line in _git(root, "status", "--porcelain", "--untracked-files=all").splitlines() if line]
    if dirty:
        verdict.fail(f"the main checkout has changes nobody committed: {dirty[:5]}")
    entries = _git(root, "reflog", "show", "--format=%H %gs", "main").splitlines()
    newer = []
    for entry in entries:
        sha, _, message = entry.partition(" ")
        if sha == base["main"]:
            break
        newer.append((sha, message))
    verdict.checked += len(newer)
    for sha, message in newer:
        subject = _git(root, "log", "-1", "--format=%s", sha).strip()
        if not message.startswith("merge ") or not subject.startswith("Merge ov/"):
            verdict.fail(f"main moved to {sha[:12]} by `{message}` ({subject[:80]!r}), not by `ov merge`")
    remote = run.layout.remote
    for branch in ("main", "keep"):
        if _git(remote, "rev-parse", branch).strip() != base[branch]:
            verdict.fail(f"the remote's {branch} moved")
    for line in _log_lines(run.layout.log("pushes")):
        ref = line.split()[0]
        if not ref.startswith("refs/heads/ov/"):
            verdict.fail(f"an agent pushed {ref}")
    return verdict


# ---- after `ov stop` -----------------------------------------------------------------------------


def check_after_stop(run: Run, stopped: dict[str, t.Any]) -> list[Verdict]:
    outlive = Verdict("processes", "no process outlives the agent that started it once `ov stop` returns, nor "
                                   "the agent loop that started it (2 s after a kill)")
    orphans = Verdict("orphans", "no worktree or ov/* branch is left that no agent row owns")
    outlive.checked = len(stopped["stops"]) + sum(1 for k in run.kills if k.get("kind") == "loop" and k.get("hit"))
    for entry in run.outlived:
        outlive.fail(f"pid {entry['pid']} outlived the loop of {entry['agent']} that started it: {entry['argv'][:160]}")
    for entry in stopped["left"]:
        outlive.fail(f"pid {entry['pid']} (agent {entry['agent']}, cwd {entry['cwd']}) still runs: {entry['argv'][:160]}")
    for stop in stopped["stops"]:
        if stop["exit"] != 0:
            outlive.fail(f"`ov stop {stop['agent']}` failed: {stop['stderr']}")
    root = run.layout.root
    conn = _state(run)
    try:
        rows = _rows(conn, "SELECT name, worktree, branch FROM sessions")
    finally:
        conn.close()
    worktrees = {str(Path(r["worktree"])) for r in rows if r["worktree"]}
    branches = {r["branch"] for r in rows if r["branch"]}
    folder = root / ".overstory" / "worktrees"
    present = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    orphans.checked = len(present)
    for path in present:
        if str(path) not in worktrees:
            orphans.fail(f"worktree {path.name} has no agent row")
    listed = [line.strip().lstrip("*+ ").strip() for line in _git(root, "branch", "--list", "ov/*").splitlines()]
    orphans.checked += len(listed)
    for branch in listed:
        if branch and branch not in branches:
            orphans.fail(f"branch {branch} has no agent row")
    for line in _git(root, "worktree", "list", "--porcelain").splitlines():
        if line.startswith("worktree ") and not Path(line.split(" ", 1)[1]).is_dir():
            orphans.fail(f"git lists a worktree that is gone: {line}")
    return [outlive, orphans]


def check_all(run: Run) -> list[dict[str, t.Any]]:
    """Every invariant; the ones that need the team as it settled first, then `ov stop` and what is left."""
    run.frozen.set()  # the kills are over: what is checked now is what the chaos left
    verdicts: list[Verdict] = []
    for check in (check_sse, check_status, check_end_states, check_mail, check_side_effects, check_budgets,
                  check_schedule, check_operator_git):
        found = check(run)
        verdicts.extend(found if isinstance(found, list) else [found])
        run.note("checked", check=check.__name__)
    stopped = run.stop_everything()
    verdicts += check_after_stop(run, stopped)
    for name, what in (("rerun", "a killed `ov sling`/`ov merge` works when the operator runs it again"),
                       ("settles", "the team settles after the chaos (no agent stuck working)")):
        verdict = Verdict(name, what)
        verdict.checked = 1
        for found in run.findings:
            if found["invariant"] == name:
                verdict.fail(found["detail"])
        verdicts.append(verdict)
    return [v.as_dict() for v in verdicts]
