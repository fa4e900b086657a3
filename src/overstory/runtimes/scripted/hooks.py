"""The hooks of the scripted runtime's player: the worktree's and ``--settings``' hook entries, run where
claude would run them (command hooks as processes, HTTP hooks as POSTs), so guards and the turn runner can
be tested end to end without a model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import typing as t
from pathlib import Path


def _matches(matcher: str | None, tool_name: str) -> bool:
    if not matcher or matcher == "*":
        return True
    if re.fullmatch(r"[\w|]+", matcher):
        return tool_name in matcher.split("|")
    return re.search(matcher, tool_name) is not None


def _http_hook(hook: dict[str, t.Any], payload: dict[str, t.Any]) -> tuple[int, str, str]:
    """An HTTP hook as Claude Code runs one (CLAUDE_PROBE_NOTES.md, "HTTP hooks"): POST the JSON, use a 2xx
    JSON (or empty) answer; on any failure block when ``onFailure`` is ``"block"``, else let the call run.
    ``$VAR``/``${VAR}`` in headers expand only for the variables in ``allowedEnvVars``."""
    import http.client
    from urllib.parse import urlsplit

    allowed = set(hook.get("allowedEnvVars") or ())

    def expand(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: os.environ.get(m.group(1) or m.group(2), "")
                      if (m.group(1) or m.group(2)) in allowed else "", value)

    url = urlsplit(str(hook["url"]))
    try:
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80,
                                          timeout=float(hook.get("timeout", 60)))
        try:
            headers = {"Content-Type": "application/json",
                       **{k: expand(str(v)) for k, v in (hook.get("headers") or {}).items()}}
            conn.request("POST", url.path or "/", json.dumps(payload), headers)
            answer = conn.getresponse()
            body = answer.read().decode("utf-8", errors="replace")
        finally:
            conn.close()
        if not 200 <= answer.status < 300:
            raise OSError(f"HTTP {answer.status} from {hook['url']}")
        if body.strip():
            json.loads(body)
        return 0, body, ""
    except (OSError, ValueError, http.client.HTTPException) as exc:
        detail = f"[{hook['url']}]: failed ({exc})"
        if hook.get("onFailure") == "block":
            return 2, "", f'{detail}; blocking because onFailure is "block"'
        return 1, "", detail


class Hooks:
    """Hooks (commands and HTTP) from ``.claude/settings.json``, ``.claude/settings.local.json`` and ``--settings``.

    Like claude, ``--setting-sources`` (comma-separated ``project``/``local``; ``""`` for none)
    limits which of the worktree's files count; ``--settings`` always does.
    """

    def __init__(self, cwd: str, settings_arg: str | None, setting_sources: str | None = None) -> None:
        self.cwd = cwd
        self.by_event: dict[str, list[dict[str, t.Any]]] = {}
        sources: list[str] = []
        allowed = None if setting_sources is None else {s.strip() for s in setting_sources.split(",")}
        for source, name in (("project", "settings.json"), ("local", "settings.local.json")):
            path = Path(cwd, ".claude", name)
            if (allowed is None or source in allowed) and path.is_file():
                sources.append(path.read_text())
        if settings_arg and settings_arg.lstrip().startswith("{"):
            sources.append(settings_arg)
        elif settings_arg and Path(settings_arg).is_file():
            sources.append(Path(settings_arg).read_text())
        for source in sources:
            try:
                hooks = json.loads(source).get("hooks") or {}
            except (json.JSONDecodeError, AttributeError):
                continue
            for event, groups in hooks.items():
                self.by_event.setdefault(event, []).extend(groups or [])

    def run(self, event: str, payload: dict[str, t.Any], tool_name: str = "") -> list[tuple[int, str, str]]:
        """Run every matching command; ``(exit code, stdout, stderr)`` for each."""
        outcomes = []
        env = dict(os.environ, CLAUDE_PROJECT_DIR=self.cwd, CLAUDE_CODE_SESSION_ID=payload["session_id"])
        for group in self.by_event.get(event, []):
            if event in ("PreToolUse", "PostToolUse", "PostToolUseFailure") and not _matches(group.get("matcher"),
                                                                                            tool_name):
                continue
            for hook in group.get("hooks") or []:
                if hook.get("type") == "http" and hook.get("url"):
                    outcomes.append(_http_hook(hook, payload))
                    continue
                if hook.get("type", "command") != "command" or not hook.get("command"):
                    continue
                try:
                    done = subprocess.run(["/bin/bash", "-c", hook["command"]], input=json.dumps(payload),
                                          capture_output=True, text=True, cwd=self.cwd, env=env,
                                          timeout=float(hook.get("timeout", 60)))
                    outcomes.append((done.returncode, done.stdout, done.stderr))
                except subprocess.TimeoutExpired:
                    outcomes.append((1, "", f"hook timed out: {hook['command']}"))
        return outcomes

    def denial(self, payload: dict[str, t.Any]) -> str | None:
        """The reason a PreToolUse hook refused this call, or None when it may run."""
        for code, out, err in self.run("PreToolUse", payload, payload["tool_name"]):
            if code == 2:
                return err.strip() or "blocked by a PreToolUse hook"
            try:
                decision = json.loads(out) if out.strip() else {}
            except json.JSONDecodeError:
                continue
            if not isinstance(decision, dict):
                continue
            specific = decision.get("hookSpecificOutput") or {}
            if specific.get("permissionDecision") == "deny":
                return specific.get("permissionDecisionReason") or "denied by a PreToolUse hook"
            if decision.get("decision") == "block":
                return decision.get("reason") or "blocked by a PreToolUse hook"
        return None

    def prompt_context(self, payload: dict[str, t.Any]) -> list[str]:
        """Extra context that UserPromptSubmit hooks add to the prompt."""
        extra = []
        for code, out, _err in self.run("UserPromptSubmit", payload):
            if code != 0 or not out.strip():
                continue
            try:
                parsed = json.loads(out)
                added = (parsed.get("hookSpecificOutput") or {}).get("additionalContext") if isinstance(parsed, dict) else None
            except json.JSONDecodeError:
                added = None
            extra.append(added if added is not None else out.strip())
        return extra
