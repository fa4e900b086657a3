"""Figure 10's model: the mock Messages API (tests/mockapi.py) in a process of its own.

In real use the model answers from another machine; served from the benchmark's own process,
its answers would wait for the GIL while that process serves ov's hooks and reads the turn's
stream, and the model's delay would be counted as ov's.

    python bench/model_server.py --calls N --file PATH

Plays N Read calls of PATH and a closing text. Prints its base URL on stdout, serves until
stdin closes, then prints one JSON line: the gaps (ms) between consecutive main requests,
each stamped on arrival.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time
import typing as t
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from mockapi import MockMessagesAPI, ScriptedConversation, assistant_turns, text_reply, tool_reply


class Stamped:
    """A responder that plays the script and notes when each main request arrived, by position."""

    def __init__(self, replies: list[t.Any]) -> None:
        self.script = ScriptedConversation(replies)
        self.arrivals: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, t.Any]) -> t.Any:
        with self.lock:
            self.arrivals.setdefault(assistant_turns(body), time.monotonic())
        return self.script(body)

    def gaps(self) -> list[float]:
        times = [self.arrivals[i] for i in sorted(self.arrivals)]
        return [(b - a) * 1000 for a, b in itertools.pairwise(times)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--file", required=True)
    args = parser.parse_args()
    stamped = Stamped([tool_reply("Read", {"file_path": args.file}) for _ in range(args.calls)] + [text_reply("done")])
    with MockMessagesAPI(stamped) as api:
        print(api.base_url, flush=True)
        sys.stdin.read()
    print(json.dumps(stamped.gaps()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
