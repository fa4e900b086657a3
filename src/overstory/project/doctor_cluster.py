"""`ov doctor`'s checks of the Ray cluster when turns run there (``executor: ray``, or ``ov doctor --executor ray``).

One line per problem, each a ``Finding`` (a ``project.doctor.Check``): the ``ray`` extra not installed, no address, nothing answering at
it, no alive node a turn fits on (``turn_resources``), a node with another ov version or without ov, a
node without a configured runtime, a node whose clock is off; dead nodes Ray still lists are one warning.
Anything that would make turns fail on a node fails the doctor (exit 1); skew and dead nodes only warn.

The survey itself (``executors.ray_doctor``) runs in a child process of this module, bounded by a timeout:
``ray.init`` cannot be interrupted and Ray writes its own log lines to the terminal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as t

if t.TYPE_CHECKING:
    from overstory.config.model import Config


class Finding(t.NamedTuple):
    name: str
    status: str
    detail: str
    hint: str = ""


OK, WARN, FAIL = "ok", "warn", "fail"  # as ``project.doctor``'s, which turns each finding into a Check
MARK = "OV-RAY-DOCTOR "
SURVEY_SECONDS = 150.0
SKEW_WARN_MS = 1000
INSTALL_HINT = "pip install 'overstory[ray]' (on this machine and every node)"


def wanted(config: Config, executor: str | None) -> bool:
    """Whether the doctor looks at the cluster: ``--executor ray``, or ``executor.kind: ray`` without ``--executor``."""
    return (executor or config.executor.kind) == "ray"


def configured_runtimes(config: Config) -> list[str]:
    """The runtimes new agents get: ``runtime.default`` and each capability's ``runtimes`` entry."""
    return sorted({config.runtime.default, *config.runtimes.values()})


def node_facts(config_data: dict[str, t.Any], runtimes: list[str]) -> dict[str, t.Any]:
    """On a node (a Ray task): ov's version there, and each of ``runtimes`` as this node finds it."""
    import overstory
    from overstory.config.model import Config
    from overstory.runtimes import get_runtime

    config = Config.model_validate(config_data)
    found = {}
    for name in runtimes:
        probe = get_runtime(name).probe(config)
        found[name] = {"installed": probe.installed, "detail": probe.detail, "hint": probe.hint}
    return {"version": overstory.__version__, "host": os.uname().nodename, "runtimes": found,
            "travel": travel_problem() if runtimes else ""}


def travel_problem() -> str:
    """Why this node cannot take a turn's workspace (``executors.travel_node``), or "" when it can: git, and a
    mount namespace of the turn's own (``unshare --mount``, made here once to be sure)."""
    import shutil
    import subprocess

    from overstory.executors.travel_node import in_mount_namespace

    lacking = [name for name in ("git", "unshare", "mount") if shutil.which(name) is None]
    if lacking:
        return f"{', '.join(lacking)} not found"
    made = subprocess.run(in_mount_namespace(["true"]), capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"cannot make a mount namespace: {' '.join(made.stderr.split())[:200]}"
    return ""


def check_cluster(config: Config) -> list[Finding]:
    """The cluster's checks (see the module's docstring)."""
    from overstory.errors import ExecutorUnavailable
    from overstory.executors import check_available

    ray = config.executor.ray
    try:
        check_available("ray")
    except ExecutorUnavailable:
        return [Finding("ray", FAIL, "executor ray needs the ray package, which is not installed here", INSTALL_HINT)]
    if not ray.address:
        return [Finding("cluster", FAIL, "executor ray has no cluster address",
                        "set executor.ray.address to HOST:PORT of a running cluster (ray start --head)")]
    request = {"address": ray.address, "namespace": ray.namespace, "turn_resources": dict(ray.turn_resources),
               "runtimes": configured_runtimes(config), "config": config.model_dump()}
    answer = _survey(request)
    return judge(ray.address, dict(ray.turn_resources), answer)


def _survey(request: dict[str, t.Any]) -> dict[str, t.Any]:
    try:
        done = subprocess.run([sys.executable, "-m", "overstory.project.doctor_cluster"], input=json.dumps(request, default=str),
                              capture_output=True, text=True, timeout=SURVEY_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        return {"unreachable": f"the cluster did not answer within {SURVEY_SECONDS:g} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            answer: dict[str, t.Any] = json.loads(line[len(MARK):])
            return answer
    last = [line for line in done.stderr.splitlines() if line.strip()]
    return {"failed": last[-1][:300] if last else f"the survey exited with {done.returncode}"}


def judge(address: str, turn_resources: dict[str, float], answer: dict[str, t.Any]) -> list[Finding]:
    """The survey's answer as checks: one line per problem, or one line saying all is well."""
    if "unavailable" in answer:
        return [Finding("ray", FAIL, f"executor ray cannot load the ray package: {answer['unavailable']}",
                      INSTALL_HINT)]
    if "unreachable" in answer:
        return [Finding("cluster", FAIL, f"cannot reach the Ray cluster at {address}: {answer['unreachable']}",
                      f"start it (ray start --head --port {address.rpartition(':')[2]}) or fix executor.ray.address;"
                      " ov never starts a cluster")]
    if "failed" in answer:
        return [Finding("cluster", FAIL, f"the survey of the cluster at {address} failed: {answer['failed']}")]
    import overstory

    nodes: list[dict[str, t.Any]] = answer.get("nodes") or []
    alive = [node for node in nodes if node.get("alive")]
    dead = [node for node in nodes if not node.get("alive")]
    capable = [node for node in alive if node.get("runs_turns")]
    wants = ", ".join(f"{name}={amount:g}" for name, amount in turn_resources.items()) or "nothing"
    checks = []
    if not capable:
        checks.append(Finding("cluster", FAIL, f"{address}: {len(alive)} node(s) alive, none with room for a turn "
                                             f"({wants})", "start a worker node: ray start --address " + address))
    else:
        checks.append(Finding("cluster", OK, f"{address}: {len(alive)} node(s) alive, {len(capable)} with room for "
                                           f"a turn ({wants})"))
    if dead:
        checks.append(Finding("cluster", WARN, f"{len(dead)} dead node(s) Ray still lists: "
                                             + ", ".join(_label(node) for node in dead)))
    problems = 0
    for node in alive:
        found = _node_problems(node, overstory.__version__)
        problems += len(found)
        checks.extend(found)
    if capable and not problems:
        names = sorted({name for node in capable for name in (node.get("facts") or {}).get("runtimes", {})})
        checks.append(Finding("nodes", OK, f"every node has ov {overstory.__version__}"
                                         + (f" and {', '.join(names)}" if names else "")
                                         + f"; clocks within {SKEW_WARN_MS / 1000:g} s of this machine's"))
    return checks


def _node_problems(node: dict[str, t.Any], version: str) -> list[Finding]:
    label = f"node {_label(node)}"
    if "error" in node and not node.get("facts"):
        return [Finding(label, FAIL, f"ov does not run there: {node['error']}",
                      f"install ov {version} with the ray extra on that node")]
    checks = []
    facts = node.get("facts") or {}
    if facts.get("version") != version:
        checks.append(Finding(label, FAIL, f"ov {facts.get('version')}, not {version} as here",
                            f"install ov {version} on that node"))
    if facts.get("travel"):
        checks.append(Finding(label, FAIL, f"cannot take a turn's workspace: {facts['travel']}",
                              "install git and util-linux (unshare, mount) there; ov runs each remote turn in a mount "
                              "namespace of its own, as root or with unprivileged user namespaces"))
    for name, probe in sorted(dict(facts.get("runtimes") or {}).items()):
        if not probe.get("installed"):
            checks.append(Finding(label, FAIL, f"runtime {name} is missing: {probe.get('detail')}",
                                str(probe.get("hint") or "")))
    if "error" in node:
        checks.append(Finding(label, WARN, str(node["error"])))
    skew, error = node.get("skew_ms"), node.get("clock_error_ms") or 0
    if skew is not None and abs(skew) - error > SKEW_WARN_MS:
        way = "ahead of" if skew > 0 else "behind"
        checks.append(Finding(label, WARN, f"its clock is {abs(skew) / 1000:.1f} s {way} this machine's",
                            "run NTP (chrony, systemd-timesyncd) on every node"))
    return checks


def _label(node: dict[str, t.Any]) -> str:
    return f"{node.get('name') or '?'} ({str(node.get('id'))[:8]})"


def main() -> int:
    from overstory.executors.ray_doctor import survey

    answer = survey(json.loads(sys.stdin.read()), node_facts)
    sys.stdout.write(MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
