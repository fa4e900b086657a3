"""Figures 4 to 7: the watchdog, spawning, memory, and 50 agents at once.

Real processes throughout: `ov sling` starts real detached agent loops, whose turns
run the scripted runtime (a stand-in for `claude -p` that plays a scenario and
really runs its shell commands and hooks: `ov guard`, `ov mail send`, git). The
bench registers every loop it caused and stops it at the end (`ov stop`, then the
recorded process group if anything is still alive).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sqlite3
import subprocess
import threading
import time
import typing as t
from pathlib import Path

from context import Context
from harness import (
    Command,
    Stats,
    add_note,
    alive,
    git,
    init_project,
    make_repo,
    row,
    rss_kib,
    start_sleeper,
    start_ticks,
    time_calls,
    time_interleaved,
    tracked_files,
)

TICK_TARGET_MS = 50.0


def _ro(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    return conn


def _wait(predicate: t.Callable[[], t.Any], timeout: float, interval: float = 0.05) -> t.Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def _sling(ctx: Context, root: Path, capability: str, task: str, *extra: str,
           env: dict[str, str] | None = None) -> dict[str, t.Any]:
    done = ctx.ov_run("sling", capability, task, "--runtime", "scripted", "--json", *extra, cwd=root, env=env)
    result = json.loads(done.stdout)
    pid = result.get("loop_pid")
    if pid:
        ctx.registry.adopt(pid, start_ticks(pid))
    return result


def _stop_agents(ctx: Context, root: Path, names: t.Iterable[str]) -> list[str]:
    """`ov stop` every agent that is not terminal or whose loop still runs; returns what needed it."""
    from overstory.paths import ProjectPaths
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(ProjectPaths(root).state_db)
    try:
        rows = [sessions.get(conn, name) for name in names]
    finally:
        conn.close()
    stopped = []
    for agent in rows:
        if agent is None:
            continue
        if not agent.is_terminal or alive(agent.loop_pid, agent.loop_start_ticks):
            ctx.ov_run("stop", agent.name, "--force", cwd=root, check=False)
            stopped.append(agent.name)
    return stopped


# ---- figure 4 -----------------------------------------------------------------------


def run_watchdog(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    from synthetic import add_agents

    from overstory.paths import ProjectPaths
    from overstory.store.db import open_state
    from overstory.watchdog.daemon import Watchdog, WatchdogSettings

    sleeper = start_sleeper(ctx.registry)
    rows: list[dict[str, t.Any]] = []
    details: dict[str, t.Any] = {}
    for count in (10, 100, 500):
        root = make_repo(ctx.scratch / f"fig4-{count}")
        init_project(root)
        project = ProjectPaths(root)
        state = open_state(project.state_db)
        # Every agent is alive and fine: three in four idle between turns, one in four in a turn
        # with fresh activity. Their loop is a live process, so each tick checks /proc for each.
        add_agents(state, count, prefix="agent-", loop=(sleeper.pid, sleeper.ticks),
                   states=("between_turns", "between_turns", "between_turns", "in_turn"))
        started_loops: list[str] = []

        def refuse(_project: t.Any, agent: str, _generation: int) -> tuple[int, int | None]:
            started_loops.append(agent)
            raise RuntimeError("nothing to do, yet the watchdog wanted to start a loop")

        dog = Watchdog(project, WatchdogSettings(), state=state, spawn=refuse)
        actions: list[t.Any] = []
        try:
            ticks = time_calls(lambda: actions.extend(dog.tick()), repeat=ctx.p("fig4_ticks"), warmup=3)
            reconcile = time_calls(dog.reconcile, repeat=3, warmup=1) if count == 500 else None
        finally:
            dog.close()
            state.close()
        idle = not actions and not started_loops
        target = f"< {TICK_TARGET_MS:g} ms" if count == 500 else None
        rows.append(row(4, f"watchdog tick, {count} agents, nothing to do", "ms", ticks, digits=3,
                        target=target, met=(ticks.median < TICK_TARGET_MS and idle) if target else None,
                        note=None if idle else f"the tick acted: {[a.as_dict() for a in actions][:3]}"))
        if reconcile is not None:
            rows.append(row(4, "watchdog start-up reconcile, 500 agents", "ms", reconcile, digits=1))
        details[str(count)] = {"actions": len(actions), "loops_started": len(started_loops)}
    if not alive(sleeper.pid, sleeper.ticks):
        add_note(rows, "the stand-in loop process died during the ticks (something killed it)", 4)
    return rows, details


# ---- figure 5 -----------------------------------------------------------------------


def _first_events(events_db: Path, agent: str) -> dict[str, int]:
    conn = _ro(events_db)
    try:
        found = conn.execute("SELECT kind, min(at) FROM events WHERE agent = ? AND kind IN "
                             "('spawn', 'loop_start', 'turn_start', 'turn_end') GROUP BY kind", (agent,)).fetchall()
    finally:
        conn.close()
    return {r[0]: r[1] for r in found}


def _completed_at(state_db: Path, agent: str) -> int | None:
    conn = _ro(state_db)
    try:
        found = conn.execute("SELECT max(at) FROM transitions WHERE name = ? AND to_state = 'completed'",
                             (agent,)).fetchone()
    finally:
        conn.close()
    return found[0] if found else None


def _create_files(target: Path, count: int) -> None:
    """The file-system floor of any checkout: ``count`` small files in the same layout."""
    for index in range(count):
        folder = target / "src" / f"pkg{index // 100:03d}"
        if index % 100 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"module_{index % 100:03d}.py").write_text(f'"""module {index}"""\n\n\ndef value_{index}():\n'
                                                              f'    return {index}\n')


def _time_worktree_add(root: Path, path: Path, branch: str, env: dict[str, str]) -> float:
    git(root, "branch", branch, "main")
    os.sync()  # our own earlier writes must not be flushed inside the timed command
    started = time.perf_counter()
    subprocess.run(["git", "worktree", "add", "-q", str(path), branch], cwd=root, check=True, env=env,
                   capture_output=True)
    elapsed = (time.perf_counter() - started) * 1000
    git(root, "worktree", "remove", "--force", str(path))
    git(root, "branch", "-D", branch)
    return elapsed


def _time_files_floor(scratch: Path, index: int, count: int) -> float:
    target = scratch / f"fig5-files-{index}"
    os.sync()
    started = time.perf_counter()
    _create_files(target, count)
    elapsed = (time.perf_counter() - started) * 1000
    shutil.rmtree(target)
    return elapsed


def run_spawn(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    """Each round times, in a rotating order: the file floor, `git worktree add` alone, `ov sling`.

    This sandbox's file system is slow and noisy at creating files, so the three are
    interleaved round by round and compared as ratios of medians.
    """
    from fig_commands import import_profile

    from overstory.paths import ProjectPaths
    from overstory.store import sessions
    from overstory.store.db import open_state

    count = ctx.p("fig5_files")
    root = make_repo(ctx.scratch / "fig5-project", files=count)
    init_project(root)
    project = ProjectPaths(root)
    files = tracked_files(root)
    env = ctx.env()
    rows: list[dict[str, t.Any]] = []
    floor_ms: list[float] = []
    worktree_ms: list[float] = []
    timeline: dict[str, list[float]] = collections.defaultdict(list)
    problems: list[str] = []
    profile: dict[str, t.Any] = {}
    names: list[str] = []

    def sling_once(index: int) -> None:
        nonlocal profile
        task = f"s{index}"
        name = f"scout-{task}"
        names.append(name)
        argv = [ctx.ov, "sling", "scout", task, "--runtime", "scripted", "--json"]
        os.sync()
        wall_start_ms = time.time() * 1000
        started = time.perf_counter()
        if index == 0:  # the warm-up, profiled with -X importtime
            profile = import_profile([ctx.python, *argv], env, root)
            if profile["exit"] != 0:
                raise RuntimeError("ov sling failed under -X importtime")
        else:
            done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"ov sling failed: {done.stderr.strip()[-400:]}")
        exit_ms = (time.perf_counter() - started) * 1000
        conn = open_state(project.state_db)
        agent = sessions.get(conn, name)
        conn.close()
        if agent is not None and agent.loop_pid:
            ctx.registry.adopt(agent.loop_pid, agent.loop_start_ticks)
        firsts = _wait(lambda: (lambda found: found if "turn_start" in found else None)(
            _first_events(project.events_db, name)), timeout=60, interval=0.01) or {}
        completed = _wait(lambda: _completed_at(project.state_db, name), timeout=60, interval=0.05)
        if "turn_start" not in firsts or completed is None:
            problems.append(f"{name}: first event {'seen' if 'turn_start' in firsts else 'missing'}, "
                            f"{'completed' if completed else 'not completed within 60 s'}")
        if index:
            timeline["sling command exit"].append(exit_ms)
            for kind, label in (("spawn", "spawn event (sling's last step)"), ("loop_start", "agent loop started"),
                                ("turn_start", "first runtime event (turn_start)")):
                if kind in firsts:
                    timeline[label].append(firsts[kind] - wall_start_ms)
            if completed is not None:
                timeline["agent completed (scout turn done)"].append(completed - wall_start_ms)
        ctx.ov_run("stop", name, "--clean", "--force", cwd=root, check=False)

    rounds = ctx.p("fig5_spawns")
    sling_once(0)  # the warm-up (git's object cache, .pyc files, the loop's imports), profiled
    for index in range(1, rounds + 1):
        steps: list[t.Callable[[], None]] = [
            lambda: floor_ms.append(_time_files_floor(ctx.scratch, index, count)),
            lambda: worktree_ms.append(_time_worktree_add(root, project.worktree(f"bench-wt-{index}"),
                                                          f"bench-wt-{index}", env)),
            lambda: sling_once(index),
        ]
        shift = index % len(steps)
        for step in steps[shift:] + steps[:shift]:
            step()
    floor = Stats(floor_ms)
    worktree = Stats(worktree_ms)
    rows.append(row(5, f"floor: create {count:,} small files (python, same layout)", "ms", floor, digits=1))
    rows.append(row(5, f"git worktree add alone ({files:,} tracked files)", "ms", worktree, digits=1,
                    ratio=worktree.median / floor.median, baseline="creating the files"))
    for label, samples in timeline.items():
        if not samples:
            continue
        stats = Stats(samples)
        is_figure = label.startswith("first runtime event")
        rows.append(row(5, f"ov sling -> {label}", "ms", stats, digits=1,
                        ratio=stats.median / worktree.median if is_figure else None,
                        baseline="git worktree add" if is_figure else None,
                        over_worktree_ms=round(stats.median - worktree.median, 1) if is_figure else None))
    if floor.min and floor.max / floor.min > 3:
        add_note(rows, f"creating the same 5,000 files took from {floor.min:,.0f} to {floor.max:,.0f} ms during this "
                       "figure: this machine's disk speed varies a lot, so compare the ratios, not the absolutes", 5)
    git_import = next((ms for name, ms in profile.get("top_level_ms", []) if name == "git"), None)
    if git_import is not None:
        add_note(rows, f"`ov sling` imports gitpython ({git_import} ms cumulative, -X importtime) to run one "
                       "`git worktree add`", 5)
    for problem in problems:
        add_note(rows, problem, 5)
    _stop_agents(ctx, root, names)
    return rows, {"files": files, "sling_import_profile": profile, "problems": problems}


# ---- figure 6 -----------------------------------------------------------------------


def _cpu_ticks(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def _idle_loops(ctx: Context, count: int) -> dict[str, t.Any]:
    """``count`` idle agent loops (scouts after one turn that did not finish, waiting for mail): memory, CPU."""
    from concurrent.futures import ThreadPoolExecutor

    from overstory.paths import ProjectPaths
    from overstory.store import sessions
    from overstory.store.db import open_state

    root = make_repo(ctx.scratch / f"fig6-idle-{count}")
    init_project(root)
    project = ProjectPaths(root)
    project.local_config_file.write_text(f"agents:\n  max_concurrent_agents: {count + 10}\n")
    scenario = ctx.scratch / "fig6-idle-scenario.json"
    scenario.write_text(json.dumps({"turns": [{"actions": [
        {"bash": "ov mail send --to operator --subject 'waiting for review' --body 'idle until you write'"}],
        "result": "waiting"}]}))
    with ThreadPoolExecutor(SLINGERS) as pool:
        names = [slung["name"] for slung in pool.map(
            lambda i: _sling(ctx, root, "scout", f"idle{i:02d}", "--scenario", str(scenario)), range(count))]

    def all_idle() -> bool:
        conn = open_state(project.state_db)
        try:
            agents = [sessions.get(conn, n) for n in names]
        finally:
            conn.close()
        return all(a is not None and a.state == "between_turns" and a.turns >= 1 for a in agents)

    try:
        if not _wait(all_idle, timeout=60 + 3 * count, interval=0.2):
            raise RuntimeError(f"the {count} idle agents did not finish their first turn in time")
        conn = open_state(project.state_db)
        loops = [(a.loop_pid, a.loop_start_ticks) for a in (sessions.get(conn, n) for n in names) if a is not None]
        conn.close()
        time.sleep(1.0)
        per_loop: dict[str, list[float]] = collections.defaultdict(list)
        totals: dict[str, list[float]] = collections.defaultdict(list)
        cpu_before = {pid: _cpu_ticks(pid) for pid, _ in loops}
        window = 3.0 if ctx.quick else 6.0
        window_start = time.monotonic()
        for _ in range(6):
            round_total: dict[str, float] = collections.defaultdict(float)
            for pid, _ticks in loops:
                memory = rss_kib(pid)  # type: ignore[arg-type]
                if memory:
                    for key in ("VmRSS", "Pss", "RssAnon"):
                        per_loop[key].append(memory.get(key, 0) / 1024)
                        round_total[key] += memory.get(key, 0) / 1024
            for key, value in round_total.items():
                totals[key].append(value)
            time.sleep(window / 6)
        elapsed = time.monotonic() - window_start
        hz = os.sysconf("SC_CLK_TCK")
        spent = sum((_cpu_ticks(pid) or 0) - (cpu_before[pid] or 0) for pid, _ in loops)
        return {"loops": loops, "per_loop": per_loop, "totals": totals, "elapsed": elapsed, "hz": hz, "spent": spent,
                "cpu_per_loop": spent / hz / elapsed / max(1, len(loops)) * 100}
    finally:
        _stop_agents(ctx, root, names)
        stopped = _wait(lambda: not any(alive(pid, ticks) for pid, ticks in _loops_of(project, names)), timeout=30)
        if not stopped:
            print(f"figure 6: an agent loop of {root} was still alive 30 s after `ov stop`", flush=True)


def _loops_of(project: t.Any, names: list[str]) -> list[tuple[int, int | None]]:
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(project.state_db)
    try:
        return [(a.loop_pid, a.loop_start_ticks) for a in (sessions.get(conn, n) for n in names)
                if a is not None and a.loop_pid]
    finally:
        conn.close()


IDLE_50_TARGET_MIB = 1024.0


def run_memory(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    from synthetic import add_agents, add_events, add_mail

    from overstory.paths import ProjectPaths
    from overstory.store.db import open_events, open_state

    rows: list[dict[str, t.Any]] = []
    details: dict[str, t.Any] = {}
    # -- idle per-agent loops, 1 and 50 (quick: 1 and 10) at once
    floor = ctx.registry.start([ctx.python, "-c", "import sqlite3, time; time.sleep(600)"], env=ctx.env())
    time.sleep(1.0)
    floor_rss = Stats([(rss_kib(floor.pid) or {}).get("VmRSS", 0) / 1024 for _ in range(3)])
    floor_pss = Stats([(rss_kib(floor.pid) or {}).get("Pss", 0) / 1024 for _ in range(3)])
    for count in (1, ctx.p("fig6_idle_agents")):
        measured = _idle_loops(ctx, count)
        label = f"{count} idle agent loop{'s' if count != 1 else ''}"
        per_loop, totals = measured["per_loop"], measured["totals"]
        note = f"{len(measured['loops'])} loop(s) after one scripted turn, 6 samples each"
        rss = Stats(per_loop["VmRSS"])
        rows.append(row(6, f"{label}: resident memory (VmRSS) per loop", "MiB", rss, digits=1,
                        ratio=rss.median / floor_rss.median, baseline="python -c 'import sqlite3; sleep'", note=note))
        rows.append(row(6, f"{label}: proportional memory (Pss) per loop", "MiB", Stats(per_loop["Pss"]), digits=1))
        rows.append(row(6, f"{label}: private memory (RssAnon) per loop", "MiB", Stats(per_loop["RssAnon"]), digits=1))
        if count > 1:
            rows.append(row(6, f"{label}: VmRSS summed", "MiB", Stats(totals["VmRSS"]), digits=0))
            pss_total = Stats(totals["Pss"])
            scaled = pss_total.median * 50 / count
            rows.append(row(6, f"{label}: Pss summed (what they cost together)", "MiB", pss_total, digits=0,
                            target=f"50 agents < {IDLE_50_TARGET_MIB:g} MiB", met=scaled < IDLE_50_TARGET_MIB,
                            note=None if count == 50 else f"x 50/{count} = {scaled:.0f} MiB for 50"))
        rows.append(row(6, f"{label}: CPU while waiting for mail", "% of a core", value=measured["cpu_per_loop"],
                        digits=3, note=f"each loop polls the database every 0.4 s; {measured['spent']} clock ticks "
                                       f"(1/{measured['hz']} s) over {len(measured['loops'])} loop(s) x "
                                       f"{measured['elapsed']:.1f} s"))
        details[f"idle_{count}"] = {key: value for key, value in measured.items() if key != "loops"}
    rows.append(row(6, "floor: idle python with sqlite3 (VmRSS)", "MiB", floor_rss, digits=1))
    rows.append(row(6, "floor: idle python with sqlite3 (Pss)", "MiB", floor_pss, digits=1))

    # -- ov watch --once with 200 agents and 100,000 events
    root = make_repo(ctx.scratch / "fig6-watch")
    init_project(root)
    project = ProjectPaths(root)
    sleeper = start_sleeper(ctx.registry)
    state = open_state(project.state_db)
    events = open_events(project.events_db)
    try:
        agents = add_agents(state, 200, prefix="agent-", loop=(sleeper.pid, sleeper.ticks),
                            states=("between_turns", "in_turn", "completed", "completed", "between_turns"))
        add_mail(state, 2_000, agents)
        add_events(events, 100_000, agents)
        from overstory.views import status as status_core

        snapshot = time_calls(lambda: status_core.dashboard_snapshot(state, events), repeat=10, warmup=2)
    finally:
        state.close()
        events.close()
    env = ctx.env()

    def shows_agents(done: subprocess.CompletedProcess[bytes]) -> str | None:
        if done.returncode != 0:
            return f"exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}"
        return None if b"agent-001" in done.stdout else "the frame does not show agent-001"

    commands = {
        "floor: python -c 'import click'": Command([ctx.python, "-c", "import click"], env),
        "floor: python -c 'import rich.console, rich.table'": Command(
            [ctx.python, "-c", "import rich.console, rich.table, rich.text, rich.box"], env),
        "ov watch --once": Command([ctx.ov, "watch", "--once", "--width", "120"], env, cwd=root, check=shows_agents),
    }
    stats, errors = time_interleaved(commands, rounds=ctx.p("fig6_watch_rounds"), warmup=2)
    rich_floor = stats["floor: python -c 'import rich.console, rich.table'"]
    watch = stats["ov watch --once"]
    rows.append(row(6, "ov watch --once (200 agents, 100k events)", "ms", watch, digits=1,
                    ratio=watch.median / rich_floor.median, baseline="python -c 'import rich.console, rich.table'"))
    rows.append(row(6, "floor: python -c 'import rich.console, rich.table'", "ms", rich_floor, digits=1))
    rows.append(row(6, "status.dashboard_snapshot in-process (the queries of one frame)", "ms", snapshot, digits=2))
    peak = subprocess.run([ctx.python, "-c", "import resource, subprocess, sys; "
                           "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); "
                           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
                           ctx.ov, "watch", "--once", "--width", "120"], cwd=root, env=env, capture_output=True,
                          text=True, check=False)
    if peak.returncode == 0:
        rows.append(row(6, "ov watch --once, peak resident memory", "MiB", value=int(peak.stdout) / 1024, digits=1))
    for error in errors[:3]:
        add_note(rows, error, 6)
    details["watch_errors"] = errors
    return rows, details


# ---- figure 7 -----------------------------------------------------------------------


class _LoopSampler:
    """Samples the summed proportional memory (Pss) of the agent loops and how many are alive, every 0.5 s."""

    def __init__(self) -> None:
        self.loops: list[tuple[int, int | None]] = []
        self.peak_rss_mib = 0.0
        self.peak_alive = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_event.wait(0.5):
            live = [(pid, ticks) for pid, ticks in list(self.loops) if alive(pid, ticks)]
            total = sum((rss_kib(pid) or {}).get("Pss", 0) for pid, _ in live) / 1024
            self.peak_rss_mib = max(self.peak_rss_mib, total)
            self.peak_alive = max(self.peak_alive, len(live))

    def __enter__(self) -> _LoopSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join()


SLINGERS = 4  # `ov sling` processes at once while setting up figure 7


def _gated_scenario(path: Path, capability: str, gate: Path) -> Path:
    """ov's built-in scenario for ``capability``, held at its first action until ``gate`` exists.

    The gate is an ordinary Bash tool call (so it passes `ov guard` like any other);
    it makes all agents alive at once before any of them may finish.
    """
    from overstory.runtimes.scripted.scenarios import default_scenario

    scenario = default_scenario(capability, "${OVERSTORY_TASK_ID}")
    scenario["turns"][0]["actions"].insert(0, {"bash": f"while [ ! -e {gate} ]; do sleep 0.05; done"})
    path.write_text(json.dumps(scenario, indent=2))
    return path


def _scale_once(ctx: Context, index: int, count: int) -> dict[str, t.Any]:
    from concurrent.futures import ThreadPoolExecutor

    from overstory.config.model import load_config
    from overstory.paths import ProjectPaths
    from overstory.store import sessions
    from overstory.store.db import open_state

    root = make_repo(ctx.scratch / f"fig7-run{index}")
    init_project(root)
    project = ProjectPaths(root)
    # The default cap is 20 active agents; this figure needs 50 at once. Turn slots stay at the default.
    project.local_config_file.write_text(f"agents:\n  max_concurrent_agents: {count + 10}\n")
    config = load_config(project.config_file, project.local_config_file, environ=ctx.env())
    env = ctx.env()
    gate = project.ov_dir / "fig7-gate"  # inside the project: agents see it from their sandboxes (read-only)
    scenarios = {cap: _gated_scenario(ctx.scratch / f"fig7-{cap}-{index}.json", cap, gate) for cap in ("builder", "scout")}
    plan = [("builder" if number % 2 == 0 else "scout", f"t{number:02d}") for number in range(count)]
    names = [f"{capability}-{task}" for capability, task in plan]
    builders = [name for name in names if name.startswith("builder-")]
    result: dict[str, t.Any] = {"agents": count, "max_concurrent_turns": config.turns.max_concurrent,
                                "max_concurrent_agents": config.agents.max_concurrent_agents, "slingers": SLINGERS}
    timeout = 240 if not ctx.quick else 100
    sling_errors: list[str] = []  # slings that failed for good
    sling_retries: list[str] = []  # failures that a second `ov sling` of the same agent got past
    slung_names: list[str] = []

    def sling_one(item: tuple[str, str]) -> None:
        capability, task = item
        for attempt in range(3):
            try:
                slung = _sling(ctx, root, capability, task, "--scenario", str(scenarios[capability]), env=env)
                break
            except Exception as exc:  # a failed sling is undone by ov, so the same command may be retried
                message = f"{capability}-{task}: {exc}"[:600]
                if attempt == 2:
                    sling_errors.append(message)
                    return
                sling_retries.append(message)
        slung_names.append(slung["name"])
        if slung.get("loop_pid"):
            sampler.loops.append((slung["loop_pid"], start_ticks(slung["loop_pid"])))

    def all_terminal() -> bool:
        conn = _ro(project.state_db)
        try:
            marks = ",".join("?" * len(slung_names))
            return conn.execute(f"SELECT count(*) FROM sessions WHERE name IN ({marks}) AND state IN "
                                "('completed', 'zombie')", slung_names).fetchone()[0] == len(slung_names)
        finally:
            conn.close()

    with _LoopSampler() as sampler:
        started = time.perf_counter()
        try:
            with ThreadPoolExecutor(SLINGERS) as pool:
                list(pool.map(sling_one, plan))
            slung_at = time.perf_counter()
            alive_before_release = sum(1 for pid, ticks in sampler.loops if alive(pid, ticks))
            release_ms = time.time() * 1000
            gate.write_text("go\n")
            released_at = time.perf_counter()
            finished = _wait(all_terminal, timeout=timeout, interval=0.1)
            done_at = time.perf_counter()
            # A completed agent's loop notices within a poll interval and exits by itself.
            loops_gone = _wait(lambda: not any(alive(pid, ticks) for pid, ticks in sampler.loops), timeout=15,
                               interval=0.1)
        finally:
            gate.touch()
            leftovers = _stop_agents(ctx, root, names)
    conn = open_state(project.state_db)
    try:
        states = collections.Counter(a.state for a in sessions.list_sessions(conn) if a.name in names)
        done_mail = {r[0]: r[1] for r in conn.execute(
            "SELECT sender, count(*) FROM mail WHERE recipient = 'operator' AND type = 'worker_done' GROUP BY sender")}
        turns = collections.Counter(r[0] for r in conn.execute("SELECT status FROM turns"))
        early = conn.execute("SELECT count(*) FROM transitions WHERE to_state = 'completed' AND at < ?",
                             (release_ms,)).fetchone()[0]
    finally:
        conn.close()
    missing_mail = [n for n in names if done_mail.get(n, 0) == 0]
    duplicate_mail = [n for n in names if done_mail.get(n, 0) > 1]
    no_commit = [n for n in builders
                 if git(root, "rev-list", "--count", f"main..ov/{n}").stdout.strip() != "1"]
    result.update({
        "finished": bool(finished), "total_seconds": done_at - started, "sling_seconds": slung_at - started,
        "run_seconds": done_at - released_at, "loops_alive_at_release": alive_before_release,
        "completed_before_release": early, "states": dict(states), "turns": dict(turns), "sling_errors": sling_errors,
        "sling_retries": sling_retries,
        "missing_worker_done": missing_mail, "duplicate_worker_done": duplicate_mail,
        "builders_without_commit": no_commit, "stopped_by_bench": leftovers, "loops_exited": bool(loops_gone),
        "peak_loops_rss_mib": round(sampler.peak_rss_mib, 1), "peak_loops_alive": sampler.peak_alive,
    })
    result["all_checks_passed"] = (bool(finished) and states.get("completed", 0) == count and not missing_mail
                                   and not duplicate_mail and not no_commit and bool(loops_gone)
                                   and not sling_errors and not leftovers)
    return result


def run_scale(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    count = ctx.p("fig7_agents")
    runs = [_scale_once(ctx, index, count) for index in range(ctx.p("fig7_runs"))]
    rows: list[dict[str, t.Any]] = []
    first = runs[0]
    setting = (f"turns.max_concurrent = {first['max_concurrent_turns']} (default), agents.max_concurrent_agents = "
               f"{first['max_concurrent_agents']} (raised from the default 20); {len(runs)} run(s)")
    rows.append(row(7, f"{count} agents alive at once: release -> all completed", "s",
                    Stats([r["run_seconds"] for r in runs]), digits=1, note=setting))
    rows.append(row(7, f"{count} agents: throughput once released", "agents/s",
                    Stats([count / r["run_seconds"] for r in runs]), digits=2))
    rows.append(row(7, f"{count} agents: slinging them ({SLINGERS} `ov sling` at a time)", "s",
                    Stats([r["sling_seconds"] for r in runs]), digits=1,
                    note=f"loops alive when released: {min(r['loops_alive_at_release'] for r in runs)}"))
    rows.append(row(7, f"{count} agents: total, first sling -> all completed", "s",
                    Stats([r["total_seconds"] for r in runs]), digits=1))
    rows.append(row(7, f"{count} agents: peak memory of all agent loops (sum of Pss)", "MiB",
                    Stats([r["peak_loops_rss_mib"] for r in runs]), digits=0,
                    note=f"peak loops alive at once: {max(r['peak_loops_alive'] for r in runs)}"))
    passed = all(r["all_checks_passed"] for r in runs)
    summary = "; ".join(
        f"run {i + 1}: states {r['states']}, worker_done to operator from {count - len(r['missing_worker_done'])}/{count}"
        f" (duplicates {len(r['duplicate_worker_done'])}), builders without their commit {len(r['builders_without_commit'])},"
        f" turns {r['turns']}, slings failed {len(r['sling_errors'])} (retried ok {len(r['sling_retries'])}),"
        f" completed before the release "
        f"{r['completed_before_release']}, loops exited {r['loops_exited']}" for i, r in enumerate(runs))
    rows.append(row(7, f"{count} agents: all completed, every worker_done arrived once", "runs ok",
                    value=sum(r["all_checks_passed"] for r in runs), digits=0,
                    target="every agent completed, every mail arrived", met=passed, note=summary))
    retried = [message for r in runs for message in r["sling_retries"]]
    if retried:
        add_note(rows, f"{len(retried)} of {count * len(runs)} `ov sling` runs failed when {SLINGERS} ran at once and "
                       f"worked when run again; first: {retried[0]}", 7)
    return rows, {"runs": runs}
