"""Cost control with the REAL Claude Code CLI, driven through the real `ov` commands.

Only the model is mocked (tests/mockapi.py on 127.0.0.1): it cannot run here, and only
a scripted model can report a bill of our choosing, a 429, a usage limit with a reset
time or a rejected key on demand. The CLI (written against 2.1.330: `OV_CLAUDE_BIN`),
its retries, its stream-json, its hooks (`ov guard`), its sessions and `--resume`,
git, SQLite and every process are real.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import typing as t
from pathlib import Path

from agent_helpers import agent_state, mail_rows, wait_for
from claude_cli import CLAUDE_BIN, claude_env, requires_claude
from conftest import ov_command
from mockapi import (
    MockMessagesAPI,
    Reply,
    conversation_text,
    error_reply,
    text_reply,
    tool_reply,
    with_headers,
    with_usage,
)
from overstory import procs
from overstory.store.db import open_events, open_state

# $1.00 for a builder (`ov init` gives builders sonnet: claude-sonnet-5-5, $2 per million input tokens in
# 2.1.330), $2.00 on the CLI's default model (claude-opus-5-5, $4): see tests/fixtures/CLAUDE_PROBE_NOTES.md.
BIG_INPUT = 500_000
REPORT_MARK = "e2e-report-7f3a"
REPORT = f"ov mail send --type worker_done --subject {REPORT_MARK} --body 'all committed'"
# claude 2.1.330 refuses a plain `sleep 60` in Bash ("Blocked: standalone sleep"): a long step is python.
LONG_STEP = "python3 -c 'import time; time.sleep(60)'"


def ov(project, *args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`ov` with exactly ``env`` (no key of the surrounding machine leaks in)."""
    return subprocess.run([*ov_command(), *args], cwd=project.root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def agent_env(api: MockMessagesAPI, tmp_path, **extra: str) -> dict[str, str]:
    env = claude_env(api.base_url, tmp_path, extra={"OV_RUNTIME_CLAUDE_BIN": CLAUDE_BIN or "claude", **extra})
    return {k: v for k, v in env.items() if v != ""}


def addressed_to(body: dict[str, t.Any]) -> str | None:
    """Which agent a request is for: ov renders every mail into the prompt with its `To:` header."""
    in_header = False
    for line in conversation_text(body).splitlines():
        if line.startswith("=== BEGIN MESSAGE #"):
            in_header = True
        elif in_header and line.startswith("To: "):
            return line[4:].strip()
        elif not line.strip():
            in_header = False
    return None


def reports_then_ends(body: dict[str, t.Any]) -> Reply:
    """Report worker_done once (whatever the position in a resumed session), then end the turn."""
    if REPORT_MARK in conversation_text(body):
        return text_reply("Reported; done.")
    return tool_reply("Bash", {"command": REPORT, "description": "report"})


def per_agent(scripts: dict[str, t.Callable[[dict[str, t.Any]], Reply]],
              default: t.Callable[[dict[str, t.Any]], Reply] = lambda body: text_reply("Noted.")):
    def respond(body: dict[str, t.Any]) -> Reply:
        return scripts.get(addressed_to(body) or "", default)(body)

    return respond


def first_time(first: Reply | t.Callable[[], Reply],
               then: t.Callable[[dict[str, t.Any]], Reply]) -> t.Callable[[dict[str, t.Any]], Reply]:
    """``first`` for the first request (built at that moment when it is a callable), ``then`` after."""
    used = threading.Event()

    def respond(body: dict[str, t.Any]) -> Reply:
        if not used.is_set():
            used.set()
            return first() if callable(first) else first
        return then(body)

    return respond


def turns_of(project, agent: str) -> list[dict[str, t.Any]]:
    conn = open_state(project.state_db)
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM turns WHERE agent = ? ORDER BY started_at", (agent,))]
    finally:
        conn.close()


def events_of(project, agent: str, kind: str) -> list[dict[str, t.Any]]:
    conn = open_events(project.events_db)
    try:
        rows = conn.execute("SELECT at, summary, data FROM events WHERE agent = ? AND kind = ? ORDER BY id",
                            (agent, kind)).fetchall()
        return [{"at": r[0], "summary": r[1], "data": json.loads(r[2]) if r[2] else None} for r in rows]
    finally:
        conn.close()


def state_of(project, name: str) -> str | None:
    agent = agent_state(project, name)
    return agent.state if agent else None


def settled(project, name: str, timeout: float = 90):
    return wait_for(lambda: (a := agent_state(project, name)) and (a.is_terminal or a.state == "parked") and a,
                    timeout, interval=0.2, message=f"{name} to settle")


class GroupWatch(threading.Thread):
    """Polls an agent's turn process group and notes when it disappears (independent of ov's own events)."""

    def __init__(self, project, agent: str) -> None:
        super().__init__(daemon=True)
        self.project, self.agent = project, agent
        self.pgid: int | None = None
        self.gone_at: float | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.pgid is None:
                found = agent_state(self.project, self.agent)
                self.pgid = found.turn_pgid if found else None
            elif not procs.group_members(self.pgid):
                self.gone_at = time.time()
                return
            time.sleep(0.05)


@requires_claude
def test_max_usd_stops_the_crossing_turn_and_resume_continues_the_same_session(project, tmp_path):
    expensive = with_usage(tool_reply("Bash", {"command": LONG_STEP, "description": "a long step"}),
                           input_tokens=BIG_INPUT)
    with MockMessagesAPI(first_time(expensive, reports_then_ends)) as api:
        env = agent_env(api, tmp_path)
        slung = ov(project, "sling", "builder", "t1", "--prompt", "Do the task.", "--max-usd", "0.50", env=env)
        assert slung.returncode == 0, slung.stderr
        watch = GroupWatch(project, "builder-t1")
        watch.start()
        agent = settled(project, "builder-t1")
        watch.join(timeout=10)
        assert agent.state == "parked" and agent.park_kind == "budget", agent.state_reason
        assert agent.state_reason.startswith("budget: max_usd 0.50 reached (1.0"), agent.state_reason
        crossed = events_of(project, "builder-t1", "budget_crossed")
        assert len(crossed) == 1 and watch.gone_at is not None
        assert watch.gone_at - crossed[0]["at"] / 1000 < 2.0, "the group outlived the crossing by 2 s or more"
        first = turns_of(project, "builder-t1")[0]
        assert first["status"] == "budget" and not procs.group_members(first["pgid"])
        # The hook's refusal tells the CLI to end its turn (continue: false): when its result line comes before
        # ov's kill, the turn keeps the CLI's own total; killed first, ov's estimate of the crossing message.
        reported = events_of(project, "builder-t1", "turn_result")
        assert first["cost_estimated"] == (0 if reported else 1), (first, reported)
        assert first["cost_usd"] >= 1.0
        dispatch = mail_rows(project, type="dispatch")
        assert len(dispatch) == 1 and dispatch[0]["read_at"] is None and dispatch[0]["claimed_by"] is None
        escalation = mail_rows(project, type="escalation")
        assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"

        resumed = ov(project, "resume", "builder-t1", "--add-usd", "5", env=env)
        assert resumed.returncode == 0, resumed.stderr
        waited = ov(project, "wait", "builder-t1", "--timeout", "120", env=env, timeout=150)
        assert waited.returncode == 0, waited.stdout + waited.stderr
    rows = turns_of(project, "builder-t1")
    statuses = [r["status"] for r in rows]
    if statuses == ["budget", "resume_failed", "ok"]:
        # Killed at once for its budget, the CLI may not have written its session's file yet (a loaded machine
        # kills first; seen once in CI): its --resume says so, and the loop goes on in a fresh session.
        said = (Path(rows[1]["log_dir"]) / "stderr.txt").read_text(encoding="utf-8")
        assert f"No conversation found with session ID: {rows[0]['session_id']}" in said, said
        assert rows[2]["resumed"] == 0 and rows[2]["session_id"] != rows[0]["session_id"]
    else:
        assert statuses == ["budget", "ok"]
        assert rows[1]["resumed"] == 1 and rows[1]["session_id"] == rows[0]["session_id"], "the same claude session"
    assert rows[-1]["cost_estimated"] == 0 and rows[-1]["cost_usd"] > 0, "the real total_cost_usd replaced the estimate"
    assert len(mail_rows(project, type="worker_done")) == 1 and len(mail_rows(project, type="escalation")) == 1


@requires_claude
def test_a_run_budget_parks_all_three_builders_and_starts_no_further_turn(project, tmp_path):
    def expensive_then_report(body: dict[str, t.Any]) -> Reply:
        if "time.sleep(60)" in conversation_text(body):
            return reports_then_ends(body)
        return with_usage(tool_reply("Bash", {"command": LONG_STEP, "description": "work"}), input_tokens=BIG_INPUT)

    builders = ["builder-a", "builder-b", "builder-c"]
    with MockMessagesAPI(per_agent({name: expensive_then_report for name in builders})) as api:
        env = agent_env(api, tmp_path)
        # Each builder's first message costs about $1.01: two stay under $2.50, so all three are slung (every
        # bill is priced the moment it arrives), and the third's crosses the run's limit.
        started = ov(project, "coordinator", "start", "--budget-usd", "2.50", env=env)
        assert started.returncode == 0, started.stderr
        for name in builders:
            slung = ov(project, "sling", "builder", name.split("-")[1], "--parent", "coordinator",
                       "--prompt", "Do the task.", env=env)
            assert slung.returncode == 0, slung.stderr
        for name in builders:
            assert settled(project, name).state == "parked"
        assert wait_for(lambda: state_of(project, "coordinator") == "parked", 30)
        run_id = agent_state(project, "builder-a").run_id
        reasons = {name: agent_state(project, name).state_reason for name in [*builders, "coordinator"]}
        # A builder slung after the first bills has its dollar limit clamped to what the run had left, and may
        # cross that (its own) limit first: the run's budget either way.
        assert all(r.startswith(f"budget: run {run_id} max_usd 2.50 reached")
                   or (name != "coordinator" and re.match(r"budget: max_usd [01]\.\d\d reached", r))
                   for name, r in reasons.items()), reasons
        requests, turns = len(api.main_requests), sum(len(turns_of(project, n)) for n in [*builders, "coordinator"])
        time.sleep(5)
        assert len(api.main_requests) == requests, "a parked run sent no further request"
        assert sum(len(turns_of(project, n)) for n in [*builders, "coordinator"]) == turns, "no further turn"
        assert ov(project, "wait", "--run", run_id, "--timeout", "5", env=env).returncode == 4
        to_operator = [m for m in mail_rows(project, type="escalation") if m["recipient"] == "operator"]
        assert len(to_operator) == 1
        ov(project, "coordinator", "stop", "--all", env=env)


def usage_limited(reset_at: int) -> Reply:
    return with_headers(error_reply(429, "rate_limit_error", "You've reached your usage limit for this 5-hour window."),
                        anthropic_ratelimit_unified_status="rejected",
                        anthropic_ratelimit_unified_reset=str(reset_at),
                        anthropic_ratelimit_unified_representative_claim="five_hour",
                        anthropic_ratelimit_unified_5h_status="rejected",
                        anthropic_ratelimit_unified_5h_reset=str(reset_at),
                        anthropic_ratelimit_unified_5h_utilization="1.0")


def asks_then_reports(body: dict[str, t.Any]) -> Reply:
    text = conversation_text(body)
    if "the first name" not in text:
        if "which name" in text:
            return text_reply("Waiting for the operator's answer.")
        return tool_reply("Bash", {"command": "ov mail send --to operator --type question --subject 'which name?'",
                                   "description": "ask"})
    return reports_then_ends(body)


def quota_scenario(project, tmp_path, refusal: Reply | t.Callable[[], Reply], env_extra: dict[str, str], *,
                   oauth: bool = False):
    """B waits for an answer (idle); A's first request is refused; both must park, then finish by themselves."""
    with MockMessagesAPI(per_agent({"builder-a": first_time(refusal, reports_then_ends),
                                    "builder-b": asks_then_reports})) as api:
        env = agent_env(api, tmp_path, OV_QUOTA_STAGGER="2", **env_extra)
        if oauth:
            env.pop("ANTHROPIC_API_KEY")
            env["CLAUDE_CODE_OAUTH_TOKEN"] = "sk-ant-oat01-mock-oauth-token-0123456789"
        assert ov(project, "sling", "builder", "b", "--prompt", "Do task b.", env=env).returncode == 0
        wait_for(lambda: (b := agent_state(project, "builder-b")) and b.state == "between_turns" and b.turns == 1, 90)
        assert ov(project, "sling", "builder", "a", "--prompt", "Do task a.", env=env).returncode == 0
        a = settled(project, "builder-a")
        b = wait_for(lambda: (x := agent_state(project, "builder-b")) and x.state == "parked" and x, 15)
        assert a.park_kind == b.park_kind == "quota" and a.retries == 0, (a.state_reason, b.state_reason)
        assert b.park_until > a.park_until, "the provider's agents come back staggered"
        assert ov(project, "wait", "builder-a", "--timeout", "1", env=env).returncode == 5
        answered = ov(project, "mail", "send", "--to", "builder-b", "--subject", "answer", "--body", "the first name",
                      env=env)
        assert answered.returncode == 0
        for name in ("builder-a", "builder-b"):
            assert wait_for(lambda n=name: state_of(project, n) == "completed", 150, interval=0.5, message=name)
        refused_requests = [r for r in api.main_requests if addressed_to(r) == "builder-a"]
    assert [r["status"] for r in turns_of(project, "builder-a")] == ["rate_limit", "ok"]
    assert len(refused_requests) >= 2
    done = mail_rows(project, type="worker_done")
    assert sorted(m["sender"] for m in done) == ["builder-a", "builder-b"], "nothing lost, nothing twice"
    assert all(m["read_at"] is not None for m in mail_rows(project, recipient="builder-a"))
    assert mail_rows(project, type="escalation") == []
    return a, b


@requires_claude
def test_a_429_the_cli_will_not_retry_parks_the_provider_and_backs_off(project, tmp_path):
    refusal = with_headers(error_reply(429, "rate_limit_error", "Number of request tokens has exceeded your limit"),
                           x_should_retry="false")
    a, _ = quota_scenario(project, tmp_path, refusal, {"OV_QUOTA_BACKOFF_INITIAL": "6"})
    assert "backoff step 1" in a.state_reason


@requires_claude
def test_a_usage_limit_parks_until_its_reset_time(project, tmp_path):
    resets: list[int] = []

    def refusal() -> Reply:
        # The reset time is set when the refusal is served: on a loaded machine the other
        # agent's first turn can take longer than a fixed window would allow.
        resets.append(int(time.time()) + 20)
        return usage_limited(resets[0])

    a, _ = quota_scenario(project, tmp_path, refusal, {}, oauth=True)
    (reset_at,) = resets
    assert abs(a.park_until - reset_at * 1000) < 2000, (a.park_until, reset_at)
    assert "its reset time" in a.state_reason
    assert time.time() >= reset_at, "nobody went on before the reset"


@requires_claude
def test_a_bad_key_parks_at_the_first_failed_turn_and_resume_with_a_good_key_completes(project, tmp_path):
    good = "sk-ant-mock-good-0123456789abcdef"

    def authorize(headers: dict[str, str]) -> Reply | None:
        if headers.get("x-api-key") == good:
            return None
        return error_reply(401, "authentication_error", "invalid x-api-key")

    with MockMessagesAPI(reports_then_ends, authorize=authorize) as api:
        env = agent_env(api, tmp_path)
        env["ANTHROPIC_API_KEY"] = "sk-ant-mock-bad-0000000000000000"
        began = time.monotonic()
        assert ov(project, "sling", "builder", "t1", "--prompt", "Do the task.", env=env).returncode == 0
        agent = settled(project, "builder-t1")
        assert time.monotonic() - began < 45, "parked at the first failed turn, not after minutes of retries"
        assert agent.park_kind == "auth" and agent.state_reason.startswith("auth: "), agent.state_reason
        assert [r["status"] for r in turns_of(project, "builder-t1")] == ["auth"]
        assert len(events_of(project, "builder-t1", "auth_parked")) == 1
        escalation = mail_rows(project, type="escalation")
        assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
        doctor = ov(project, "doctor", env=env)
        assert doctor.returncode == 1 and "rejected their key" in doctor.stdout, doctor.stdout
        assert ov(project, "wait", "builder-t1", "--timeout", "1", env=env).returncode == 6
        fixed = {**env, "ANTHROPIC_API_KEY": good}
        resumed = ov(project, "resume", "builder-t1", env=fixed)
        assert resumed.returncode == 0, resumed.stderr
        assert ov(project, "wait", "builder-t1", "--timeout", "120", env=fixed, timeout=150).returncode == 0
    assert len(mail_rows(project, type="worker_done")) == 1


@requires_claude
def test_a_model_that_never_reports_is_nudged_then_escalated_once(project, tmp_path):
    with MockMessagesAPI(lambda body: text_reply("I had a look around.")) as api:
        env = agent_env(api, tmp_path, OV_TURNS_IDLE_NUDGE="1", OV_TURNS_MAX_NUDGES="2")
        assert ov(project, "sling", "builder", "t1", "--prompt", "Do the task.", env=env).returncode == 0
        agent = wait_for(lambda: (a := agent_state(project, "builder-t1")) and a.state == "stalled" and a, 120,
                         interval=0.3)
        time.sleep(3)
        assert agent.state_reason == "no report" and agent.turns == 3
        nudged = [r for r in api.main_requests if "your turn ended without a report" in conversation_text(r)]
        assert len(nudged) >= 2
    escalation = mail_rows(project, type="escalation")
    assert len(escalation) == 1 and escalation[0]["recipient"] == "operator"
    assert state_of(project, "builder-t1") == "stalled"


@requires_claude
def test_stopping_a_child_tells_its_parent_exactly_once(project, tmp_path):
    scripts = {"lead-l": lambda body: text_reply("Waiting for my builder."),
               "builder-c": lambda body: tool_reply("Bash", {"command": LONG_STEP, "description": "long"})}
    with MockMessagesAPI(per_agent(scripts)) as api:
        env = agent_env(api, tmp_path)
        assert ov(project, "sling", "lead", "l", "--prompt", "Lead.", env=env).returncode == 0
        assert ov(project, "sling", "builder", "c", "--parent", "lead-l", "--prompt", "Build.", env=env).returncode == 0
        wait_for(lambda: state_of(project, "builder-c") == "in_turn", 60)
        assert ov(project, "stop", "builder-c", env=env).returncode == 0
        assert ov(project, "stop", "builder-c", env=env).returncode == 0
        wait_for(lambda: all(m["read_at"] for m in mail_rows(project, recipient="lead-l")), 60)
        status = ov(project, "status", "--all", env=env)
        ov(project, "stop", "lead-l", env=env)
    told = mail_rows(project, recipient="lead-l", type="status")
    assert len(told) == 1 and told[0]["sender"] == "builder-c" and "stopped by the operator" in told[0]["subject"]
    assert "stopped by the operator" in status.stdout
