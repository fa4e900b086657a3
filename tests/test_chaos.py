"""One seed of the chaos run (bench/chaos.py) in CI; the bench runs at least 20 (bench/RESULTS.md, "Chaos").

A whole team works on one real git project: a scripted coordinator, a lead and its builders, the
operator's builders (one of them the REAL Claude Code CLI against a mock Messages API), an `ov loop`
with a check, gated calls the operator approves and rejects, budgets that are crossed, merges, a
schedule, and `ov serve` with two SSE clients. The seed's kill schedule SIGKILLs agent loops, turns,
the watchdog, `ov merge`, `ov sling`, `ov serve` and schedule runners; the harness restarts what a
person would, and then checks every invariant in code. A failure prints the seed, the kill schedule
and the line that replays it (`python bench/chaos.py --seed N`).

OV_TEST_CHAOS_SEED picks another seed (read at import: tests/conftest.py clears OV_* for each test).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from claude_cli import CLAUDE_BIN, requires_claude

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

SEED = int(os.environ.get("OV_TEST_CHAOS_SEED", "4"))
# Checked on every seed, each over at least one item (the others, such as `rerun`, may have nothing to look at).
ALWAYS_CHECKED = ("sse", "status", "end_states", "mail_once", "side_effects_once", "approvals", "agent_budget",
                  "run_budget", "operator_git", "processes", "orphans")


@requires_claude
def test_one_seed_of_the_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    import chaos
    import chaos_plan
    from chaos_run import run_seed

    result = run_seed(chaos_plan.derive(SEED), claude_bin=CLAUDE_BIN, settle_timeout=240, parent=tmp_path,
                      quick=True)
    assert "harness_error" not in result, result["harness_error"]
    found = chaos.violations(result)
    if found:
        chaos.report_seed(result)  # the seed, its schedule and how to replay it, on stdout
    assert found == [], f"seed {SEED}: {len(found)} violations, e.g. {found[:8]}"
    verdicts = {v["invariant"]: v for v in result["verdicts"]}
    assert [name for name in ALWAYS_CHECKED if verdicts[name]["checked"] == 0] == []
    hit = [k for k in result["kills"] if k.get("hit")]
    assert len({k["kind"] for k in hit}) >= 4, f"the chaos hardly happened: {result['kills']}"
