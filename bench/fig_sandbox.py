"""Figure 11: what the sandbox and the endpoint cost (issue 12).

- Sandbox start-up per turn: ov's housekeeping before a turn (``sandbox.prepare_turn``: the
  runtime's state dir, a writer's private refs, stale locks, the bwrap command line), and
  ``bwrap <a builder's full command line> /bin/true`` against ``/bin/true`` alone. Their
  sum is what a turn pays before its runtime starts. Target: under 20 ms.
- Taking a writer's branch back after a turn that committed.
- The endpoint: one ``mail.send`` request through the client in-process, and the whole
  ``ov mail send`` process an agent runs, inside its sandbox, through the endpoint, against
  the operator's ``ov mail send`` on the database.
"""

from __future__ import annotations

import json
import os
import subprocess
import typing as t
from pathlib import Path

from context import Context
from harness import Command, Stats, add_note, init_project, make_repo, not_available, row, time_calls, time_interleaved

START_TARGET_MS = 20.0


def _agent(root: Path, name: str) -> t.Any:
    from overstory.paths import ProjectPaths
    from overstory.store import sessions
    from overstory.store.db import open_state

    conn = open_state(ProjectPaths(root).state_db)
    try:
        return sessions.get(conn, name)
    finally:
        conn.close()


def run(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    from overstory.config.model import load_config
    from overstory.endpoint.client import Channel
    from overstory.endpoint.routes import ROUTES
    from overstory.endpoint.server import AgentEndpoint
    from overstory.paths import ProjectPaths
    from overstory.sandbox import gitrefs, prepare_turn
    from overstory.sandbox.probe import probe

    found = probe()
    if not found.ok:
        return [not_available(11, "sandbox start-up per turn", found.detail)], {}
    rounds, warmup = ctx.p("fig11_rounds"), 3
    root = make_repo(ctx.scratch / "fig11", files=50)
    init_project(root)
    project = ProjectPaths(root)
    env = ctx.env()
    from overstory.agents.spawn import SlingRequest, sling
    from overstory.store.db import open_state

    config = load_config(project.config_file, project.local_config_file, environ=env)
    conn = open_state(project.state_db)
    try:  # two builders without loops: the bench plays the loop's part
        sling(project, config, conn, SlingRequest(capability="builder", task_id="b1", runtime="scripted"),
              env, start=False)
        sling(project, config, conn, SlingRequest(capability="builder", task_id="b2", runtime="scripted"),
              env, start=False)
    finally:
        conn.close()
    agent = _agent(root, "builder-b1")
    rows: list[dict[str, t.Any]] = []

    argv_holder: dict[str, list[str]] = {}

    def prepare() -> None:
        argv_holder["argv"] = prepare_turn(project, config, agent, ["/bin/true"], env, launch_env=env).argv

    prep = time_calls(prepare, repeat=rounds, warmup=warmup)
    argv = argv_holder["argv"]
    timed, errors = time_interleaved({
        "true": Command(["/bin/true"], env=env),
        "bwrap": Command(argv, env=env),
    }, rounds=rounds, warmup=warmup)
    overhead = Stats([b - a for a, b in zip(timed["true"].samples, timed["bwrap"].samples)])
    total = prep.median + overhead.median
    rows.append(row(11, "housekeeping before a turn (sandbox.prepare_turn, a builder)", "ms", prep,
                    note="state dir, private refs/heads/ov copy, stale locks, the bwrap command line"))
    rows.append(row(11, "/bin/true", "ms", timed["true"]))
    rows.append(row(11, f"bwrap (a builder's full command line, {len(argv) - 2} words) /bin/true", "ms", timed["bwrap"]))
    rows.append(row(11, "bwrap's own cost (paired difference)", "ms", overhead))
    rows.append(row(11, "sandbox start-up per turn (housekeeping + bwrap)", "ms", value=total,
                    target=f"< {START_TARGET_MS:g} ms", met=total < START_TARGET_MS))
    for problem in errors[:3]:
        add_note(rows, problem, 11)

    # Taking the branch back after a turn that committed (git cat-file + update-ref).
    layout = prepare_turn(project, config, agent, ["/bin/true"], env, launch_env=env).layout
    base = layout.base_file.read_text().strip()
    commits = [subprocess.run(["git", "commit-tree", "-p", base, "-m", f"c{i}", "HEAD^{tree}"], cwd=root,
                              capture_output=True, text=True, env=env).stdout.strip() for i in range(rounds + warmup)]
    commit_iter = iter(commits)

    def set_tip() -> None:
        subprocess.run(["git", "update-ref", "refs/heads/ov/builder-b1", base], cwd=root, check=True)
        layout.base_file.write_text(base + "\n")
        (layout.private_refs / "builder-b1").write_text(next(commit_iter) + "\n")

    take = time_calls(lambda: gitrefs.take_back(layout), repeat=rounds, warmup=warmup, before=set_tip)
    rows.append(row(11, "take a builder's branch back after a turn that committed", "ms", take))

    # The endpoint: in-process round trip, then `ov mail send` from inside a sandbox.
    sender = _agent(root, "builder-b2")
    endpoint = AgentEndpoint(project, sender.name, sender.generation, ROUTES, env).start()
    try:
        secret = endpoint.open_turn()
        channel = Channel(secret["OVERSTORY_ENDPOINT"], secret["OVERSTORY_ENDPOINT_TOKEN"])
        rtt = time_calls(lambda: channel.call("mail.send", {"to": "operator", "subject": "bench"}),
                         repeat=rounds * 3, warmup=warmup)
        rows.append(row(11, "endpoint round trip: one mail.send request (client in-process)", "ms", rtt))
        inside_env = {**env, **secret, "OVERSTORY_AGENT_NAME": sender.name,
                      "OVERSTORY_PROJECT_ROOT": str(root)}
        boxed = prepare_turn(project, config, sender, [ctx.ov, "mail", "send", "--to", "operator", "--subject", "s"],
                             inside_env, launch_env=env)
        processes, errors = time_interleaved({
            "operator: ov mail send (database)": Command([ctx.ov, "mail", "send", "--to", "builder-b2", "--subject",
                                                          "s"], env=env, cwd=root),
            "agent: ov mail send (endpoint, unsandboxed)": Command([ctx.ov, "mail", "send", "--to", "operator",
                                                                    "--subject", "s"], env=inside_env, cwd=root),
            "agent: ov mail send (endpoint, inside its sandbox)": Command(boxed.argv, env=boxed.env, cwd=root),
        }, rounds=rounds, warmup=warmup)
        base_stats = processes["operator: ov mail send (database)"]
        for name, stats in processes.items():
            rows.append(row(11, name, "ms", stats, ratio=stats.median / base_stats.median,
                            baseline="operator: ov mail send (database)"))
        for problem in errors[:3]:
            add_note(rows, problem, 11)
    finally:
        endpoint.close()
    sent = json.loads(ctx.ov_run("mail", "list", "--from", "builder-b2", "--limit", "100000", "--json", cwd=root,
                                 env=env).stdout)
    add_note(rows, f"mail from builder-b2 through its endpoint: {len(sent)} message(s), every one signed by it: "
                   f"{all(m['from'] == 'builder-b2' for m in sent)}", 11)
    return rows, {"bwrap": found.detail, "argv_words": len(argv), "loadavg": os.getloadavg()[0]}
