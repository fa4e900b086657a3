"""Figure 1: whole-process latency of the hot commands against two Python floors.

The floors are the least any Python CLI can cost: starting the interpreter
(`python -c pass`), starting it plus importing click, and starting it plus importing
the standard modules the hot commands once needed (re, json, sqlite3). The hot commands do
not import click (cli.fast parses them), nor those packages (``jsontext`` on ``_json``,
``_sqlite3`` for the sqlite3 package), so the target is set against the first floor:
at most 2x `python -c pass`; the ratio to the click floor is given beside it.

Each command is timed in the two places it runs: on the databases (the operator's
commands, and an agent's when no endpoint answers), and during an agent's turn ("in a
turn:" rows), where its environment names the agent's endpoint and the command is a
client of the agent's loop (here the bench process serves that endpoint, as the loop
would). The CPU-time rows count the command's own process only; in a turn the loop's
share is not in them, so wall time is the measure there.

Each round runs every command once, in a rotating order, so the ratio of medians is taken
under the same conditions. It is measured twice: with bytecode caching on
(PYTHONPYCACHEPREFIX in a scratch folder, as an installed package has .pyc files) and
off (PYTHONDONTWRITEBYTECODE=1 with no cached .pyc for ov's own modules, as in an
editable install in this sandbox), because ov's modules are compiled on every run in the
second case.
"""

from __future__ import annotations

import json
import re
import subprocess
import typing as t
from pathlib import Path

from context import Context
from harness import (
    Command,
    Stats,
    add_note,
    clean_env,
    git,
    init_project,
    make_repo,
    row,
    start_sleeper,
    time_interleaved,
)
from synthetic import add_agents, add_events, add_mail

TARGET_RATIO = 2.0  # x `python -c pass`
CLICK_COMMANDS: set[str] = set()  # `ov --version` went through click until issue 34; now the fast path answers it
HEAVY_MODULES = ("rich", "git", "libtmux", "anthropic", "pydantic", "yaml")
AGENT = "builder-hot"
IN_TURN = "in a turn:"  # the rows of an agent's commands with its endpoint in their environment


def _guard_input(worktree: Path, event: str = "PreToolUse") -> bytes:
    """What Claude Code sends a PreToolUse (or PostToolUse) hook for an ordinary Bash call."""
    payload: dict[str, t.Any] = {
        "session_id": "5b0c2c9e-8f0e-4f57-a7a4-3d0f5c1c9a11",
        "transcript_path": "/root/.claude/projects/-tmp-x/5b0c2c9e-8f0e-4f57-a7a4-3d0f5c1c9a11.jsonl",
        "cwd": str(worktree),
        "permission_mode": "bypassPermissions",
        "hook_event_name": event,
        "tool_name": "Bash",
        "tool_input": {"command": "python -m pytest -q tests/test_parser.py && git status --short",
                       "description": "Run the parser tests"},
        "tool_use_id": "toolu_01AbCdEfGhIjKlMnOpQrStUv",
    }
    if event == "PostToolUse":
        payload["tool_response"] = {"stdout": "....\n4 passed in 0.31s\n M src/parser.py", "stderr": "",
                                    "interrupted": False, "isImage": False, "noOutputExpected": False}
        payload["duration_ms"] = 812
    return json.dumps(payload).encode()


def _setup(ctx: Context) -> dict[str, t.Any]:
    from overstory.paths import ProjectPaths
    from overstory.store import budgets, sessions
    from overstory.store.db import open_events, open_state

    root = make_repo(ctx.scratch / "fig1-project", files=20)
    init_project(root)
    project = ProjectPaths(root)
    sleeper = start_sleeper(ctx.registry)
    state = open_state(project.state_db)
    events = open_events(project.events_db)
    try:
        # 50 agents, as `ov status --json` is specified: mostly idle between turns, some in a turn.
        names = add_agents(state, 49, prefix="builder-", loop=(sleeper.pid, sleeper.ticks),
                           states=("between_turns", "between_turns", "in_turn", "completed"),
                           worktree_root=str(project.worktrees_dir))
        # The agent whose hooks we time has a real worktree and branch.
        worktree = project.worktree(AGENT)
        git(root, "worktree", "add", "-q", "-b", f"ov/{AGENT}", str(worktree), "main")
        generation = sessions.create_session(state, name=AGENT, capability="builder", task_id="hot", runtime="scripted",
                                             actor="bench", worktree=str(worktree), branch=f"ov/{AGENT}",
                                             base_branch="main")
        # As `ov sling` does: a budget row, with a tool-call limit the bench never reaches.
        budgets.create_agent(state, AGENT, generation, run_id=None, limits={"max_tool_calls": 10**9})
        sessions.transition(state, AGENT, generation, "in_turn", actor="bench")
        sessions.update_fields(state, AGENT, generation, loop_pid=sleeper.pid, loop_start_ticks=sleeper.ticks)
        names.append(AGENT)
        add_mail(state, 5_000, names)
        add_events(events, 20_000, names)
    finally:
        state.close()
        events.close()
    # The agent's loop holds state.db open for its whole life, so a guard's connection is never the last one
    # to close (the last one to close checkpoints the WAL, an fsync): keep one open as the loop would.
    loop_connection = open_state(project.state_db)
    # ... and serves the agent's endpoint, which its hot commands are clients of during a turn.
    from overstory.endpoint.routes import ROUTES
    from overstory.endpoint.server import AgentEndpoint

    endpoint = AgentEndpoint(project, AGENT, generation, ROUTES, {}).start()
    return {"root": root, "project": project, "worktree": worktree, "names": names, "generation": generation,
            "loop_connection": loop_connection, "endpoint": endpoint}


def _commands(ctx: Context, env: dict[str, str], setup: dict[str, t.Any]) -> dict[str, Command]:
    from overstory.store.db import open_state

    root, worktree, project = setup["root"], setup["worktree"], setup["project"]
    # As a turn's environment: its id, attempt and the mail it answers, which the ledger records.
    agent_env = {**env, "OVERSTORY_AGENT_NAME": AGENT, "OVERSTORY_CAPABILITY": "builder",
                 "OVERSTORY_PROJECT_ROOT": str(root), "OVERSTORY_WORKTREE": str(worktree),
                 "OVERSTORY_BRANCH": f"ov/{AGENT}", "OVERSTORY_TASK_ID": "hot",
                 "OVERSTORY_GENERATION": str(setup["generation"]), "OVERSTORY_TURN_ID": "bench-turn",
                 "OVERSTORY_ATTEMPT": "0", "OVERSTORY_DISPATCH": "1"}
    # Without the generation the guard skips its budget count: the guard as it was before budgets.
    uncounted_env = {k: v for k, v in agent_env.items() if k != "OVERSTORY_GENERATION"}
    # In a turn the same commands find the agent's endpoint in their environment and ask its loop.
    endpoint = setup["endpoint"]
    turn_env = {**agent_env, **endpoint.open_turn(turn_env={k: v for k, v in agent_env.items()
                                                            if k.startswith("OVERSTORY_")})}
    endpoint.set_turn_env(agent_env)
    py = ctx.python
    mail_send = [ctx.ov, "mail", "send", "--to", "builder-002", "--subject", "status", "--body", "parser done; tests next"]

    def one_new_message() -> None:
        conn = open_state(project.state_db)
        try:
            from overstory.store import mail

            mail.insert_message(conn, sender="operator", recipient=AGENT, subject="keep going",
                                body="The reviewer asked for one more test.")
        finally:
            conn.close()

    def allowed(done: subprocess.CompletedProcess[bytes]) -> str | None:
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        return f"guard denied an ordinary call: {done.stdout.decode()[:200]}" if done.stdout.strip() else None

    def got_one(done: subprocess.CompletedProcess[bytes]) -> str | None:
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        return None if b"keep going" in done.stdout else f"mail check did not show the new message: {done.stdout[:200]!r}"

    def fifty_agents(done: subprocess.CompletedProcess[bytes]) -> str | None:
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        document = json.loads(done.stdout)
        return None if document["totals"]["agents"] == 50 else f"status saw {document['totals']['agents']} agents"

    return {
        "floor: python -c pass": Command([py, "-c", "pass"], env),
        "floor: python -c 'import click'": Command([py, "-c", "import click"], env),
        # What the hot commands once needed from the standard library (the generated `ov` script imported re).
        "floor: python -c 'import re, json, sqlite3'": Command([py, "-c", "import re, json, sqlite3"], env),
        "ov --version": Command([ctx.ov, "--version"], env, cwd=root),
        # The operator's commands (and an agent's, with no endpoint to ask) work on the databases themselves.
        "ov mail send": Command(mail_send, env, cwd=root),
        "ov mail check (1 new)": Command([ctx.ov, "mail", "check"], agent_env, cwd=worktree, check=got_one,
                                         before=one_new_message),
        "ov guard (Bash PreToolUse)": Command([ctx.ov, "guard"], agent_env, cwd=worktree,
                                              stdin=_guard_input(worktree), check=allowed),
        "ov guard --post (Bash PostToolUse)": Command([ctx.ov, "guard", "--post"], agent_env, cwd=worktree,
                                                      stdin=_guard_input(worktree, "PostToolUse"), check=allowed),
        "ov guard, no budget count": Command([ctx.ov, "guard"], uncounted_env, cwd=worktree,
                                             stdin=_guard_input(worktree), check=allowed),
        "ov status --json (50 agents)": Command([ctx.ov, "status", "--json"], env, cwd=root,
                                                check=fifty_agents),
        # An agent's commands during a turn: clients of its endpoint (the loop does the work).
        f"{IN_TURN} ov mail send": Command(mail_send, turn_env, cwd=worktree),
        f"{IN_TURN} ov mail check (1 new)": Command([ctx.ov, "mail", "check"], turn_env, cwd=worktree,
                                                    check=got_one, before=one_new_message),
        f"{IN_TURN} ov guard (Bash PreToolUse)": Command([ctx.ov, "guard"], turn_env, cwd=worktree,
                                                         stdin=_guard_input(worktree), check=allowed),
        f"{IN_TURN} ov guard --post (Bash PostToolUse)": Command(
            [ctx.ov, "guard", "--post"], turn_env, cwd=worktree, stdin=_guard_input(worktree, "PostToolUse"),
            check=allowed),
        f"{IN_TURN} ov status --json (50 agents)": Command([ctx.ov, "status", "--json"], turn_env, cwd=worktree,
                                                           check=fifty_agents),
    }


def _cpu_rows(cpu: dict[str, list[float]], label: str) -> list[dict[str, t.Any]]:
    """Each command's CPU time (user + system) against `python -c pass`'s, from the same interleaved runs.

    On this shared machine other sessions' load stretches wall time (a core is not free when a
    process wants it) far more than CPU time, so this ratio is the steadier view of the same target."""
    floor = Stats(cpu["floor: python -c pass"])
    rows = []
    for name, samples in cpu.items():
        if name.startswith("floor") and name != "floor: python -c pass" and "re, json" not in name:
            continue
        measured = Stats(samples)
        rows.append(row(1, f"{name}, CPU time [{label}]", "ms", measured, ratio=measured.median / floor.median,
                        baseline="python -c pass, CPU time"))
    return rows


def _guard_cpu_rows(commands: dict[str, Command], label: str, *, rounds: int) -> list[dict[str, t.Any]]:
    """CPU time (user + system) of each guard process, alternating the two: unlike wall time, CPU time does
    not include waiting for a core, so other sessions' load on this shared machine hardly moves it."""
    import resource

    names = ("ov guard (Bash PreToolUse)", "ov guard, no budget count")
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds + 2):
        for name in (names if index % 2 == 0 else names[::-1]):
            command = commands[name]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(command.argv, input=command.stdin, capture_output=True, env=command.env, cwd=command.cwd,
                           check=False)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if index >= 2:
                cpu[name].append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    counted, uncounted = (Stats(cpu[name]) for name in names)
    return [
        row(1, f"ov guard CPU time [{label}]", "ms", counted),
        row(1, f"ov guard, no budget count, CPU time [{label}]", "ms", uncounted),
        row(1, f"ov guard: CPU the budget count adds [{label}]", "ms",
            Stats([a - b for a, b in zip(counted.samples, uncounted.samples)]),
            note="per-pair differences of user+system CPU time (getrusage of each finished child)"),
    ]


def _budget_count_rows(setup: dict[str, t.Any]) -> list[dict[str, t.Any]]:
    """The guard's budget count alone, in-process: one UPDATE (and its roll-up trigger) per call."""
    import time

    from overstory.store.budgets import get_agent
    from overstory.store.db import open_state
    from overstory.store.tool_count import count_tool_call

    db = str(setup["project"].state_db)
    samples = []
    for _ in range(1000):
        started = time.perf_counter()
        refusal = count_tool_call(db, AGENT, setup["generation"])
        samples.append((time.perf_counter() - started) * 1000)
        assert refusal is None
    conn = open_state(setup["project"].state_db)
    try:
        counted = get_agent(conn, AGENT, setup["generation"]).tool_calls
    finally:
        conn.close()

    return [row(1, "guard budget count in-process (connect + one UPDATE)", "ms", Stats(samples), digits=3,
                note=f"1000 calls; the agent's tool_calls counter reached {counted}")]


_IMPORT_LINE = re.compile(r"^import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")


def import_profile(argv: list[str], env: dict[str, str], cwd: Path, stdin: bytes = b"",
                   wanted: t.Sequence[str] = ()) -> dict[str, t.Any]:
    """`python -X importtime` of one run: top-level imports by cumulative time, heavy modules seen.

    ``wanted`` names modules (at any depth) whose cumulative time is reported too.
    """
    done = subprocess.run(argv[:1] + ["-X", "importtime"] + argv[1:], input=stdin, capture_output=True, env=env,
                          cwd=cwd, check=False)
    modules: list[tuple[str, int, int, int]] = []
    for line in done.stderr.decode(errors="replace").splitlines():
        match = _IMPORT_LINE.match(line)
        if match:
            modules.append((match.group(4), int(match.group(1)), int(match.group(2)), len(match.group(3))))
    top_level = sorted(((name, cumulative) for name, _self, cumulative, indent in modules if indent <= 1),
                       key=lambda item: -item[1])
    names = {name for name, *_ in modules}
    heavy = sorted({h for h in HEAVY_MODULES for n in names if n == h or n.startswith(h + ".")})
    own_self_us = sum(self_us for name, self_us, _c, _i in modules if name.startswith("overstory"))
    return {
        "modules": len(modules),
        "total_ms": round(sum(self_us for _n, self_us, _c, _i in modules) / 1000, 1),
        "overstory_self_ms": round(own_self_us / 1000, 1),
        "top_level_ms": [[name, round(us / 1000, 1)] for name, us in top_level[:8]],
        "heavy_modules_imported": heavy,
        "wanted_ms": {name: round(cumulative / 1000, 1) for name, _s, cumulative, _i in modules if name in wanted},
        "exit": done.returncode,
    }


def run(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    setup = _setup(ctx)
    rows: list[dict[str, t.Any]] = []
    details: dict[str, t.Any] = {"import_profiles": {}, "errors": []}
    for mode in ("on", "off"):
        pycache = ctx.scratch / f"pycache-{mode}"
        env = clean_env(mode, pycache_dir=pycache)
        commands = _commands(ctx, env, setup)
        cpu: dict[str, list[float]] = {}
        stats, errors = time_interleaved(commands, rounds=ctx.p("fig1_rounds"), warmup=ctx.p("fig1_warmup"), cpu=cpu)
        details["errors"] += [f"[bytecode {mode}] {e}" for e in errors]
        click_floor: Stats = stats["floor: python -c 'import click'"]
        pass_floor: Stats = stats["floor: python -c pass"]
        label = "bytecode cache on" if mode == "on" else "bytecode cache off"
        # This sandbox has a site-packages .pth file that imports certifi in every Python
        # process, floors included; it flattens the ratios, so they are also given without it.
        floor_profile = import_profile([ctx.python, "-c", "pass"], env, setup["root"], wanted=("certifi",))
        pth_ms = floor_profile["wanted_ms"].get("certifi", 0.0)
        details.setdefault("startup_pth_ms", {})[mode] = pth_ms
        for name, measured in stats.items():
            if name.startswith("floor"):
                ratio_to_pass = measured.median / stats["floor: python -c pass"].median
                rows.append(row(1, f"{name} [{label}]", "ms", measured, ratio=ratio_to_pass,
                                baseline="python -c pass"))
                continue
            ratio = measured.median / pass_floor.median
            hot = name not in CLICK_COMMANDS
            rows.append(row(1, f"{name} [{label}]", "ms", measured, ratio=ratio, baseline="python -c pass",
                            target=f"<= {TARGET_RATIO:g}x python -c pass" if hot else None,
                            met=ratio <= TARGET_RATIO if hot else None,
                            ratio_click=round(measured.median / click_floor.median, 3),
                            baseline_click="python -c 'import click'",
                            over_pass_floor_ms=round(measured.median - pass_floor.median, 1),
                            ratio_of_minimums=round(measured.min / pass_floor.min, 3),
                            ratio_without_startup_pth=round((measured.median - pth_ms) / (pass_floor.median - pth_ms), 3)))
        rows.extend(_cpu_rows(cpu, label))
        rows.extend(_guard_cpu_rows(commands, label, rounds=ctx.p("fig1_rounds")))
        counted, uncounted = stats["ov guard (Bash PreToolUse)"], stats["ov guard, no budget count"]
        paired = Stats([a - b for a, b in zip(counted.samples, uncounted.samples)])
        rows.append(row(1, f"ov guard: time the budget count adds [{label}]", "ms", paired,
                        note="per-round differences (the two guards run back to back in every round), median and "
                             f"range; medians alone: {counted.median - uncounted.median:+.1f} ms"))
        for name, command in commands.items():
            if name.startswith("floor"):
                continue
            if command.before is not None:
                command.before()
            details["import_profiles"].setdefault(mode, {})[name] = import_profile(
                [ctx.python, *command.argv], command.env, Path(command.cwd or setup["root"]), command.stdin)
    rows.extend(_budget_count_rows(setup))
    setup["endpoint"].close()
    setup["loop_connection"].close()
    for mode, pth_ms in details.get("startup_pth_ms", {}).items():
        if pth_ms:
            adjusted = ", ".join(f"{r['name'].split(' [')[0]} {r['ratio_without_startup_pth']:.2f}x" for r in rows
                                 if "ratio_without_startup_pth" in r and f"cache {mode}]" in r["name"])
            add_note(rows, f"[bytecode cache {mode}] every Python start here imports certifi from a sandbox .pth file "
                           f"({pth_ms} ms, in the floors too); without it the ratios would be: {adjusted}", 1)
    if details["errors"]:
        add_note(rows, f"{len(details['errors'])} command run(s) failed; see details.errors in the JSON")
    return rows, details
