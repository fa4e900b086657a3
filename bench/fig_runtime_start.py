"""Figure 13: what a runtime costs to start: the CPU and wall time of one idle turn, per runtime (issue 33).

An idle turn is the cheapest turn there is: a builder is slung with a one-line prompt, the model
(the repository's mock API for that runtime's protocol, on 127.0.0.1 in the bench's process)
answers with one short text, and the runtime ends its turn. What that costs is the runtime's own
start-up: its interpreter or binary, its config, its tools and instructions, one request.

Each turn runs through the real `ov sling` and agent loop, as the e2e tests drive each CLI
(tests/e2e/test_*_agent.py): ov's sandbox, hooks, provider and state dir are the real ones. The
runtime's binary (``runtime.<name>_bin``) is a small wrapper that starts the real CLI, waits for it
with ``wait4`` and prints its rusage to the turn's stderr log: the CPU (user + system) of the CLI
and of every descendant it waited for, and the wall time from its start to its exit. ov's own
work (the loop, the endpoint, bubblewrap) is not in the figure. The scripted runtime has no
``_bin`` setting (it is ov's own Python module): its turn command, as the adapter builds it, is
run directly under the same wrapper, outside the sandbox.

Each round slings one fresh agent per runtime, in a rotating order (a cold session each time:
the cost of starting, not of resuming); the first round warms the page cache and is dropped.
The results are a median of 3 rounds (1 with --quick). Not in the default run (several minutes
on 2 cores, and it needs every CLI): ``python bench/run.py --only 13 --out bench/results/...``.
The figures go into docs/runtimes.md and ``overstory.runtimes.start_costs`` (``ov doctor``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import typing as t
from pathlib import Path

from context import Context
from harness import Stats, add_note, init_project, make_repo, not_available, row

REPO = Path(__file__).resolve().parent.parent
FIGURE = 13
RUNTIMES = ("claude", "codex", "gemini", "opencode", "kilo", "qwen", "scripted")
PROMPT = "Say hello in one short sentence."
REPLY = "Hello."
MARK = "OV-BENCH-RUSAGE "
TURN_TIMEOUT = 180.0

# Starts the real CLI as its only child, waits for it, and reports its rusage (children included) on stderr.
WRAPPER = """#!{python}
import json, os, sys, time
real = {real!r}
started = time.monotonic()
pid = os.fork()
if pid == 0:
    os.execv(real[0], [*real, *sys.argv[1:]])
_, status, usage = os.wait4(pid, 0)
wall = time.monotonic() - started
sys.stderr.write({mark!r} + json.dumps({{"user": usage.ru_utime, "sys": usage.ru_stime, "wall": wall,
                                        "maxrss_kib": usage.ru_maxrss}}) + "\\n")
sys.stderr.flush()
sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""


def _tests_on_path() -> None:
    folder = str(REPO / "tests")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _binaries() -> dict[str, str | None]:
    _tests_on_path()
    from claude_cli import CLAUDE_BIN
    from codex_cli import CODEX_BIN
    from gemini_cli import GEMINI_BIN
    from kilo_cli import KILO_BIN
    from opencode_cli import OPENCODE_BIN
    from qwen_cli import QWEN_BIN

    return {"claude": CLAUDE_BIN, "codex": CODEX_BIN, "gemini": GEMINI_BIN, "opencode": OPENCODE_BIN,
            "kilo": KILO_BIN, "qwen": QWEN_BIN}


def _wrapper(folder: Path, name: str, real: list[str]) -> Path:
    path = folder / f"{name}-measured"
    path.write_text(WRAPPER.format(python=sys.executable, real=real, mark=MARK))
    path.chmod(0o755)
    return path


def _mock(runtime: str) -> t.Any:
    """The runtime's mock API (not started), answering every fresh session's first request with REPLY."""
    _tests_on_path()
    if runtime == "claude":
        from mockapi import MockMessagesAPI
        from mockapi import text_reply as claude_text

        return MockMessagesAPI([claude_text(REPLY)])
    if runtime == "codex":
        from mock_openai_responses import MockResponsesAPI
        from mock_openai_responses import text_reply as responses_text

        return MockResponsesAPI([responses_text(REPLY)])
    if runtime == "gemini":
        from mock_gemini_api import MockGeminiAPI
        from mock_gemini_api import text_reply as gemini_text

        return MockGeminiAPI([gemini_text(REPLY)])
    from mock_openai_chat import MockChatAPI, text_reply

    return MockChatAPI([text_reply(REPLY)])


def _under_tmp(path: str) -> bool:
    return Path(os.path.realpath(path)).parts[:2] == ("/", "tmp")


def _config(runtime: str, base_url: str, wrapper: Path, real: str) -> tuple[dict[str, t.Any], dict[str, str]]:
    """config.local.yaml and the sling environment, as tests/runtime_agents.py and the e2e tests set them."""
    _tests_on_path()
    from runtime_agents import OFFLINE_ENV

    key_env = "MOCK_BENCH_KEY"
    protocol = {"codex": "openai-responses", "gemini": "gemini"}.get(runtime, "openai-chat")
    model = {"gemini": "gemini-2.5-flash"}.get(runtime, "mock-model")
    document: dict[str, t.Any] = {"runtime": {f"{runtime}_bin": str(wrapper)}, "runtimes": {"builder": runtime},
                                  "turns": {"retry_backoff": 0.2}}
    if _under_tmp(real):
        # The sandbox shows the host's /tmp only where the turn's program lives, which is the wrapper here:
        # the real CLI's folder is shown too (as writable: the only kind of extra bind the config has).
        document["sandbox"] = {"writable": [str(Path(*Path(os.path.realpath(real)).parts[:3]))]}
    if runtime == "claude":
        return document, {}
    document["providers"] = {"mock": {"base_url": base_url, "api_key_env": key_env, "protocol": protocol}}
    document["models"] = {"builder": f"mock/{model}"}
    return document, {**OFFLINE_ENV, key_env: "sk-mock-bench"}


def _turn_row(state_db: Path, agent: str) -> dict[str, t.Any] | None:
    conn = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        found = conn.execute("SELECT status, log_dir, ended_at FROM turns WHERE agent = ? AND ended_at IS NOT NULL "
                             "ORDER BY started_at LIMIT 1", (agent,)).fetchone()
    finally:
        conn.close()
    return dict(found) if found else None


def _read_mark(text: str) -> dict[str, float]:
    lines = [line for line in text.splitlines() if line.startswith(MARK)]
    if not lines:
        raise RuntimeError("the wrapper reported no rusage (the runtime was not started through it)")
    return json.loads(lines[-1][len(MARK):])


class _Project:
    """One project per runtime, kept for the whole figure; one fresh builder per measured turn."""

    def __init__(self, ctx: Context, runtime: str, real: list[str]) -> None:
        import yaml

        self.ctx, self.runtime = ctx, runtime
        self.root = make_repo(ctx.scratch / f"fig13-{runtime}")
        init_project(self.root)
        self.mock = _mock(runtime).start()
        wrapper = _wrapper(ctx.scratch, runtime, real)
        document, extra = _config(runtime, self.mock.base_url, wrapper, real[0])
        (self.root / ".overstory" / "config.local.yaml").write_text(yaml.safe_dump(document))
        self.env = ctx.env(**extra)
        if runtime == "claude":
            from claude_cli import claude_env

            self.env = {**claude_env(self.mock.base_url, ctx.scratch / "fig13-claude-home"),
                        **{k: v for k, v in self.env.items() if k.startswith("GIT_")}}
            self.env = {k: v for k, v in self.env.items() if not k.startswith(("OV_", "OVERSTORY_"))}
        self.count = 0

    def idle_turn(self) -> dict[str, float]:
        self.count += 1
        task = f"idle-{self.count}"
        agent = f"builder-{task}"
        done = self.ctx.ov_run("sling", "builder", task, "--prompt", PROMPT, "--json", cwd=self.root, env=self.env)
        pid = json.loads(done.stdout).get("loop_pid")
        if pid:
            from harness import start_ticks

            self.ctx.registry.adopt(pid, start_ticks(pid))
        deadline = time.monotonic() + TURN_TIMEOUT
        state_db = self.root / ".overstory" / "state.db"
        try:
            while (found := _turn_row(state_db, agent)) is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.runtime}: no turn ended within {TURN_TIMEOUT:g}s")
                time.sleep(0.1)
            stderr = Path(found["log_dir"]) / "stderr.txt"
            if found["status"] != "ok":
                raise RuntimeError(f"{self.runtime}: the idle turn ended {found['status']}: "
                                   f"{stderr.read_text(errors='replace')[-300:]}")
            return _read_mark(stderr.read_text(errors="replace"))
        finally:
            self.ctx.ov_run("stop", agent, "--clean", "--force", cwd=self.root, check=False, env=self.env)

    def close(self) -> None:
        self.mock.close()


class _Scripted:
    """The scripted runtime's turn command, as its adapter builds it, run directly under the wrapper."""

    def __init__(self, ctx: Context) -> None:
        from overstory.config.model import Config
        from overstory.runtimes import get_runtime
        from overstory.runtimes.base import TurnRequest

        self.ctx = ctx
        self.root = make_repo(ctx.scratch / "fig13-scripted")
        self.adapter = get_runtime("scripted")
        scenario = ctx.scratch / "fig13-idle.json"
        scenario.write_text(json.dumps({"turns": [{"actions": [{"text": REPLY}], "result": REPLY}]}))
        self.run_dir = ctx.scratch / "fig13-scripted-run"
        self.run_dir.mkdir(exist_ok=True)
        argv = self.adapter.headless_command(TurnRequest(model=None, resume_session_id=None, run_dir=self.run_dir,
                                                         scenario=scenario), Config())
        self.wrapper = _wrapper(ctx.scratch, "scripted", argv[:3])
        self.argv = [str(self.wrapper), *argv[3:]]

    def idle_turn(self) -> dict[str, float]:
        state = self.adapter.state_dir(self.run_dir)
        if state is not None:
            import shutil

            shutil.rmtree(state, ignore_errors=True)  # a fresh session each time, as a new agent has
            self.adapter.prepare_state(state, os.environ, self.root)
        done = subprocess.run(self.argv, input=self.adapter.stdin_message(PROMPT), capture_output=True, cwd=self.root,
                              env=self.ctx.env(), timeout=TURN_TIMEOUT, check=False)
        if done.returncode != 0 or REPLY.encode() not in done.stdout:
            raise RuntimeError(f"scripted: exit {done.returncode}: {done.stderr.decode(errors='replace')[-300:]}")
        return _read_mark(done.stderr.decode(errors="replace"))

    def close(self) -> None:
        pass


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except (OSError, ValueError):
        return []


def run(ctx: Context) -> tuple[list[dict[str, t.Any]], dict[str, t.Any]]:
    rows: list[dict[str, t.Any]] = []
    wanted = [name for name in os.environ.get("OV_BENCH_RUNTIMES", ",".join(RUNTIMES)).split(",") if name]
    binaries = _binaries()
    subjects: dict[str, t.Any] = {}
    details: dict[str, t.Any] = {"samples": {}, "problems": [], "load": {}, "prompt": PROMPT, "reply": REPLY}
    with contextlib.ExitStack() as stack:
        for name in wanted:
            if name == "scripted":
                subjects[name] = _Scripted(ctx)
            elif binaries.get(name):
                subjects[name] = _Project(ctx, name, [str(binaries[name])])
                stack.callback(subjects[name].close)
            else:
                rows.append(not_available(FIGURE, f"{name}: one idle turn", "its CLI is not installed (.ci/node)"))
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in subjects}
        warmup, rounds = ctx.p("fig13_warmup"), ctx.p("fig13_rounds")
        names = list(subjects)
        for index in range(warmup + rounds):
            shift = index % max(1, len(names))
            load_before = _loadavg()
            for name in names[shift:] + names[:shift]:
                try:
                    measured = subjects[name].idle_turn()
                except Exception as exc:  # one runtime failing must not hide the others
                    details["problems"].append(f"round {index}: {name}: {type(exc).__name__}: {exc}")
                    continue
                if index >= warmup:
                    samples[name].append(measured)
                print(f"  round {index}{' (warm-up)' if index < warmup else ''}: {name}: "
                      f"cpu {measured['user'] + measured['sys']:.2f}s wall {measured['wall']:.2f}s", flush=True)
            details["load"][f"round {index}"] = [load_before, _loadavg()]
    for name in subjects:
        taken = samples[name]
        details["samples"][name] = taken
        if not taken:
            rows.append(not_available(FIGURE, f"{name}: one idle turn", "every turn failed (see the notes)"))
            continue
        cpu = Stats([s["user"] + s["sys"] for s in taken])
        rows.append(row(FIGURE, f"{name}: one idle turn, CPU (user + sys, children included)", "s", cpu))
        rows.append(row(FIGURE, f"{name}: one idle turn, wall", "s", Stats([s["wall"] for s in taken])))
    for problem in details["problems"][:5]:
        add_note(rows, problem, FIGURE)
    return rows, details
