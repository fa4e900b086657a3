"""The seeded chaos run: a realistic team on one project, `kill -9` at random points, then invariants.

    python bench/chaos.py --seeds 20           # the bench: seeds 1..20, figures to bench/results/
    python bench/chaos.py --seed 7             # one seed (its kill schedule comes from the seed)
    python bench/chaos.py --schedule FILE      # replay a written schedule (a failure prints where it is)
    python bench/chaos.py --seed 7 --keep      # keep the scratch project to look at

A team works on one real git project: a scripted coordinator with two leads and their builders, an
operator's builders (a real Claude Code CLI against a mock Messages API among them), an `ov loop` with a
check, gated calls the operator approves and rejects, agent and run budgets that are crossed, merges, a
schedule firing, and `ov serve` with two SSE clients. A kill schedule derived from the seed
(``chaos_plan.derive``) SIGKILLs agent loops, turns, the watchdog, `ov merge`, `ov sling`, `ov serve` and
schedule runners; the harness restarts what a person would. Then it checks the invariants
(``chaos_checks``) and prints every violation with the seed and the exact schedule.
Exit code: 0 when no seed found a violation, 1 otherwise. See bench/RESULTS.md ("Chaos").
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import typing as t
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos_plan  # noqa: E402
from chaos_run import run_seed  # noqa: E402
from chaos_team import TESTS  # noqa: E402, F401 - puts tests/ on sys.path (mockapi, claude_cli)

RESULTS = Path(__file__).resolve().parent / "results"
# The run's log kept in a results file (the rest, every command and marker, is in the seed's own result.json
# with --keep): what was killed and restarted, and the operator's milestones.
KEPT_EVENTS = {"start", "kill", "kill_missed", "restart", "rerun", "rerun_not_needed", "finding", "outlived",
               "resling_stopped", "team_started", "schedule_paused", "settled", "burner_slung", "stopped"}


def violations(result: dict[str, t.Any]) -> list[tuple[str, str]]:
    found = [(v["invariant"], detail) for v in result.get("verdicts", []) for detail in v["violations"]]
    if "harness_error" in result:
        found.append(("harness", result["harness_error"].strip().splitlines()[-1]))
    return found


def report_seed(result: dict[str, t.Any], results_file: Path | None = None) -> None:
    """Print one seed's line; on a violation, every violation, the kill schedule, what it hit, how to replay it."""
    kills = result.get("kills", [])
    hit = sum(1 for k in kills if k.get("hit"))
    unreached = sum(1 for k in kills if k.get("not_reached"))
    checked = sum(v["checked"] for v in result.get("verdicts", []))
    found = violations(result)
    print(f"seed {result['seed']}: {hit} kills hit ({len(kills) - hit - unreached} missed, {unreached} not reached), "
          f"{len(result.get('verdicts', []))} invariants over {checked} items, {len(found)} violations "
          f"({result['seconds']} s)", flush=True)
    if not found:
        return
    for invariant, detail in found:
        print(f"  VIOLATION [{invariant}] {detail}")
    if "harness_error" in result:
        print(result["harness_error"])
    print(f"  seed {result['seed']} kill schedule (restart after {result['schedule']['restart']} s):")
    print(chaos_plan.describe(result["schedule"]))
    print("  what the kills hit: " + json.dumps([{k: v for k, v in kill.items() if k in ("kind", "t", "hit", "victim",
                                                                                       "marker", "nth")}
                                                 for kill in kills]))
    print(f"  replay: python bench/chaos.py --seed {result['seed']}{' --quick' if result.get('quick') else ''}")
    if results_file is not None:
        print(f"      or: python bench/chaos.py --schedule {results_file} --seed {result['seed']}")
    print(f"  the schedule (for --schedule FILE): {json.dumps(result['schedule'])}", flush=True)


def summarize(results: list[dict[str, t.Any]]) -> dict[str, t.Any]:
    kills_hit: Counter[str] = Counter()
    kills_missed: Counter[str] = Counter()
    not_reached: Counter[str] = Counter()
    for result in results:
        for kill in result.get("kills", []):
            if kill.get("not_reached"):
                not_reached[kill["kind"]] += 1
            else:
                (kills_hit if kill.get("hit") else kills_missed)[kill["kind"]] += 1
    by_invariant: dict[str, dict[str, t.Any]] = {}
    for result in results:
        for verdict in result.get("verdicts", []):
            entry = by_invariant.setdefault(verdict["invariant"], {"what": verdict["what"], "checked": 0, "items": 0,
                                                                   "violations": 0, "seeds": []})
            entry["checked"] += 1
            entry["items"] += verdict["checked"]
            if verdict["violations"]:
                entry["violations"] += len(verdict["violations"])
                entry["seeds"].append(result["seed"])
    seconds = [r["seconds"] for r in results]
    return {
        "seeds": [r["seed"] for r in results],
        "seconds": {"median": statistics.median(seconds), "min": min(seconds), "max": max(seconds)} if seconds else {},
        "kills_hit": dict(sorted(kills_hit.items())), "kills_missed": dict(sorted(kills_missed.items())),
        "kills_not_reached": dict(sorted(not_reached.items())),
        "invariants": by_invariant,
        "violations": sum(len(violations(r)) for r in results),
        "seeds_with_violations": [r["seed"] for r in results if violations(r)],
        "harness_errors": [r["seed"] for r in results if "harness_error" in r],
    }


def print_table(summary: dict[str, t.Any]) -> None:
    print()
    print(f"seeds: {len(summary['seeds'])}; seconds per seed: {summary['seconds']}")
    print("kills that hit, by kind: " + ", ".join(f"{k} {v}" for k, v in summary["kills_hit"].items()))
    print("kills that found no target: " + (", ".join(f"{k} {v}" for k, v in summary["kills_missed"].items())
                                              or "none"))
    print("kills not reached (the team had settled): " + (", ".join(
        f"{k} {v}" for k, v in summary["kills_not_reached"].items()) or "none"))
    print(f"{'invariant':<20} {'runs':>5} {'items':>7} {'violations':>10}  seeds")
    for name, entry in summary["invariants"].items():
        print(f"{name:<20} {entry['checked']:>5} {entry['items']:>7} {entry['violations']:>10}  "
              f"{' '.join(map(str, entry['seeds']))}")
    print(f"violations: {summary['violations']} (seeds {summary['seeds_with_violations'] or 'none'})")


def _stop_on_interrupt() -> t.Any:
    """Ctrl-C (or SIGTERM): the seed that runs is cut short (its processes are cleaned up) and no other starts."""
    import signal
    import threading

    stop = threading.Event()

    def interrupted(signum: int, frame: t.Any) -> None:
        stop.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    return stop


def write_results(path: Path, head: dict[str, t.Any], seeds: list[dict[str, t.Any]]) -> None:
    """The results file: the summary readable, then one line per seed (a seed's details are long)."""
    text = json.dumps(head, indent=2, default=str)[:-2]
    lines = ",\n  ".join(json.dumps(seed, default=str) for seed in seeds)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text},\n \"seeds\": [\n  {lines}\n ]\n}}\n", encoding="utf-8")


def markdown(document: dict[str, t.Any]) -> str:
    """The tables of bench/RESULTS.md ("Chaos") from a results file."""
    summary = document["summary"]
    seconds = summary["seconds"]
    lines = [f"{len(summary['seeds'])} seeds ({summary['seeds'][0]}-{summary['seeds'][-1]}), commit "
             f"`{document['commit']['commit']}`, real claude: {'yes' if document.get('claude') else 'no'}; "
             f"{seconds['median']:.0f} s per seed (min {seconds['min']:.0f}, max {seconds['max']:.0f}).", "",
             "| kills | " + " | ".join(sorted(set(summary["kills_hit"]) | set(summary["kills_missed"]))) + " | all |",
             "| --- |" + " --- |" * (len(set(summary["kills_hit"]) | set(summary["kills_missed"])) + 1)]
    kinds = sorted(set(summary["kills_hit"]) | set(summary["kills_missed"]))
    for label, counts in (("hit", summary["kills_hit"]), ("found no target", summary["kills_missed"]),
                          ("not reached", summary.get("kills_not_reached", {}))):
        lines.append(f"| {label} | " + " | ".join(str(counts.get(k, 0)) for k in kinds)
                     + f" | {sum(counts.values())} |")
    lines += ["", "| invariant | seeds checked | items | violations | seeds with violations |",
              "| --- | --- | --- | --- | --- |"]
    for name, entry in summary["invariants"].items():
        lines.append(f"| `{name}` | {entry['checked']} | {entry['items']:,} | {entry['violations']} | "
                     f"{len(entry['seeds'])} |")
    lines.append(f"| **all** | | | **{summary['violations']}** | {len(summary['seeds_with_violations'])} of "
                 f"{len(summary['seeds'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, help="run seeds FIRST..FIRST+N-1 and write the figures")
    which.add_argument("--report", type=Path, help="print the Markdown tables of a results file and exit")
    parser.add_argument("--seed", type=int, help="run one seed (with --schedule: that seed of a results file)")
    parser.add_argument("--schedule", type=Path, help="replay a kill schedule: a schedule's JSON or a results file")
    parser.add_argument("--first", type=int, default=1, help="first seed of --seeds (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep each scratch project (printed)")
    parser.add_argument("--settle", type=float, default=150, help="seconds the team gets to settle (default 150)")
    parser.add_argument("--no-claude", action="store_true", help="leave out the real-claude agent")
    parser.add_argument("--quick", action="store_true", help="the CI team: one lead instead of two, no builder-spend")
    parser.add_argument("--out", type=Path, help="results file (default with --seeds: bench/results/chaos-...json)")
    args = parser.parse_args(argv)
    if args.report is not None:
        print(markdown(json.loads(args.report.read_text(encoding="utf-8"))))
        return 0

    from claude_cli import CLAUDE_BIN

    claude_bin = None if args.no_claude else CLAUDE_BIN
    if claude_bin is None and not args.no_claude:
        print("chaos: the real claude CLI was not found (.ci/node or OV_CLAUDE_BIN): running without it", file=sys.stderr)
    if args.seeds is not None and (args.seed is not None or args.schedule is not None):
        parser.error("--seeds runs seeds from the start; --seed and --schedule replay one")
    if args.schedule is not None:
        plans = [chaos_plan.load(args.schedule, args.seed)]
    elif args.seed is not None:
        plans = [chaos_plan.derive(args.seed)]
    else:
        plans = [chaos_plan.derive(seed) for seed in range(args.first, args.first + (args.seeds or 1))]
    out = args.out
    if out is None and args.seeds:
        from harness import commit_info

        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
        out = RESULTS / f"chaos-{stamp}-{commit_info()['commit']}.json"
    results = []
    stop = _stop_on_interrupt()
    for plan in plans:
        if stop.is_set():
            print(f"chaos: interrupted; {len(results)} seed(s) done", file=sys.stderr)
            break
        result = run_seed(plan, claude_bin=claude_bin, settle_timeout=args.settle, keep=args.keep, quick=args.quick)
        if args.keep:
            print(f"  scratch: {result['scratch']} (this seed's results: result.json there)")
            from harness import write_json

            write_json(Path(result["scratch"]) / "result.json", result)
        report_seed(result, out)
        results.append(result)
    summary = summarize(results)
    print_table(summary)
    if out is not None:
        from harness import commit_info, machine_info

        seeds = [{k: v for k, v in r.items() if k != "events"}
                 | {"events": [e for e in r.get("events", []) if e["what"] in KEPT_EVENTS]} for r in results]
        write_results(out, {"summary": summary, "commit": commit_info(), "machine": machine_info(),
                            "claude": claude_bin is not None, "settle_seconds": args.settle, "quick": args.quick},
                      seeds)
        print(f"wrote {out}")
    return 1 if summary["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
