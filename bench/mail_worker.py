"""One of the concurrent senders of figure 3. Prints a JSON report on stdout.

    python bench/mail_worker.py --project ROOT --sender w03 --to sink --count 400 \
        --start-at EPOCH_SECONDS --mode api|cli [--ov PATH]

``api`` sends through ``overstory.store.mail.send`` on one connection (as a long-lived
process would); ``cli`` runs ``ov mail send`` once per message (as an agent does).
Every message carries a unique subject ``<sender> #<i>`` so the parent can check
that none was lost or duplicated. Errors are counted, never retried.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--project", required=True)
    parser.add_argument("--sender", required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--start-at", type=float, required=True)
    parser.add_argument("--mode", choices=("api", "cli"), default="api")
    parser.add_argument("--ov", default="ov")
    args = parser.parse_args()
    root = Path(args.project)
    latencies: list[float] = []
    errors: list[str] = []
    body = "Progress: finished the parser change; running the test suite next."

    if args.mode == "api":
        from overstory.store import mail
        from overstory.store.db import open_events, open_state

        state = open_state(root / ".overstory" / "state.db")
        events = open_events(root / ".overstory" / "events.db")
        send = lambda i: mail.send(state, sender=args.sender, to=args.to, subject=f"{args.sender} #{i}",  # noqa: E731
                                   body=body, env={}, events=events)
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OVERSTORY_")}
        env["OVERSTORY_PROJECT_ROOT"] = str(root)

        def send(i: int) -> None:
            done = subprocess.run([args.ov, "mail", "send", "--from", args.sender, "--to", args.to,
                                   "--subject", f"{args.sender} #{i}", "--body", body],
                                  capture_output=True, text=True, env=env, cwd=root)
            if done.returncode != 0:
                raise RuntimeError(f"exit {done.returncode}: {done.stderr.strip()[-200:]}")

    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    first = time.time()
    for index in range(args.count):
        started = time.perf_counter()
        try:
            send(index)
        except Exception as exc:  # counted and reported: the figure is about errors
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            continue
        latencies.append((time.perf_counter() - started) * 1000)
    last = time.time()
    json.dump({"sender": args.sender, "latencies_ms": latencies, "errors": errors, "first": first, "last": last},
              sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
