"""Render a results file as the Markdown tables used in bench/RESULTS.md.

    python bench/report.py bench/results/2026-05-09-abc1234.json > /tmp/tables.md
"""

from __future__ import annotations

import json
import sys
import typing as t
from pathlib import Path


def _number(value: t.Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render(document: dict[str, t.Any]) -> str:
    machine = document["machine"]
    lines = [
        f"Taken {document['taken_at']} at commit `{document['commit']}`"
        + (" (with uncommitted changes under src/)" if document.get("src_modified_since_commit") else "")
        + f" by `{document['command']}` in {document['total_seconds']:.0f} s.",
        "",
        f"Machine: {machine['nproc']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, Linux {machine['kernel']}, "
        f"Python {machine['python']}, SQLite {machine['sqlite']}, {machine['git']}.",
        "",
    ]
    by_figure: dict[int, list[dict[str, t.Any]]] = {}
    for entry in document["rows"]:
        by_figure.setdefault(entry["figure"], []).append(entry)
    for number, rows in sorted(by_figure.items()):
        figure = document["figures"].get(str(number), {})
        load = figure.get("loadavg_before_after")
        lines.append(f"**Figure {number}: {figure.get('title', '')}** ({figure.get('seconds', '?')} s"
                     + (f", load average {load[0]} -> {load[1]}" if load else "") + ")")
        lines.append("")
        lines.append("| measure | median | min | max | unit | ratio (baseline) | target |")
        lines.append("| --- | ---: | ---: | ---: | --- | --- | --- |")
        notes = []
        for entry in rows:
            if entry["name"] == "note":
                notes.append(entry["note"])
                continue
            if "not_available" in entry:
                lines.append(f"| {entry['name']} | not available: {entry['not_available']} | | | | | |")
                continue
            median = entry.get("median", entry.get("value"))
            ratio = f"{entry['ratio']:.2f}x ({entry['baseline']})" if "ratio" in entry else ""
            if "ratio_click" in entry:
                ratio += f"; {entry['ratio_click']:.2f}x ({entry['baseline_click']})"
            target = ""
            if "target" in entry:
                target = f"{entry['target']}: **{'met' if entry['met'] else 'MISSED'}**"
            lines.append(f"| {entry['name']} | {_number(median)} | {_number(entry.get('min'))} | "
                         f"{_number(entry.get('max'))} | {entry['unit']} | {ratio} | {target} |")
            if entry.get("note"):
                notes.append(f"{entry['name']}: {entry['note']}")
        if notes:
            lines.append("")
            lines.extend(f"- {note}" for note in notes)
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(render(json.loads(Path(sys.argv[1]).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
