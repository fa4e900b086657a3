"""What one idle turn of each runtime cost when it was measured: CPU and wall time, for `ov doctor`.

Measured, not live: bench figure 13 (``python bench/run.py --only 13``, bench/fig_runtime_start.py)
slings a builder per runtime through the real `ov sling`, the repository's mock API answers its first
request with one short text, and the turn ends; the CLI runs under a wrapper that reads its rusage
(``wait4``: user + system CPU of the CLI and every descendant it waited for) and its wall time. The
median of 3 rounds, each a cold session. ov's own work (the loop, the sandbox) is not included. The
figures say what a team of N agents on that runtime costs per turn before any real work, so a user
can choose a runtime for a large team; they are not this machine's, and docs/runtimes.md has the
table with the load it was measured under.
"""

from __future__ import annotations

import typing as t

MEASURED_ON = "2026-12-07"
MACHINE = ("2 cores (Intel Xeon), 23.5 GiB, Linux 6.18, Python 3.11.7; shared with other work "
           "(1-minute load average 6.8 to 11 during the run)")
MACHINE_BRIEF = "2 shared cores"
SOURCE = "bench/results/2026-12-07-284212f-fig13.json"

# runtime -> (CPU seconds, wall seconds) of one idle turn: medians of 3.
# claude 2.1.330, codex 0.169.0, gemini 0.61.0, opencode 1.18.33, kilo 7.7.7, qwen 0.24.4 (.ci/versions).
START_COSTS: dict[str, tuple[float, float]] = {
    "claude": (0.89, 1.98),
    "codex": (0.34, 0.88),
    "gemini": (1.60, 3.65),
    "opencode": (5.65, 12.59),
    "kilo": (12.54, 28.01),
    "qwen": (2.83, 7.07),
    "scripted": (0.06, 0.26),
}


def start_cost(runtime: str) -> dict[str, t.Any] | None:
    """The measured figures of ``runtime`` (None when it was not measured), labelled as measured."""
    found = START_COSTS.get(runtime)
    if found is None:
        return None
    cpu, wall = found
    return {"idle_turn_cpu_s": cpu, "idle_turn_wall_s": wall, "measured": True, "live": False,
            "measured_on": MEASURED_ON, "machine": MACHINE, "source": SOURCE}


def describe(cost: t.Mapping[str, t.Any]) -> str:
    """One line for `ov doctor`."""
    return (f"start-up: {cost['idle_turn_cpu_s']:g} s CPU, {cost['idle_turn_wall_s']:g} s wall per idle turn "
            f"(measured {cost['measured_on']} on {MACHINE_BRIEF}, not live)")
