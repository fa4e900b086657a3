"""ov benchmarks: speed, scale and memory. Reports only; nothing here passes or fails a build.

    python bench/run.py            # full run (under 10 minutes on 2 cores)
    python bench/run.py --quick    # fewer repetitions (under 2 minutes)
    python bench/run.py --only 1,4 # some figures (for working on them; not written to results/)
    python bench/run.py --only 13 --out bench/results/<date>-<commit>-fig13.json
                                   # runtime start-up costs: only on request (minutes; every agent CLI)

Prints a table and writes bench/results/<date>-<commit>.json. Every timing is a
median of repeated runs after warm-up, with min and max; ratios compare against a
baseline measured in the same run. See bench/RESULTS.md for what each figure means.
A figure that crashes is reported (its traceback, "not available: crashed") and the
run goes on with the others, then exits 1. A figure that cannot be measured on this
machine (no bubblewrap, no claude CLI) is not a crash.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import shutil
import sys
import tempfile
import time
import traceback
import typing as t
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from context import PARAMETERS, Context  # noqa: E402
from harness import (  # noqa: E402
    bytecode_state,
    commit_info,
    find_ov,
    machine_info,
    not_available,
    script_interpreter,
    write_json,
)

FIGURES: dict[int, tuple[str, str]] = {
    1: ("fig_commands", "hot commands vs Python floors"),
    2: ("fig_mail", "mail store in-process"),
    3: ("fig_mail", "16 concurrent senders"),
    4: ("fig_agents", "watchdog tick"),
    5: ("fig_agents", "spawn in a 5,000-file repository"),
    6: ("fig_agents", "memory: idle loop, ov watch --once"),
    7: ("fig_agents", "scale: many scripted agents at once (50; 25 with --quick)"),
    8: ("fig_serve", "ov serve: 20 SSE clients while 10 agents run"),
    9: ("fig_guard", "guard: checking time by command length"),
    10: ("fig_hooks", "tool-call hooks with the real claude CLI: added time per call"),
    11: ("fig_sandbox", "sandbox start-up per turn, the endpoint's round trip"),
    12: ("fig_sling", "ov sling with an instant fake claude: to the first turn_end (200 and 5,000 files)"),
    13: ("fig_runtime_start", "what each runtime costs to start: one idle turn's CPU and wall time"),
}
# Figures left out of a run without --only: minutes long, and they need every agent CLI installed.
ON_REQUEST = frozenset({13})
RUNNERS = {1: "run", 2: "run_store", 3: "run_concurrency", 4: "run_watchdog", 5: "run_spawn", 6: "run_memory",
           7: "run_scale", 8: "run_serve", 9: "run", 10: "run", 11: "run", 12: "run", 13: "run"}
BUDGET_SECONDS = {"full": 600, "quick": 120}


def _loadavg() -> float | None:
    """The 1-minute load average: other work on the machine shows up as noise in every figure."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _format_number(value: t.Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def print_table(rows: list[dict[str, t.Any]]) -> None:
    header = ("fig", "measure", "median", "min", "max", "unit", "ratio", "target", "met")
    lines = [header]
    notes = []
    for entry in rows:
        if entry.get("name") == "note":
            notes.append(f"  [{entry['figure']}] {entry['note']}")
            continue
        if "not_available" in entry:
            lines.append((str(entry["figure"]), entry["name"], "not available: " + entry["not_available"], "", "", "",
                          "", "", ""))
            continue
        median = entry.get("median", entry.get("value"))
        ratio = f"{entry['ratio']:.2f}x" if "ratio" in entry else ""
        met = "" if "met" not in entry else ("met" if entry["met"] else "MISSED")
        lines.append((str(entry["figure"]), entry["name"], _format_number(median), _format_number(entry.get("min")),
                      _format_number(entry.get("max")), entry.get("unit", ""), ratio, entry.get("target", ""), met))
        if entry.get("note"):
            notes.append(f"  [{entry['figure']}] {entry['name']}: {entry['note']}")
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    widths[1] = min(widths[1], 60)
    for line in lines:
        cells = [line[i].ljust(widths[i]) if i in (1, 5, 7) else line[i].rjust(widths[i]) for i in range(len(header))]
        print("  ".join(cells).rstrip())
    if notes:
        print("\nnotes:")
        print("\n".join(notes))


def main(argv: t.Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions; under 2 minutes")
    parser.add_argument("--only", help="comma-separated figure numbers (the results file is then not written)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (for debugging)")
    parser.add_argument("--out", type=Path, help="write the JSON here instead of bench/results/<date>-<commit>.json")
    args = parser.parse_args(argv)
    selected = sorted({int(x) for x in args.only.split(",")}) if args.only else sorted(set(FIGURES) - ON_REQUEST)
    mode = "quick" if args.quick else "full"

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="ov-bench-"))
    ctx = Context(quick=args.quick, scratch=scratch, ov=find_ov())
    commit = commit_info()
    document: dict[str, t.Any] = {
        "taken_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": mode, "command": "python bench/run.py" + (" --quick" if args.quick else ""),
        **commit, "machine": machine_info(), "ov": ctx.ov, "ov_interpreter": script_interpreter(ctx.ov),
        "bytecode": bytecode_state(),
        "parameters": {name: ctx.p(name) for name in PARAMETERS}, "figures": {}, "rows": [],
    }
    crashed: list[int] = []
    print(f"ov bench ({mode}) at {commit['commit']}; scratch {scratch}", flush=True)
    print(f"python {sys.executable} ({document['machine']['python']}), ov {ctx.ov}, "
          f"{document['machine']['nproc']} cores, {document['machine']['memory_gib']} GiB", flush=True)
    try:
        for number in selected:
            module_name, title = FIGURES[number]
            figure_started = time.monotonic()
            load_before = _loadavg()
            print(f"figure {number}: {title} ...", flush=True)
            try:
                module = importlib.import_module(module_name)
                rows, details = getattr(module, RUNNERS[number])(ctx)
            except Exception as exc:  # one broken figure must not hide the others, nor pass for a result
                traceback.print_exc()
                crashed.append(number)
                rows, details = [not_available(number, title, f"crashed: {type(exc).__name__}: {exc}")], {}
            finally:
                ctx.registry.stop_all()
            seconds = time.monotonic() - figure_started
            document["figures"][str(number)] = {"title": title, "seconds": round(seconds, 1),
                                                 "loadavg_before_after": [load_before, _loadavg()], "details": details}
            document["rows"].extend(rows)
            print(f"figure {number}: done in {seconds:.1f}s (load average {load_before} -> {_loadavg()})", flush=True)
    finally:
        ctx.registry.stop_all()
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    total = time.monotonic() - started
    budget = BUDGET_SECONDS[mode]
    document["total_seconds"] = round(total, 1)
    document["budget"] = {"seconds": budget, "met": total < budget} if not args.only else None
    document["crashed"] = crashed
    print()
    print_table(document["rows"])
    print(f"\ntotal: {total:.0f}s ({mode} budget {budget}s: {'met' if total < budget else 'MISSED'})"
          if not args.only else f"\ntotal: {total:.0f}s (partial run)")
    if crashed:
        print(f"figure(s) {', '.join(map(str, crashed))} CRASHED (see the tracebacks above): the run fails")
    if args.only and args.out is None:
        return 1 if crashed else 0
    out = args.out or (Path(__file__).resolve().parent / "results" /
                       f"{datetime.date.today().isoformat()}-{commit['commit']}{'-quick' if args.quick else ''}.json")
    write_json(out, document)
    print(f"wrote {out}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
