"""A stand-in for the ``claude`` CLI that plays a scenario file instead of calling a model.

    python -m overstory.runtimes.scripted -p --output-format stream-json \\
        --input-format stream-json --verbose --permission-mode bypassPermissions \\
        [--model M] [--resume SID] --scenario FILE [--state-dir DIR]

It reads stream-json user messages on stdin and answers each with the stream-json
events the real CLI prints (system/init, assistant, user tool results, result). The
scripted actions really happen in the working directory (files are written, shell
commands run) and pass through the worktree's PreToolUse hooks first, exactly where
real claude would call them, so guards and the turn runner can be tested end to end
without a model.

Scenario (JSON, or YAML when the name ends in .yaml/.yml)::

    {"turns": [{"actions": [...], "result": "final text"}, ...],
     "agents": {"builder-*": {"turns": [...]}}}        # optional, by $OVERSTORY_AGENT_NAME

Turn N of a session plays ``turns[N]``; past the end the reply is "nothing more to do". In an
`ov loop` (``$OVERSTORY_LOOP_ITERATION`` set), a section with ``iterations`` plays
``iterations[N-1]`` as the first turn of iteration N's fresh session, and ``later_iterations`` (one
turn) as that of every iteration past the list.
Actions: text, write, edit, read, bash, tool, sleep, crash, api_error, expect_in_prompt,
usage (see ``_Turn.perform``). ``usage`` alone is a text message with that bill; beside a
tool action (``{"bash": ..., "usage": {...}}``) it is the bill of the tool call's own message,
which comes before the call's hooks run, as claude prints it. Any action may carry ``"once": PATH``: it is played only
while PATH does not exist, and creates it (so a retried or resumed turn skips it); a
relative PATH is in the agent's state dir (an absolute one under /tmp would be private
to one turn inside ov's sandbox).
Strings may hold ``${VAR}`` placeholders filled from the environment. Stdlib only: this
process starts once per turn.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import time
import typing as t
import uuid
from pathlib import Path

from overstory.runtimes.scripted.hooks import Hooks

NOTHING_MORE = "nothing more to do"
TOOL_ACTIONS = frozenset({"write", "edit", "read", "bash", "tool"})  # actions that are a tool call
COST_PER_STEP = 0.001
DEFAULT_MODEL = "scripted"
TOOLS = ["Task", "Bash", "Edit", "Glob", "Grep", "NotebookEdit", "Read", "TodoWrite",
         "WebFetch", "WebSearch", "Write"]
VERSION = "scripted-1"

# kind -> (HTTP status or None, CLI error label, message, retried first?)
API_ERRORS: dict[str, tuple[int | None, str, str, bool]] = {
    "overloaded": (529, "overloaded", "API Error: 529 Overloaded. This is a server-side issue, usually temporary.", True),
    "rate_limit": (429, "rate_limit", "API Error: Request rejected (429) · rate limit exceeded", True),
    "invalid_request": (400, "invalid_request", "API Error: 400 invalid request", False),
    "authentication": (401, "authentication_failed", "Invalid API key · Fix external API key", False),
    # An error with no HTTP status and a message no parser knows: what ov must not retry blindly.
    "unclassified": (None, "unknown", "The tool runner lost its state (code 0x2a); the turn cannot go on", False),
}
USAGE_LIMIT_TEXT = "You've hit your 5-hour limit"
NOT_LOGGED_IN_TEXT = "Not logged in · Please run /login"
RETRIES_BEFORE_GIVING_UP = 2

Event = dict[str, t.Any]


class Crash(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# --------------------------------------------------------------------------- helpers


def emit(event: Event) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: t.Any) -> t.Any:
    """Fill ``${VAR}`` from the environment in every string; unknown names stay as written."""
    if isinstance(value, str):
        return _PLACEHOLDER.sub(lambda m: os.environ.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [expand(item) for item in value]
    if isinstance(value, dict):
        return {key: expand(item) for key, item in value.items()}
    return value


def prompt_text(message: t.Any) -> str:
    """The text of a stream-json user message: a string, or a list of text blocks."""
    content = message.get("content", "") if isinstance(message, dict) else message
    if isinstance(content, str):
        return content
    parts = [block.get("text", "") for block in content or () if isinstance(block, dict)]
    return "\n".join(part for part in parts if part)


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def load_scenario(path: Path) -> list[dict[str, t.Any]]:
    """The turns this agent plays: ``agents[<first pattern matching the agent name>]`` or ``turns``."""
    from overstory.runtimes.scripted.scenario_shape import is_yaml_name, parse

    data = parse(path.read_text(), yaml=is_yaml_name(path.name))
    agent = os.environ.get("OVERSTORY_AGENT_NAME", "")
    section = data
    for pattern, script in (data.get("agents") or {}).items():
        if agent and fnmatch.fnmatchcase(agent, pattern):
            section = script
            break
    iteration = os.environ.get("OVERSTORY_LOOP_ITERATION", "")
    if iteration.isdigit() and "iterations" in section:  # an `ov loop`: each iteration is a fresh session
        plays = list(section.get("iterations") or [])
        if 0 < int(iteration) <= len(plays):
            return [plays[int(iteration) - 1]]
        later = section.get("later_iterations")  # the play of every iteration past the list
        return [later] if isinstance(later, dict) else []
    return list(section.get("turns") or [])


# --------------------------------------------------------------------------- sessions


class Session:
    """The session file: one JSON line per recorded message, like the CLI's transcripts.

    Kept at ``<state dir>/projects/<cwd with non-alphanumerics as "-">/<id>.jsonl``. The
    number of turns that finished without error is the index of the next scripted
    turn, so a turn that crashed or failed is played again when it is retried, the
    way a real model answers the same re-delivered mail again.
    """

    def __init__(self, state_dir: Path, cwd: str, session_id: str) -> None:
        self.id = session_id
        self.cwd = cwd
        self.state_dir = state_dir
        self.path = state_dir / "projects" / re.sub(r"[^A-Za-z0-9]", "-", cwd) / f"{session_id}.jsonl"

    def exists(self) -> bool:
        return self.path.is_file()

    def turns_completed(self) -> int:
        if not self.exists():
            return 0
        count = 0
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("type") == "result" and not record.get("message", {}).get("is_error"):
                count += 1
        return count

    def record(self, kind: str, message: dict[str, t.Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = {"type": kind, "message": message, "sessionId": self.id, "cwd": self.cwd,
                "uuid": str(uuid.uuid4()), "timestamp": _now()}
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")


# --------------------------------------------------------------------------- tools


def _absolute(cwd: str, path: str) -> str:
    return str(Path(cwd, path)) if not os.path.isabs(path) else path


def run_tool(name: str, tool_input: dict[str, t.Any], cwd: str) -> tuple[str, bool, t.Any]:
    """Perform a tool call: ``(tool_result content, is_error, tool_use_result summary)``."""
    if name == "Write":
        target = Path(tool_input["file_path"])
        existed = target.exists()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(tool_input["content"])
        message = (f"The file {target} has been updated successfully." if existed
                   else f"File created successfully at: {target}")
        return message, False, {"type": "update" if existed else "create", "filePath": str(target),
                                "content": tool_input["content"]}
    if name == "Edit":
        target = Path(tool_input["file_path"])
        if not target.is_file():
            return "<tool_use_error>File does not exist.</tool_use_error>", True, "Error: File does not exist."
        original = target.read_text()
        if tool_input["old_string"] not in original:
            why = f"String to replace not found in file.\nString: {tool_input['old_string']}"
            return f"<tool_use_error>{why}</tool_use_error>", True, f"Error: {why}"
        target.write_text(original.replace(tool_input["old_string"], tool_input["new_string"], 1))
        return (f"The file {target} has been updated successfully.", False,
                {"filePath": str(target), "oldString": tool_input["old_string"], "newString": tool_input["new_string"]})
    if name == "Read":
        target = Path(tool_input["file_path"])
        if not target.is_file():
            return "<tool_use_error>File does not exist.</tool_use_error>", True, "Error: File does not exist."
        content = target.read_text()
        numbered = "\n".join(f"{number}\t{line}" for number, line in enumerate(content.split("\n"), 1))
        return numbered, False, {"type": "text", "file": {"filePath": str(target), "content": content}}
    if name == "Bash":
        done = subprocess.run(["/bin/bash", "-c", tool_input["command"]], cwd=cwd, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        output = (done.stdout + done.stderr).rstrip("\n")
        summary = {"stdout": done.stdout, "stderr": done.stderr, "interrupted": False, "isImage": False}
        if done.returncode != 0:
            text = f"Exit code {done.returncode}\n{output}"
            return text, True, f"Error: {text}"
        return output, False, summary
    return "ok", False, "ok"


# --------------------------------------------------------------------------- one turn


class _Turn:
    """One user message in, events out, ending in a ``result`` event (or a crash)."""

    def __init__(self, session: Session, hooks: Hooks, model: str, prompt: str) -> None:
        self.session = session
        self.hooks = hooks
        self.model = model
        self.prompt = prompt
        self.steps = 0
        self.denials: list[dict[str, t.Any]] = []
        self.last_text = ""
        self.started = time.monotonic()
        self.extra_cost = 0.0

    def _base(self) -> Event:
        return {"parent_tool_use_id": None, "session_id": self.session.id, "uuid": str(uuid.uuid4())}

    def bill(self, spec: dict[str, t.Any]) -> dict[str, t.Any]:
        """``say``'s arguments for a scenario's ``usage`` spec: its tokens, model and dollar figure. The figure
        rides on the message (``cost_usd``, a scripted extension of claude's event), so ov counts it toward
        the turn's live estimate as it arrives; the turn's result reports it again in its total."""
        tokens = usage(int(spec.get("input_tokens", 0)), int(spec.get("output_tokens", 0)))
        tokens["cache_read_input_tokens"] = int(spec.get("cache_read", 0))
        tokens["cache_creation_input_tokens"] = int(spec.get("cache_write", 0))
        cost = float(spec.get("cost_usd", 0))
        self.extra_cost += cost
        return {"tokens": tokens, "model": spec.get("model"), "extra": {"cost_usd": cost} if cost else None}

    def say(self, block: dict[str, t.Any], *, error: str | None = None, tokens: dict[str, int] | None = None,
            extra: Event | None = None, model: str | None = None) -> None:
        self.steps += 1
        message = {"id": f"msg_scripted_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant",
                   "model": model or self.model, "content": [block], "stop_reason": None, "stop_sequence": None,
                   "usage": tokens if tokens is not None else usage(100 + len(self.prompt) // 4, 10)}
        event: Event = {"type": "assistant", "message": message, **self._base(), **(extra or {})}
        if error:
            event["error"] = error
        emit(event)
        self.session.record("assistant", message)
        if block["type"] == "text":
            self.last_text = block["text"]

    def tool(self, name: str, tool_input: dict[str, t.Any], bill: dict[str, t.Any] | None = None) -> None:
        tool_id = f"toolu_scripted_{uuid.uuid4().hex[:20]}"
        self.say({"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}, **(bill or {}))
        payload = {"session_id": self.session.id, "transcript_path": str(self.session.path),
                   "cwd": self.session.cwd, "permission_mode": "bypassPermissions",
                   "hook_event_name": "PreToolUse", "tool_name": name, "tool_input": tool_input,
                   "tool_use_id": tool_id}
        reason = self.hooks.denial(payload)
        if reason is not None:
            self.denials.append({"tool_name": name, "tool_use_id": tool_id, "tool_input": tool_input})
            content, is_error, summary = reason, True, f"Error: {reason}"
        else:
            started = time.monotonic()
            try:
                content, is_error, summary = run_tool(name, tool_input, self.session.cwd)
            except (OSError, UnicodeDecodeError) as exc:
                content, is_error, summary = f"<tool_use_error>{exc}</tool_use_error>", True, f"Error: {exc}"
            duration_ms = int((time.monotonic() - started) * 1000)
            if is_error:  # as claude: a failed call gets PostToolUseFailure, with the error text
                self.hooks.run("PostToolUseFailure", {**payload, "hook_event_name": "PostToolUseFailure",
                                                      "error": content, "is_interrupt": False, "duration_ms": duration_ms}, name)
            else:
                self.hooks.run("PostToolUse", {**payload, "hook_event_name": "PostToolUse",
                                               "tool_response": summary, "duration_ms": duration_ms}, name)
        block: dict[str, t.Any] = {"tool_use_id": tool_id, "type": "tool_result", "content": content}
        if is_error:
            block["is_error"] = True
        message = {"role": "user", "content": [block]}
        emit({"type": "user", "message": message, **self._base(), "timestamp": _now(), "tool_use_result": summary})
        self.session.record("user", message)

    def finish(self, result: str, *, is_error: bool = False, subtype: str = "success",
               api_error_status: int | None = None, extra: Event | None = None) -> bool:
        steps = max(self.steps, 1)
        cost = round(COST_PER_STEP * steps + self.extra_cost, 6)
        total = usage((100 + len(self.prompt) // 4) * steps, 10 * steps)
        emit({"type": "result", "subtype": subtype, "is_error": is_error, "api_error_status": api_error_status,
              "duration_ms": int((time.monotonic() - self.started) * 1000), "duration_api_ms": 0,
              "num_turns": steps, "result": result, "stop_reason": "end_turn", "session_id": self.session.id,
              "total_cost_usd": cost, "usage": total,
              "modelUsage": {self.model: {"inputTokens": total["input_tokens"], "outputTokens": total["output_tokens"],
                                          "cacheReadInputTokens": 0, "cacheCreationInputTokens": 0,
                                          "webSearchRequests": 0, "costUSD": cost}},
              "permission_denials": self.denials, "uuid": str(uuid.uuid4()), **(extra or {})})
        self.session.record("result", {"is_error": is_error, "subtype": subtype})
        return is_error

    def usage_limit(self, resets_in: float) -> bool:
        """A subscription's usage limit, as claude 2.1.330 reports it with an OAuth login (no retries)."""
        info = {"status": "rejected", "resetsAt": int(time.time() + resets_in), "rateLimitType": "five_hour",
                "isUsingOverage": False}
        emit({"type": "rate_limit_event", "rate_limit_info": info, **self._base()})
        self.say({"type": "text", "text": USAGE_LIMIT_TEXT}, error="rate_limit", tokens=usage(0, 0),
                 extra={"is_api_error_message": True, "api_error_status": 429, "api_error": "usage_limit_reached",
                        "api_error_params": {"rate_limit_info": info}, "api_error_type": "rate_limit_error"})
        return self.finish(USAGE_LIMIT_TEXT, is_error=True, api_error_status=429,
                           extra={"api_error": "usage_limit_reached", "api_error_type": "rate_limit_error",
                                  "terminal_reason": "api_error"})

    def auth_retries(self, seconds: float) -> bool:
        """A rejected API key: the CLI retries it for minutes (claude 2.1.330), then gives up."""
        emit({"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10, "retry_delay_ms": 600,
              "error_status": 401, "error": "authentication_failed", **self._base()})
        time.sleep(seconds)
        return self.api_error("authentication")

    def not_logged_in(self) -> bool:
        self.say({"type": "text", "text": NOT_LOGGED_IN_TEXT}, error="authentication_failed", tokens=usage(0, 0),
                 extra={"is_api_error_message": True})
        return self.finish(NOT_LOGGED_IN_TEXT, is_error=True, extra={"terminal_reason": "api_error"})

    def api_error(self, kind: str) -> bool:
        status, label, text, transient = API_ERRORS.get(kind, API_ERRORS["invalid_request"])
        if transient:
            for attempt in range(1, RETRIES_BEFORE_GIVING_UP + 1):
                emit({"type": "system", "subtype": "api_retry", "attempt": attempt,
                      "max_retries": RETRIES_BEFORE_GIVING_UP, "retry_delay_ms": 500 * attempt,
                      "error_status": status, "error": label, "session_id": self.session.id,
                      "uuid": str(uuid.uuid4())})
        self.say({"type": "text", "text": text}, error=label)
        # Measured on claude 2.1.197: an API error ends with subtype "success" but is_error true.
        return self.finish(text, is_error=True, api_error_status=status)

    def perform(self, actions: list[dict[str, t.Any]], result: str | None) -> bool:
        """Play the actions; True when the turn ended in error."""
        cwd = self.session.cwd
        for action in actions:
            action = expand(action)
            once = action.pop("once", None) if isinstance(action, dict) else None
            if once:
                # A relative PATH is in the agent's state dir: kept across its turns, and writable inside
                # ov's sandbox, where /tmp is private to each turn.
                marker = self.session.state_dir / once
                if marker.exists():
                    continue
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            spec = action.pop("usage", None) if isinstance(action, dict) else None
            bill = self.bill(spec) if isinstance(spec, dict) else None
            if bill is not None and not TOOL_ACTIONS.intersection(action):
                self.say({"type": "text", "text": str(spec.get("text", "working on it"))}, **bill)
            elif "text" in action:
                self.say({"type": "text", "text": str(action["text"])})
            elif "write" in action:
                spec = action["write"]
                self.tool("Write", {"file_path": _absolute(cwd, spec["path"]), "content": spec.get("content", "")},
                          bill)
            elif "edit" in action:
                spec = action["edit"]
                self.tool("Edit", {"file_path": _absolute(cwd, spec["path"]), "old_string": spec["old"],
                                   "new_string": spec["new"], "replace_all": False}, bill)
            elif "read" in action:
                self.tool("Read", {"file_path": _absolute(cwd, action["read"])}, bill)
            elif "bash" in action:
                self.tool("Bash", {"command": action["bash"], "description": "scripted command"}, bill)
            elif "tool" in action:
                self.tool(action["tool"]["name"], dict(action["tool"].get("input") or {}), bill)
            elif "sleep" in action:
                time.sleep(float(action["sleep"]))
            elif "crash" in action:
                raise Crash(int(action["crash"]))
            elif action.get("api_error") == "usage_limit":
                return self.usage_limit(float(action.get("resets_in", 60)))
            elif action.get("api_error") == "auth_retry":
                return self.auth_retries(float(action.get("retry_seconds", 180)))
            elif action.get("api_error") == "not_logged_in":
                return self.not_logged_in()
            elif "api_error" in action:
                return self.api_error(str(action["api_error"]))
            elif "expect_in_prompt" in action:
                wanted = str(action["expect_in_prompt"])
                if wanted not in self.prompt:
                    text = f"expected {wanted!r} in the prompt, but it was not there"
                    self.say({"type": "text", "text": text})
                    return self.finish(text, is_error=True, subtype="error_during_execution")
            else:
                text = f"scenario error: unknown action {sorted(action)}"
                self.say({"type": "text", "text": text})
                return self.finish(text, is_error=True, subtype="error_during_execution")
        if result is None:
            result = self.last_text
        else:
            result = str(expand(result))
            if result != self.last_text or self.steps == 0:
                self.say({"type": "text", "text": result})
        return self.finish(result)


# --------------------------------------------------------------------------- main


def _parse_args(argv: list[str]) -> dict[str, str | None]:
    """The options we use; every other claude flag is accepted and ignored."""
    wanted = {"--model": None, "--resume": None, "--scenario": None, "--state-dir": None, "--settings": None,
              "--setting-sources": None}
    taking_value = {"--output-format", "--input-format", "--permission-mode", "--append-system-prompt",
                     "--append-system-prompt-file", "--system-prompt", "--max-turns", "--allowedTools",
                     "--disallowedTools", "--session-id"}
    index = 0
    while index < len(argv):
        arg = argv[index]
        name, eq, value = arg.partition("=")
        if name in wanted:
            if not eq:
                index += 1
                value = argv[index] if index < len(argv) else ""
            wanted[name] = value
        elif name in taking_value and not eq:
            index += 1
        index += 1
    return wanted


def _error_result(session_id: str, message: str) -> None:
    emit({"type": "result", "subtype": "error_during_execution", "duration_ms": 0, "duration_api_ms": 0,
          "is_error": True, "num_turns": 0, "stop_reason": None, "session_id": session_id,
          "total_cost_usd": 0, "usage": usage(0, 0), "modelUsage": {}, "permission_denials": [],
          "uuid": str(uuid.uuid4()), "errors": [message]})


FORGET_ENV = "OV_SCRIPTED_FORGET_SESSIONS"


def main(argv: list[str] | None = None) -> int:
    options = _parse_args(sys.argv[1:] if argv is None else argv)
    scenario_name = options["--scenario"] or os.environ.get("OV_SCRIPTED_SCENARIO")
    if not scenario_name:
        print("scripted runtime: no scenario (pass --scenario FILE or set OV_SCRIPTED_SCENARIO)", file=sys.stderr)
        return 2
    try:
        turns = load_scenario(Path(scenario_name))
    except (OSError, ValueError, AttributeError) as exc:
        print(f"scripted runtime: cannot read scenario {scenario_name}: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(options["--state-dir"] or os.environ.get("OV_SCRIPTED_STATE_DIR")
                     or os.environ.get("CLAUDE_CONFIG_DIR") or Path.home() / ".ov-scripted")
    model = options["--model"] or os.environ.get("ANTHROPIC_MODEL") or DEFAULT_MODEL
    cwd = os.getcwd()

    if os.environ.get(FORGET_ENV):  # tests: a CLI that lost its sessions and starts a new one, as some do
        options["--resume"] = None
    session = Session(state_dir, cwd, options["--resume"] or str(uuid.uuid4()))
    if options["--resume"] and not session.exists():
        message = f"No conversation found with session ID: {session.id}"
        print(message, file=sys.stderr)
        _error_result(session.id, message)
        return 1
    hooks = Hooks(cwd, options["--settings"], options["--setting-sources"])

    failed = False
    for line in sys.stdin:
        try:
            incoming = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(incoming, dict) or incoming.get("type") != "user":
            continue
        text = prompt_text(incoming.get("message", {}))
        emit({"type": "system", "subtype": "init", "cwd": cwd, "session_id": session.id, "tools": TOOLS,
              "mcp_servers": [], "model": model, "permissionMode": "bypassPermissions",
              "apiKeySource": "none", "claude_code_version": VERSION, "uuid": str(uuid.uuid4())})
        index = session.turns_completed()
        session.record("user", {"role": "user", "content": text})
        context = hooks.prompt_context({"session_id": session.id, "transcript_path": str(session.path),
                                        "cwd": cwd, "permission_mode": "bypassPermissions",
                                        "hook_event_name": "UserPromptSubmit", "prompt": text})
        turn = _Turn(session, hooks, model, "\n\n".join([text, *context]))
        script = turns[index] if index < len(turns) else {"actions": [], "result": NOTHING_MORE}
        try:
            failed |= turn.perform(list(script.get("actions") or []), script.get("result"))
        except Crash as crash:
            sys.stdout.flush()
            os._exit(crash.code)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            failed |= turn.finish(f"scenario error in turn {index}: {exc!r}", is_error=True,
                                  subtype="error_during_execution")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
