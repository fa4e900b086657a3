"""Where the suite's CPU goes, per test file: an opt-in pytest plugin for measuring, not a test.

    OV_TEST_CPU_REPORT=/tmp/cpu bash .ci/test --durations=0
    python .ci/file_durations.py --cpu /tmp/cpu

Wall time per file says little on a loaded 2-core machine: a file that waits on a mock server
and one that keeps two agent CLIs busy can take the same time. CPU time says what a file costs
the others. Each pytest worker moves itself into a cgroup (v1 ``cpuacct``) of its own, so every
process a test starts is counted, daemonized agent loops and the CLIs they run included, and
reads the group's counter around each test. A process that outlives its test is billed to the
worker's next test, which is rare and small. Each worker writes ``<worker>.json`` (seconds per
file) into the folder at the end. Without cgroup v1 ``cpuacct`` (or without root) nothing is
measured and the folder says so.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuReport:
    def __init__(self, folder: Path, worker: str) -> None:
        self.folder = folder
        self.worker = worker
        self.seconds: collections.Counter[str] = collections.Counter()
        self.group: Path | None = None
        group = CPUACCT / f"ov-tests-{worker}-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
            self.group = group
        except OSError as exc:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{worker}.unmeasured").write_text(f"no cpuacct cgroup: {exc}\n")

    def usage(self) -> float:
        assert self.group is not None
        return int((self.group / "cpuacct.usage").read_text()) / 1e9

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):  # noqa: ARG002
        if self.group is None:
            yield
            return
        before = self.usage()
        yield
        self.seconds[item.nodeid.split("::", 1)[0]] += self.usage() - before

    def pytest_sessionfinish(self) -> None:
        if self.group is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        rounded = {name: round(total, 1) for name, total in sorted(self.seconds.items())}
        (self.folder / f"{self.worker}.json").write_text(json.dumps(rounded, indent=1), encoding="utf-8")


def register(config: pytest.Config) -> None:
    folder = os.environ.get("OV_TEST_CPU_REPORT")
    if not folder:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if worker == "main" and os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        return
    if worker == "main" and getattr(config.option, "numprocesses", None):
        return  # the xdist controller runs no tests
    config.pluginmanager.register(CpuReport(Path(folder), worker), "ov-cpu-report")
