"""Per-file test time from a pytest ``--durations=0`` report, for ``tests/file_durations.json``.

    bash .ci/test --durations=0 > run.log; python .ci/file_durations.py run.log > tests/file_durations.json
    python .ci/file_durations.py --cpu FOLDER   # CPU seconds per file (tests/cpu_report.py), longest first

tests/conftest.py hands the longest files to the pytest-xdist workers first, so the short ones
fill in at the end instead of a long one starting last. Stale numbers only change that order.
"""

from __future__ import annotations

import collections
import json
import re
import sys

LINE = re.compile(r"([\d.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def main(path: str) -> int:
    seconds: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8", errors="replace") as report:
        for line in report:
            found = LINE.search(line)
            if found:
                seconds[found.group(2)] += float(found.group(1))
    if not seconds:
        print(f"no --durations lines in {path}", file=sys.stderr)
        return 1
    print(json.dumps({name: round(total) for name, total in sorted(seconds.items()) if round(total)}, indent=1))
    return 0


def cpu_table(folder: str) -> int:
    import pathlib

    seconds: collections.Counter[str] = collections.Counter()
    for report in sorted(pathlib.Path(folder).glob("*.json")):
        seconds.update(json.loads(report.read_text(encoding="utf-8")))
    if not seconds:
        print(f"no CPU reports in {folder}", file=sys.stderr)
        return 1
    total = sum(seconds.values())
    print(f"{total:8.0f} s CPU in all, {len(seconds)} files")
    for name, used in seconds.most_common():
        print(f"{used:8.1f}  {100 * used / total:5.1f}%  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(cpu_table(sys.argv[2]) if sys.argv[1] == "--cpu" else main(sys.argv[1]))
