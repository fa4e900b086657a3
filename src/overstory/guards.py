"""PreToolUse decisions for agents (ARCHITECTURE §10): may this one tool call run?

`ov guard` runs once per tool call, so this module imports only the standard library.

Policy:

- Outside an agent (no ``OVERSTORY_AGENT_NAME``) everything is allowed.
- Claude's own delegation, scheduling and worktree tools (``BLOCKED_TOOLS``) are denied
  for everyone: delegation goes through ``ov sling``, talk through ``ov mail``.
- Read-only capabilities (coordinator, lead, scout, reviewer, monitor, and any capability
  we do not know) may not use the file-writing tools, and every shell command they run
  must be on an allow-list of read-only programs and forms (``git log`` yes, ``git
  commit`` no). Output may only go to /dev/null or be duplicated (``2>&1``).
- Writers (builder, merger) may write only inside their own worktree or the system temp
  dir. Never into another agent's worktree, ov's state under ``.overstory/``, the project
  checkout, the worktree's git metadata, or the ``.claude/settings*.json`` hook files
  that run this guard. Paths are resolved against the tool's cwd (and ``cd`` within the
  command), with ``~``, known ``$VARS``, ``..`` and symlinks (``os.path.realpath``).
- Nobody pushes, hard-resets, force-creates/deletes/renames other branches, updates refs
  directly, manages git worktrees, changes the shared git config or remotes, installs
  packages outside the worktree, or uses sudo.

Shell commands are split on operators by a quote-aware scanner, which also pulls out the
commands inside ``$(...)``, backticks, ``<(...)``, unquoted heredocs, ``bash -c``,
``eval``, ``find -exec``, ``xargs`` and wrappers (``env``, ``timeout``, ``nohup`` …).
Each simple command is split into words with :mod:`shlex`.

Where no exact answer exists, this is what we chose:

- Inline interpreter code (``python -c``, ``node -e``, ``perl -e``, scripts, ``source``)
  cannot be checked for writes: denied for read-only agents, allowed for writers (whose
  arguments are still checked for paths into other agents' worktrees and ov's state).
- Test runners and linters (``pytest``, ``python -m pytest``, ``npm test``, ``cargo
  test``, ``go test``, ``make test``, ``mypy``, ``ruff check`` …) are allowed for
  read-only agents because reviewers need them. They may write caches
  (``.pytest_cache``, ``__pycache__``), which are build artefacts, not source; options
  that write report files are denied.
- ``awk`` and ``sed`` programs get a best-effort look for ``system()``, ``print >``,
  ``| "cmd"`` and sed's ``w``/``e``.
- For writers, a target that cannot be known before the command runs (``$(...)``, an
  unknown ``$VAR``, anything after ``cd -``) is allowed. So is a symlink created and
  written through in the same command; the next tool call resolves it and is refused.
- A shell command we cannot parse (an unclosed quote, ``$(`` or heredoc word) is denied
  for everyone with a reason; bash would reject nearly all of these too.
- Reading is never restricted: a reviewer may read another agent's worktree.
- Tools this module does not know (MCP tools, new Claude tools) are allowed.
- The git stash is shared by all worktrees: ``git stash clear`` is refused; other stash
  commands are left to writers.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

WRITE_CAPABILITIES = frozenset({"builder", "merger"})
READ_ONLY_CAPABILITIES = frozenset({"coordinator", "lead", "scout", "reviewer", "monitor"})

_DELEGATE = (
    "ov agents delegate with `ov sling <capability> <task-id>` and talk to other agents "
    "with `ov mail send`."
)
_OV_DRIVES_TURNS = (
    "ov drives your turns: end the turn when you are waiting; new mail starts the next one."
)

#: Tools denied for every agent, with the reason shown to the model. Extend freely.
BLOCKED_TOOLS: dict[str, str] = {
    "Task": f"Claude's sub-agents are disabled here: {_DELEGATE}",
    "Agent": f"Claude's sub-agents are disabled here: {_DELEGATE}",
    "TeamCreate": f"Claude's agent teams are disabled here: {_DELEGATE}",
    "TeamDelete": f"Claude's agent teams are disabled here: {_DELEGATE}",
    "SendMessage": f"Claude's team messages are disabled here: {_DELEGATE}",
    "Workflow": f"Claude's multi-agent workflows are disabled here: {_DELEGATE}",
    "RemoteTrigger": f"Remote agents are disabled here: {_DELEGATE}",
    "EnterWorktree": "ov manages your worktree: stay in it. Ask your parent with "
    "`ov mail send` if you need a different one.",
    "ExitWorktree": "ov manages your worktree: stay in it; `ov stop` and `ov merge` "
    "clean it up when you are done.",
    "CronCreate": f"Scheduled prompts are disabled here. {_OV_DRIVES_TURNS}",
    "CronDelete": f"Scheduled prompts are disabled here. {_OV_DRIVES_TURNS}",
    "ScheduleWakeup": f"Wake-ups are disabled here. {_OV_DRIVES_TURNS}",
    "Artifact": "Publishing outside the project is disabled here: report results to your "
    "parent with `ov mail send`.",
    "PushNotification": "Notifications are disabled here: report to your parent with "
    "`ov mail send`.",
}

#: File-writing tools and the tool_input key that holds the path they write.
FILE_WRITE_TOOLS: dict[str, str] = {
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
}

#: Tools whose ``command`` is a shell command line.
SHELL_TOOLS = frozenset({"Bash", "Monitor"})

#: Tools that run code we cannot inspect (JavaScript, PowerShell).
CODE_TOOLS = frozenset({"REPL", "PowerShell"})


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str = ""

    @classmethod
    def deny(cls, reason: str) -> Decision:
        return cls(False, reason)


ALLOW = Decision(True)


# --------------------------------------------------------------------------- entry points


def decide(hook_input: Mapping[str, object], env: Mapping[str, str]) -> Decision:
    """Decide one PreToolUse call. Fails closed inside an agent: a bug here denies."""
    agent_name = env.get("OVERSTORY_AGENT_NAME", "")
    if not agent_name:
        return ALLOW
    try:
        return _decide(hook_input, _Agent.from_env(agent_name, env))
    except Exception as exc:  # noqa: BLE001 - a crash would let the call through
        return Decision.deny(
            f"ov guard failed while checking this call ({type(exc).__name__}: {exc}); the "
            "call was blocked to be safe. Try a simpler form, or report it with `ov mail send`."
        )


def decide_hook_text(text: str | None, env: Mapping[str, str]) -> Decision:
    """Decide from the raw hook stdin. Unreadable input is denied inside an agent."""
    if not env.get("OVERSTORY_AGENT_NAME"):
        return ALLOW
    if text is None:
        return Decision.deny("ov guard could not read the hook input on stdin; call blocked.")
    try:
        data = json.loads(text)
    except ValueError:
        return Decision.deny(
            "ov guard received hook input that is not JSON, so it cannot check this call; "
            "call blocked."
        )
    if not isinstance(data, dict):
        return Decision.deny("ov guard expected a JSON object as hook input; call blocked.")
    return decide(data, env)


def hook_response(decision: Decision) -> str:
    """What `ov guard` prints: Claude's PreToolUse deny object, or nothing when allowed."""
    if decision.allow:
        return ""
    payload = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": decision.reason,
        }
    }
    return json.dumps(payload, separators=(",", ":"))


# --------------------------------------------------------------------------- the agent


def _real(path: str) -> str:
    return os.path.realpath(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class _Agent:
    name: str
    capability: str
    writable: bool
    worktree: str | None
    project_root: str | None
    env: Mapping[str, str]
    temp_dirs: tuple[str, ...]

    @classmethod
    def from_env(cls, name: str, env: Mapping[str, str]) -> _Agent:
        capability = env.get("OVERSTORY_CAPABILITY", "").strip().lower()
        worktree = env.get("OVERSTORY_WORKTREE") or None
        root = env.get("OVERSTORY_PROJECT_ROOT") or None
        worktree = _real(worktree) if worktree and os.path.isabs(worktree) else None
        root = _real(root) if root and os.path.isabs(root) else None
        if root is None and worktree is not None:
            parts = worktree.split(os.sep)
            if len(parts) >= 3 and parts[-3:-1] == [".overstory", "worktrees"]:
                root = os.sep.join(parts[:-3]) or os.sep
        temps = {"/tmp", "/var/tmp"}
        for key in ("TMPDIR", "TEMP", "TMP"):
            if env.get(key, "").startswith(os.sep):
                temps.add(env[key])
        temp_dirs = tuple(sorted({_real(t) for t in temps} | temps))
        return cls(
            name=name,
            capability=capability or "unknown",
            writable=capability in WRITE_CAPABILITIES,
            worktree=worktree,
            project_root=root,
            env=env,
            temp_dirs=temp_dirs,
        )

    @property
    def own_branch(self) -> str:
        return self.env.get("OVERSTORY_BRANCH") or f"ov/{self.name}"

    @property
    def who(self) -> str:
        return f"{self.name} ({self.capability})"

    @property
    def overstory_dir(self) -> str | None:
        return os.path.join(self.project_root, ".overstory") if self.project_root else None

    def start_dir(self, hook_input: Mapping[str, object]) -> str | None:
        cwd = hook_input.get("cwd")
        if isinstance(cwd, str) and os.path.isabs(cwd):
            return _real(cwd)
        return self.worktree or self.project_root

    # ---- reasons

    def read_only(self, what: str) -> str:
        unknown = (
            ""
            if self.capability in READ_ONLY_CAPABILITIES
            else f" (capability '{self.capability}' is not a writer, so it is treated as read-only)"
        )
        return (
            f"{self.who} is read-only{unknown}: it may not {what}. Read with Read/Grep/Glob or "
            "read-only shell commands, and report what should change to your parent with "
            "`ov mail send`."
        )

    # ---- paths

    def expand(self, word: str, cwd: str | None) -> str | None:
        """Resolve a shell word to a real absolute path, or None when it cannot be known."""
        if _SUBST in word or "`" in word:
            return None
        if word == "~" or word.startswith("~/"):
            home = self.env.get("HOME")
            if not home:
                return None
            word = home + word[1:]
        elif word.startswith("~"):
            return None
        if "$" in word:
            word = _VAR_RE.sub(lambda m: self._var(m), word)
            if "$" in word:
                return None
        if not word:
            return None
        if not os.path.isabs(word):
            if cwd is None:
                return None
            word = os.path.join(cwd, word)
        return _real(word)

    def _var(self, match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        value = self.env.get(name)
        return value if value is not None else match.group(0)

    def _in_own_worktree(self, path: str) -> bool:
        """Inside our own worktree, when that worktree is one of ov's (not the project root)."""
        if not self.worktree or not self.overstory_dir:
            return False
        worktrees = os.path.join(self.overstory_dir, "worktrees")
        return _inside(self.worktree, worktrees) and self.worktree != worktrees and _inside(
            path, self.worktree
        )

    def other_worktree(self, path: str) -> str | None:
        """The name of the other agent whose worktree holds ``path``, if any."""
        if not self.overstory_dir or self._in_own_worktree(path):
            return None
        worktrees = os.path.join(self.overstory_dir, "worktrees")
        if not _inside(path, worktrees) or path == worktrees:
            return None
        return path[len(worktrees) + 1 :].split(os.sep, 1)[0]

    def write_denial(self, word: str, cwd: str | None, *, removes: bool = False) -> str | None:
        """Why a write to ``word`` is refused, or None when it is allowed (or unknowable)."""
        if word in _NULL_SINKS or word.startswith("/dev/fd/"):
            return None
        path = self.expand(word, cwd)
        if path is None:
            return None
        shown = word if word == path else f"`{word}` ({path})"
        parent, base = os.path.split(path)
        if os.path.basename(parent) == ".claude" and base in _HOOK_SETTINGS:
            return (
                f"{shown} holds the Claude hook settings that run `ov guard`; ov manages "
                "them and no agent may change them."
            )
        if self.overstory_dir and _inside(path, self.overstory_dir) and not self._in_own_worktree(path):
            other = self.other_worktree(path)
            if other is not None:
                return (
                    f"{shown} is inside {other}'s worktree; {self.who} may only write inside "
                    f"{self._own()}. Ask {other} with `ov mail send --to {other}` if it needs "
                    "a change."
                )
            return (
                f"{shown} is ov's own state under {self.overstory_dir}; change it only through "
                "`ov` commands."
            )
        if self.worktree and _inside(path, self.worktree):
            if removes and path == self.worktree:
                return f"{self.who} may not remove or move its own worktree {self.worktree}."
            if _inside(path, os.path.join(self.worktree, ".git")):
                return (
                    f"{shown} is the worktree's git metadata; change it only through git "
                    "commands."
                )
            return None
        if self.project_root and _inside(path, self.project_root):
            return (
                f"{shown} is in the project checkout {self.project_root}; {self.who} may only "
                f"write inside {self._own()}. Your branch {self.own_branch} reaches the project "
                "through `ov merge`."
            )
        if path in _NULL_SINKS or any(_inside(path, t) for t in self.temp_dirs):
            return None
        return f"{self.who} may only write inside {self._own()}; {shown} is outside it."

    def _own(self) -> str:
        return f"its worktree {self.worktree}" if self.worktree else (
            "its worktree (none is set: OVERSTORY_WORKTREE is missing, so only the temp dir "
            "is writable)"
        )

    def protected_zone_denial(self, words: Iterable[str], cwd: str | None) -> str | None:
        """For commands we cannot model: refuse arguments that name other agents' files."""
        if not self.overstory_dir:
            return None
        for word in words:
            value = word.split("=", 1)[1] if word.startswith("-") and "=" in word else word
            if "/" not in value and not value.startswith((".", "~")):
                continue
            path = self.expand(value, cwd)
            if path is None or not _inside(path, self.overstory_dir):
                continue
            if self._in_own_worktree(path):
                continue
            return self.write_denial(value, cwd)
        return None


_VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_NULL_SINKS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})
_HOOK_SETTINGS = frozenset({"settings.json", "settings.local.json"})


# --------------------------------------------------------------------------- tool dispatch


def _decide(hook_input: Mapping[str, object], agent: _Agent) -> Decision:
    event = hook_input.get("hook_event_name")
    if isinstance(event, str) and event and event != "PreToolUse":
        return ALLOW
    tool = hook_input.get("tool_name")
    if not isinstance(tool, str) or not tool:
        return Decision.deny("ov guard got hook input without a tool_name; call blocked.")
    tool_input = hook_input.get("tool_input")
    if tool_input is None:
        tool_input = {}
    if not isinstance(tool_input, dict):
        return Decision.deny(f"ov guard got a {tool} call whose tool_input is not an object.")

    if tool in BLOCKED_TOOLS:
        return Decision.deny(f"{tool} is not available to {agent.who}. {BLOCKED_TOOLS[tool]}")

    if tool in FILE_WRITE_TOOLS:
        if not agent.writable:
            return Decision.deny(agent.read_only(f"write files (the {tool} tool)"))
        key = FILE_WRITE_TOOLS[tool]
        path = tool_input.get(key)
        if not isinstance(path, str) or not path:
            return Decision.deny(f"{tool} call without a {key}; nothing to check, call blocked.")
        reason = agent.write_denial(path, agent.start_dir(hook_input))
        return Decision.deny(reason) if reason else ALLOW

    if tool in SHELL_TOOLS:
        command = tool_input.get("command")
        if command is None and tool != "Bash":
            return ALLOW  # e.g. Monitor watching a websocket
        if not isinstance(command, str):
            return Decision.deny(f"{tool} call without a command string; call blocked.")
        reason = check_shell(command, agent, agent.start_dir(hook_input))
        return Decision.deny(reason) if reason else ALLOW

    if tool in CODE_TOOLS and not agent.writable:
        return Decision.deny(
            agent.read_only(f"run the {tool} tool, whose code cannot be checked for writes")
        )
    return ALLOW


# --------------------------------------------------------------------------- shell parsing

_SUBST = "__ov_cmdsub__"  # stands in for the output of $(...), `...`, <(...)
_OP = "\x00"  # prefix of a redirection operator word; quoting can never produce it
_REDIRECT_OPERATORS = ("&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<>", "<&", ">", "<")
_WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>"})
_WORD_BREAK = " \t\n;&|<>()"


class _Unparseable(Exception):
    """Internal: the command line is not something we can split safely."""


@dataclass
class ShellCommand:
    """One simple command: its words and its redirections ``(operator, target)``."""

    argv: list[str]
    redirects: list[tuple[str, str]] = field(default_factory=list)


def split_shell(script: str) -> list[ShellCommand]:
    """Every simple command in ``script``, including those inside substitutions.

    Raises ValueError when the script cannot be split (unclosed quote, ``$(`` …).
    """
    try:
        segments, _ = _scan(script, 0, inside=False)
        return [_words(segment) for segment in segments]
    except _Unparseable as exc:
        raise ValueError(str(exc)) from None


def _scan(text: str, i: int, *, inside: bool) -> tuple[list[str], int]:
    """Split ``text`` from ``i`` into simple-command segments.

    With ``inside`` we are in ``$(``/``<(``: stop after the matching ``)``. Commands found
    in substitutions are appended before the command that contains them.
    """
    segments: list[str] = []
    buf: list[str] = []
    heredocs: list[tuple[str, bool, bool]] = []
    depth = 0
    n = len(text)
    in_case_pattern = False  # after `case … in` or `;;`: `|` joins patterns, `)` ends them

    def flush() -> None:
        nonlocal in_case_pattern
        segment = "".join(buf).strip()
        if segment:
            segments.append(segment)
            in_case_pattern = segment.split(None, 1)[0] == "case"
        buf.clear()

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            if nxt == "\n":
                i += 2
                continue
            buf.append(text[i : i + 2])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise _Unparseable("a single quote is never closed")
            buf.append(text[i : end + 1])
            i = end + 1
        elif c == '"':
            i, word, inner = _substitutions(text, i + 1, closing_quote=True)
            segments.extend(inner)
            buf.append(f'"{word}"')
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _skip_arithmetic(text, i + 1)
                buf.append("0")
            else:
                inner, i = _scan(text, i + 2, inside=True)
                segments.extend(inner)
                buf.append(_SUBST)
        elif c == "$" and nxt == "{":
            end = _closing_brace(text, i + 1)
            buf.append(text[i:end])
            i = end
        elif c in "<>" and nxt == "(":
            inner, i = _scan(text, i + 2, inside=True)
            segments.extend(inner)
            buf.append(_SUBST)
        elif c == "`":
            i, inner = _backticks(text, i + 1)
            segments.extend(inner)
            buf.append(_SUBST)
        elif c == "#" and (not buf or buf[-1][-1:] in (" ", "\t")):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c == "\n":
            flush()
            i = _heredoc_bodies(text, i + 1, heredocs, segments)
            heredocs.clear()
        elif c in "<>" or (c == "&" and nxt == ">"):
            i = _redirection(text, i, buf, heredocs)
        elif c == "|" and nxt != "|" and (
            in_case_pattern or "".join(buf).lstrip().startswith("case ")
        ):
            buf.append(" ")  # `a|b)` inside a case: one pattern, not a pipe
            i += 1
        elif c in ";&|":
            flush()
            start = i
            while i < n and text[i] in ";&|":
                i += 1
            if text[start:i] in (";;", ";&", ";;&"):
                in_case_pattern = True
        elif c == "(":
            flush()
            depth += 1
            i += 1
        elif c == ")":
            i += 1
            if inside and depth == 0:
                flush()
                return segments, i
            if depth == 0:
                buf.clear()  # an unbalanced `)` ends a `case` pattern: the words are not a command
                in_case_pattern = False
            else:
                flush()
                depth -= 1
        else:
            buf.append(c)
            i += 1
    if inside:
        raise _Unparseable("a `$(` or `<(` is never closed")
    if depth:
        raise _Unparseable("a `(` is never closed")
    flush()
    return segments, i


def _redirection(text: str, i: int, buf: list[str], heredocs: list[tuple[str, bool, bool]]) -> int:
    """Turn the redirection at ``i`` into its own marked word; return the next index."""
    op = next(o for o in _REDIRECT_OPERATORS if text.startswith(o, i))
    # A file-descriptor number written right before the operator (``2>``) belongs to it.
    current = "".join(buf)
    stripped = current.rstrip("0123456789")
    if stripped != current and (not stripped or stripped[-1] in " \t"):
        buf.clear()
        buf.append(stripped)
    i += len(op)
    if op in ("<<", "<<-"):
        i, delimiter, expand = _heredoc_word(text, i)
        heredocs.append((delimiter, op == "<<-", expand))
        buf.append(f" {_OP}{op} {shlex.quote(delimiter)} ")
        return i
    buf.append(f" {_OP}{op} ")
    return i


def _heredoc_word(text: str, i: int) -> tuple[int, str, bool]:
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    word: list[str] = []
    quoted = False
    while i < n and text[i] not in _WORD_BREAK:
        c = text[i]
        if c in "'\"":
            end = text.find(c, i + 1)
            if end < 0:
                raise _Unparseable("a heredoc delimiter's quote is never closed")
            word.append(text[i + 1 : end])
            quoted = True
            i = end + 1
        elif c == "\\" and i + 1 < n:
            word.append(text[i + 1])
            quoted = True
            i += 2
        else:
            word.append(c)
            i += 1
    if not word:
        raise _Unparseable("a heredoc `<<` has no delimiter word")
    return i, "".join(word), not quoted


def _heredoc_bodies(
    text: str, i: int, heredocs: list[tuple[str, bool, bool]], segments: list[str]
) -> int:
    """Skip the bodies of pending heredocs; an unquoted body still runs its ``$(...)``."""
    n = len(text)
    for delimiter, strip_tabs, expand in heredocs:
        start = i
        body_end = n
        while i < n:
            newline = text.find("\n", i)
            line_end = n if newline < 0 else newline
            line = text[i:line_end]
            if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                body_end = i
                i = line_end + 1 if newline >= 0 else n
                break
            i = line_end + 1 if newline >= 0 else n
        if expand:
            body = text[start:body_end]
            _, _, inner = _substitutions(body, 0, closing_quote=False)
            segments.extend(inner)
    return i


def _substitutions(text: str, i: int, *, closing_quote: bool) -> tuple[int, str, list[str]]:
    """Scan double-quoted text (or a heredoc body) for ``$(...)`` and backticks.

    Returns (index after the closing quote, the text with substitutions replaced,
    the commands found inside them).
    """
    out: list[str] = []
    found: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\\":
            out.append(text[i : i + 2])
            i += 2
        elif c == '"' and closing_quote:
            return i + 1, "".join(out), found
        elif c == "$" and nxt == "(":
            if text.startswith("$((", i):
                i = _skip_arithmetic(text, i + 1)
                out.append("0")
            else:
                inner, i = _scan(text, i + 2, inside=True)
                found.extend(inner)
                out.append(_SUBST)
        elif c == "`":
            i, inner = _backticks(text, i + 1)
            found.extend(inner)
            out.append(_SUBST)
        else:
            out.append(c)
            i += 1
    if closing_quote:
        raise _Unparseable("a double quote is never closed")
    return i, "".join(out), found


def _backticks(text: str, i: int) -> tuple[int, list[str]]:
    inner: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "`$\\":
            inner.append(text[i + 1])
            i += 2
        elif c == "`":
            segments, _ = _scan("".join(inner), 0, inside=False)
            return i + 1, segments
        else:
            inner.append(c)
            i += 1
    raise _Unparseable("a backtick is never closed")


def _past_matching(text: str, i: int, opening: str, closing: str, what: str) -> int:
    """Index just past the ``closing`` that balances the ``opening`` at or after ``i``."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == opening:
            depth += 1
        elif text[j] == closing:
            depth -= 1
            if depth == 0:
                return j + 1
    raise _Unparseable(f"a `{what}` is never closed")


def _skip_arithmetic(text: str, i: int) -> int:
    return _past_matching(text, i, "(", ")", "$((")


def _closing_brace(text: str, i: int) -> int:
    return _past_matching(text, i, "{", "}", "${")


def _words(segment: str) -> ShellCommand:
    lexer = shlex.shlex(segment, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        words = list(lexer)
    except ValueError as exc:
        raise _Unparseable(str(exc)) from None
    command = ShellCommand(argv=[])
    k = 0
    while k < len(words):
        word = words[k]
        if word.startswith(_OP):
            op = word[1:]
            if command.argv[:1] == ["[["]:  # `[[ a > b ]]` compares, it does not redirect
                command.argv.append(op)
                k += 1
                continue
            if k + 1 >= len(words) or words[k + 1].startswith(_OP):
                raise _Unparseable(f"the redirection `{op}` has no target")
            command.redirects.append((op, words[k + 1]))
            k += 2
            continue
        command.argv.append(word)
        k += 1
    return command


# --------------------------------------------------------------------------- shell policy

_MAX_DEPTH = 8


@dataclass
class _ShellState:
    cwd: str | None


def check_shell(script: str, agent: _Agent, cwd: str | None, depth: int = 0) -> str | None:
    """Why ``script`` is refused for ``agent``, or None when it may run."""
    if depth > _MAX_DEPTH:
        return "this command nests shells or substitutions too deeply to check; simplify it."
    try:
        segments, _ = _scan(script, 0, inside=False)
        commands = [_words(segment) for segment in segments]
    except _Unparseable as exc:
        return (
            f"ov guard could not parse this shell command ({exc}), so it cannot check it. "
            "Split it into simpler commands."
        )
    state = _ShellState(cwd)
    for command in commands:
        reason = _check_command(command, agent, state, depth)
        if reason:
            return reason
    return None


_KEYWORDS = frozenset(
    {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}", "esac"}
)
_HEADERS = frozenset({"for", "select", "case", "function"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\[[^\]]*\])?\+?=")


def _check_command(
    command: ShellCommand, agent: _Agent, state: _ShellState, depth: int
) -> str | None:
    for op, target in command.redirects:
        writes = op in _WRITE_REDIRECTS or (
            op == ">&" and not (target.isdigit() or target == "-")
        )
        if not writes:
            continue
        if not agent.writable:
            if target in _NULL_SINKS or target.startswith("/dev/fd/"):
                continue
            return agent.read_only(
                f"redirect output into a file (`{op} {target}`); only `>/dev/null`, "
                "`2>/dev/null` and `2>&1` are allowed"
            )
        reason = agent.write_denial(target, state.cwd)
        if reason:
            return reason
    argv = list(command.argv)
    while argv and argv[0] in _KEYWORDS:
        argv.pop(0)
    if argv and argv[0] in _HEADERS:
        return None
    assignments: dict[str, str] = {}
    while argv and _ASSIGNMENT.match(argv[0]):
        key, _, value = argv.pop(0).partition("=")
        assignments[key.rstrip("+")] = value
    if not argv:
        return None
    return _check_argv(argv, agent, state, depth, assignments)


def _check_argv(
    argv: list[str],
    agent: _Agent,
    state: _ShellState,
    depth: int,
    assignments: Mapping[str, str] | None = None,
) -> str | None:
    if depth > _MAX_DEPTH:
        return "this command nests wrappers too deeply to check; simplify it."
    program = argv[0]
    if _SUBST in program or program.startswith("$") or "`" in program:
        if agent.writable:
            return None
        return agent.read_only(f"run a command whose name is computed at run time (`{program}`)")
    name = os.path.basename(program)
    if name in ("cd", "pushd"):
        _change_dir(argv, agent, state)
        return None
    if name == "popd":
        state.cwd = None
        return None

    effect = _analyze(name, argv, agent, state, assignments or {})
    if effect.kind == "deny":
        return effect.reason

    inner_state = state
    if effect.chdir is not None:
        inner_state = _ShellState(agent.expand(effect.chdir, state.cwd))
    for inner in effect.inner:
        if inner:
            reason = _check_argv(inner, agent, _ShellState(inner_state.cwd), depth + 1)
            if reason:
                return reason
    for script in effect.scripts:
        reason = check_shell(script, agent, inner_state.cwd, depth + 1)
        if reason:
            return reason

    if not agent.writable:
        if effect.kind in ("read", "test"):
            return None
        if effect.kind in ("write", "install"):
            return agent.read_only(effect.what or f"run `{name}`, which writes files")
        if effect.kind == "code":
            return agent.read_only(
                f"run {effect.what or name}: code that cannot be checked for writes"
            )
        return agent.read_only(
            f"run `{name}`, which is not on its list of read-only commands (cat, ls, grep, rg, "
            "find, head, tail, wc, git status/log/diff/show, ov, pytest …)"
        )

    if effect.kind == "install":
        return (
            f"{agent.who} may not install packages outside its worktree: {effect.what}. Use a "
            f"virtualenv or local node_modules inside {agent.worktree}, or ask your parent "
            "with `ov mail send`."
        )
    for target in effect.targets:
        reason = agent.write_denial(target, inner_state.cwd, removes=effect.removes)
        if reason:
            return reason
    if effect.writes_cwd and inner_state.cwd is not None:
        reason = agent.write_denial(inner_state.cwd, None)
        if reason:
            return reason
    if effect.kind in ("unknown", "code"):
        return agent.protected_zone_denial(argv[1:], state.cwd)
    return None


def _change_dir(argv: list[str], agent: _Agent, state: _ShellState) -> None:
    args = [a for a in argv[1:] if not (a.startswith("-") and a != "-")]
    if not args:
        home = agent.env.get("HOME")
        state.cwd = _real(home) if home else None
    elif args[0] == "-":
        state.cwd = None
    else:
        state.cwd = agent.expand(args[0], state.cwd)


# --------------------------------------------------------------------------- command effects


@dataclass
class _Effect:
    """What one simple command does, as far as the policy cares.

    kind: read | test (test runners/linters) | write | code (unknowable code) | install
          (global package install) | unknown | deny (refused for everyone, see reason).
    """

    kind: str
    what: str = ""
    targets: list[str] = field(default_factory=list)
    writes_cwd: bool = False
    removes: bool = False
    inner: list[list[str]] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    chdir: str | None = None
    reason: str = ""


_READ = _Effect("read")

_Handler = Callable[[list[str], _Agent, _ShellState, Mapping[str, str]], _Effect]


def _analyze(
    name: str, argv: list[str], agent: _Agent, state: _ShellState, assignments: Mapping[str, str]
) -> _Effect:
    if name in _READ_COMMANDS:
        return _READ
    handler = _HANDLERS.get(name)
    if handler is not None:
        return handler(argv, agent, state, assignments)
    if _PYTHON_RE.match(name):
        return _python(argv, agent, state, assignments)
    if _PIP_RE.match(name):
        return _pip(argv, agent, state, assignments)
    if name in _INTERPRETERS:
        if all(a in _VERSION_FLAGS for a in argv[1:]) and argv[1:]:
            return _READ
        return _Effect("code", what=f"`{name}`")
    return _Effect("unknown")


def _parse_options(
    args: list[str], with_value: Iterable[str] = (), *, stop_at_positional: bool = False
) -> tuple[list[tuple[str, str | None]], list[str]]:
    """Split command arguments into options ``(name, value)`` and positionals."""
    takes_value = set(with_value)
    options: list[tuple[str, str | None]] = []
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positionals.extend(args[i + 1 :])
            break
        if arg == "-" or not arg.startswith("-"):
            if stop_at_positional:
                positionals.extend(args[i:])
                break
            positionals.append(arg)
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            if eq:
                options.append((key, value))
            elif key in takes_value and i + 1 < len(args):
                options.append((key, args[i + 1]))
                i += 1
            else:
                options.append((key, None))
        else:
            j = 1
            while j < len(arg):
                flag = "-" + arg[j]
                if flag in takes_value:
                    attached = arg[j + 1 :]
                    if attached:
                        options.append((flag, attached))
                    elif i + 1 < len(args):
                        options.append((flag, args[i + 1]))
                        i += 1
                    else:
                        options.append((flag, None))
                    break
                options.append((flag, None))
                j += 1
        i += 1
    return options, positionals


def _names(options: list[tuple[str, str | None]]) -> set[str]:
    return {key for key, _ in options}


def _values(options: list[tuple[str, str | None]], *keys: str) -> list[str]:
    return [value for key, value in options if key in keys and value is not None]


_VERSION_FLAGS = frozenset({"--version", "-V", "-v", "version", "--help", "-h", "help"})

_READ_COMMANDS = frozenset(
    """
    cat ls ll dir vdir grep egrep fgrep rg ag ack head tail wc echo printf pwd which whereis
    type file stat du df diff cmp comm cut tr nl od hexdump strings basename dirname
    realpath readlink jq column fold fmt paste join expand unexpand rev tac seq whoami id
    groups uname true false test [ [[ ]] sleep md5sum sha1sum sha224sum sha256sum sha384sum
    sha512sum b2sum cksum sum base32 base64 less more ps pgrep pidof lsof free uptime nproc
    printenv locale getconf arch lscpu cal bc expr yes look numfmt zcat zgrep zless bzcat
    xzcat zstdcat export unset set shopt read wait jobs exit return break continue : let
    local declare typeset readonly alias unalias hash history umask ulimit help man
    tput tty stty clear ov
    """.split()
)

_INTERPRETERS = frozenset(
    "node nodejs deno bun ruby irb php lua luajit Rscript julia java scala kotlin osascript "
    "tclsh wish guile racket ghci runghc swift".split()
)
_PYTHON_RE = re.compile(r"^(python(\d+(\.\d+)?)?|py|pypy3?|ipython3?)$")
_PIP_RE = re.compile(r"^pip(\d+(\.\d+)?)?$")
_SHELLS = frozenset({"bash", "sh", "zsh", "dash", "ksh", "fish", "ash"})


def _tee(argv: list[str], *_: object) -> _Effect:
    options, files = _parse_options(argv[1:], ("--output-error",))
    files = [f for f in files if f not in _NULL_SINKS]
    if not files:
        return _READ
    return _Effect("write", what=f"write files with tee ({' '.join(files)})", targets=files)


def _sort(argv: list[str], *_: object) -> _Effect:
    options, _ = _parse_options(
        argv[1:],
        ("-o", "--output", "-k", "--key", "-t", "--field-separator", "-S", "--buffer-size",
         "-T", "--temporary-directory", "--parallel", "--files0-from", "--batch-size"),
    )
    outputs = _values(options, "-o", "--output")
    if outputs:
        return _Effect("write", what="write a file with `sort -o`", targets=outputs)
    return _READ


def _uniq(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-f", "-s", "-w", "--skip-fields",
                                                     "--skip-chars", "--check-chars"))
    if len(positionals) >= 2:
        return _Effect("write", what="write a file with `uniq IN OUT`", targets=positionals[1:2])
    return _READ


def _output_option(*flags: str, label: str) -> _Handler:
    def handler(argv: list[str], *_: object) -> _Effect:
        options, _ = _parse_options(argv[1:], flags)
        outputs = [o for o in _values(options, *flags) if o != "-"]
        if outputs:
            return _Effect("write", what=f"write a file with `{label}`", targets=outputs)
        return _READ

    return handler


def _xxd(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-c", "-g", "-l", "-s", "-o", "-n", "-C"))
    if len(positionals) >= 2:
        return _Effect("write", what="write a file with `xxd IN OUT`", targets=positionals[1:2])
    return _READ


def _date(argv: list[str], *_: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-d", "--date", "-f", "--file", "-r", "--reference",
                                           "-s", "--set", "-I"))
    if _names(options) & {"-s", "--set"}:
        return _Effect("write", what="set the system clock")
    return _READ


def _hostname(argv: list[str], *_: object) -> _Effect:
    _, positionals = _parse_options(argv[1:])
    return _Effect("write", what="set the host name") if positionals else _READ


_SED_ADDRESS = r"(?:\d+|\$|/(?:[^/\\]|\\.)*/)?(?:\s*,\s*(?:\d+|\$|/(?:[^/\\]|\\.)*/|[+~]\d+))?\s*!?\s*"
_SED_WRITE_COMMAND = re.compile(_SED_ADDRESS + r"[wWe](\s|$)")
_SED_SUBSTITUTE = re.compile(
    _SED_ADDRESS + r"s(.)(?:(?!\1)[^\\]|\\.)*\1(?:(?!\1)[^\\]|\\.)*\1([A-Za-z0-9]*)"
)


def _sed(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(
        argv[1:], ("-e", "--expression", "-f", "--file", "-l", "--line-length")
    )
    scripts = _values(options, "-e", "--expression")
    files = positionals
    if not scripts and not _values(options, "-f", "--file") and positionals:
        scripts, files = positionals[:1], positionals[1:]
    if _names(options) & {"-i", "--in-place"}:
        return _Effect("write", what="edit files in place (`sed -i`)", targets=files)
    if _values(options, "-f", "--file"):
        return _Effect("code", what="a sed script file (it cannot be checked for writes)")
    if any(_sed_script_writes(s) for s in scripts):
        return _Effect("code", what="a sed script with `w`/`e` commands (they write files or run commands)")
    return _READ


def _sed_script_writes(script: str) -> bool:
    """Best effort: does a sed script use `w`, `W` or `e`, or an `s///w`/`s///e` flag?"""
    for piece in re.split(r"[;\n]", script):
        piece = piece.strip().lstrip("{").strip()
        if _SED_WRITE_COMMAND.match(piece):
            return True
        substitute = _SED_SUBSTITUTE.match(piece)
        if substitute and set(substitute.group(2)) & {"w", "e"}:
            return True
    return False


_AWK_WRITES = re.compile(r"system\s*\(|\|\s*getline|\bprintf?\b[^;}]*?(>|\|)")


def _awk(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-F", "-v", "-f", "-i", "--include",
                                                     "--file", "--assign", "--field-separator"))
    if "inplace" in _values(options, "-i", "--include"):
        return _Effect("write", what="edit files in place (`awk -i inplace`)",
                       targets=positionals[1:])
    if _values(options, "-f", "--file"):
        return _Effect("code", what="an awk program file (it cannot be checked for writes)")
    program = positionals[0] if positionals else ""
    if _AWK_WRITES.search(program):
        return _Effect("code", what="an awk program that writes files or runs commands")
    return _READ


def _find(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    roots: list[str] = []
    i = 0
    while i < len(args) and args[i] in ("-H", "-L", "-P", "-O0", "-O1", "-O2", "-O3", "-D"):
        i += 2 if args[i] == "-D" else 1
    while i < len(args) and not args[i].startswith(("-", "(", "!", ")")):
        roots.append(args[i])
        i += 1
    roots = roots or ["."]
    effect = _Effect("read")
    while i < len(args):
        arg = args[i]
        if arg in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(args) and args[end] not in (";", "+"):
                end += 1
            template = args[i + 1 : end]
            for root in roots:
                found = os.path.join(root, "{}")
                effect.inner.append([found if word == "{}" else word for word in template])
            i = end + 1
            continue
        if arg == "-delete":
            effect.kind = "write"
            effect.what = "delete files (`find -delete`)"
            effect.targets.extend(roots)
        elif arg in ("-fprint", "-fprint0", "-fls", "-fprintf") and i + 1 < len(args):
            effect.kind = "write"
            effect.what = f"write a file with `find {arg}`"
            effect.targets.append(args[i + 1])
        i += 1
    return effect


_XARGS_VALUE = ("-I", "-n", "-P", "-L", "-l", "-s", "-d", "-E", "-a", "--arg-file",
                "--delimiter", "--max-args", "--max-procs", "--max-lines", "--replace",
                "--max-chars", "--eof", "--process-slot-var")


def _xargs(argv: list[str], *_: object) -> _Effect:
    _, command = _parse_options(argv[1:], _XARGS_VALUE, stop_at_positional=True)
    return _Effect("read", inner=[command]) if command else _READ


def _targets_all(label: str, value_options: tuple[str, ...] = (), *, removes: bool = False) -> _Handler:
    """A command that writes every positional argument (rm, touch, mkdir …)."""

    def handler(argv: list[str], *_: object) -> _Effect:
        _, positionals = _parse_options(argv[1:], value_options)
        return _Effect("write", what=label, targets=positionals, removes=removes)

    return handler


_MODE_RE = re.compile(r"^([ugoa]*[-+=][rwxXstugo]*,?)+$|^[0-7]{3,4}$|^-[rwxXst]+$")


def _chmod_like(label: str, *, has_mode: bool) -> _Handler:
    """chmod/chown/chgrp: the first positional (mode, owner) is not a file."""

    def handler(argv: list[str], *_: object) -> _Effect:
        options, positionals = _parse_options(argv[1:], ("--reference", "--from"))
        if not _values(options, "--reference"):
            modes = [a for a in argv[1:] if has_mode and _MODE_RE.match(a)]
            if modes:  # `chmod -x f` parses the mode as an option
                positionals = [p for p in positionals if p not in modes]
            else:
                positionals = positionals[1:]
        return _Effect("write", what=label, targets=positionals)

    return handler


def _copy_like(label: str, value_options: tuple[str, ...] = (), *, moves: bool = False,
               one_means_cwd: bool = False) -> _Handler:
    """cp, mv, ln, install, rsync: the destination is written; mv also removes its sources."""

    def handler(argv: list[str], *_: object) -> _Effect:
        options, positionals = _parse_options(
            argv[1:], ("-t", "--target-directory", "-S", "--suffix", *value_options)
        )
        directory = _values(options, "-t", "--target-directory")
        if directory:
            targets = directory + (positionals if moves else [])
        elif len(positionals) >= 2:
            targets = positionals if moves else positionals[-1:]
        else:
            targets = ["."] if positionals and one_means_cwd else positionals
        targets = [t for t in targets if not _REMOTE_PATH.match(t)]
        return _Effect("write", what=label, targets=targets, removes=moves)

    return handler


_REMOTE_PATH = re.compile(r"^([\w.-]+@)?[\w.-]+:")


def _dd(argv: list[str], *_: object) -> _Effect:
    outputs = [a[3:] for a in argv[1:] if a.startswith("of=")]
    return _Effect("write", what="write a file with dd", targets=outputs) if outputs else _READ


def _truncate(argv: list[str], *_: object) -> _Effect:
    _, positionals = _parse_options(argv[1:], ("-s", "--size", "-r", "--reference"))
    return _Effect("write", what="truncate files", targets=positionals)


def _patch(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(
        argv[1:], ("-d", "--directory", "-o", "--output", "-i", "--input", "-p", "--strip",
                   "-B", "--prefix", "-r", "--reject-file", "-z", "--suffix", "-F", "--fuzz")
    )
    outputs = _values(options, "-o", "--output")
    directory = _values(options, "-d", "--directory")
    if "--dry-run" in _names(options):
        return _READ
    return _Effect("write", what="patch files", targets=outputs or positionals[:1],
                   writes_cwd=not (outputs or positionals), chdir=directory[0] if directory else None)


def _tar(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    if args and not args[0].startswith("-"):
        args = ["-" + args[0]] + args[1:]  # `tar xzf a.tgz`
    options, _ = _parse_options(args, ("-f", "--file", "-C", "--directory", "-T",
                                       "--files-from", "-X", "--exclude-from", "-b", "-H",
                                       "--format", "-I", "--use-compress-program"))
    names = _names(options)
    archive = _values(options, "-f", "--file")
    directory = _values(options, "-C", "--directory")
    if names & {"-c", "--create", "-r", "--append", "-u", "--update", "-A", "--concatenate",
                "--delete"}:
        return _Effect("write", what="write an archive with tar", targets=archive,
                       writes_cwd=not archive)
    if names & {"-x", "--extract", "--get"}:
        if names & {"-O", "--to-stdout"}:
            return _READ
        return _Effect("write", what="extract files with tar", targets=directory,
                       writes_cwd=not directory)
    return _READ


def _unzip(argv: list[str], *_: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-d", "-x"))
    if _names(options) & {"-l", "-t", "-v", "-Z", "-p", "-c", "-z"}:
        return _READ
    directory = _values(options, "-d")
    return _Effect("write", what="extract files with unzip", targets=directory,
                   writes_cwd=not directory)


def _compressor(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-S", "--suffix", "-T", "--threads"))
    if _names(options) & {"-c", "--stdout", "--to-stdout", "-l", "--list", "-t", "--test",
                          "-h", "--help", "-V", "--version"} or not positionals:
        return _READ
    return _Effect("write", what=f"replace files with {os.path.basename(argv[0])}",
                   targets=positionals)


def _curl(argv: list[str], *_: object) -> _Effect:
    options, _ = _parse_options(
        argv[1:], ("-o", "--output", "-D", "--dump-header", "-c", "--cookie-jar",
                   "--output-dir", "-H", "--header", "-d", "--data", "-X", "--request",
                   "-u", "--user", "-A", "--user-agent", "-e", "--referer", "-b", "--cookie",
                   "-F", "--form", "-T", "--upload-file", "-m", "--max-time", "-w",
                   "--write-out", "-x", "--proxy", "--data-raw", "--data-binary",
                   "--connect-timeout", "-K", "--config", "--retry", "-r", "--range")
    )
    targets = [o for o in _values(options, "-o", "--output", "-D", "--dump-header", "-c",
                                  "--cookie-jar", "--output-dir") if o != "-"]
    remote_name = bool(_names(options) & {"-O", "--remote-name", "--remote-name-all", "-J"})
    if targets or remote_name:
        return _Effect("write", what="download into a file with curl", targets=targets,
                       writes_cwd=remote_name and not _values(options, "--output-dir"))
    return _READ


def _wget(argv: list[str], *_: object) -> _Effect:
    options, _ = _parse_options(argv[1:], ("-O", "--output-document", "-P",
                                           "--directory-prefix", "-o", "--output-file",
                                           "-a", "--append-output", "-U", "--user-agent",
                                           "-T", "--timeout", "-t", "--tries"))
    if "--spider" in _names(options):
        return _READ
    documents = _values(options, "-O", "--output-document")
    if documents and all(d in ("-", "/dev/null") for d in documents):
        return _READ
    targets = [d for d in documents if d != "-"] + _values(options, "-P", "--directory-prefix")
    targets += _values(options, "-o", "--output-file", "-a", "--append-output")
    return _Effect("write", what="download into a file with wget", targets=targets,
                   writes_cwd=not documents and not _values(options, "-P", "--directory-prefix"))


def _yq(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-o", "--output-format", "-p",
                                                     "--input-format", "--indent"))
    if _names(options) & {"-i", "--inplace"}:
        return _Effect("write", what="edit files in place (`yq -i`)", targets=positionals[1:])
    return _READ


def _perl(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    if args and all(a in _VERSION_FLAGS for a in args):
        return _READ
    in_place = code_given = False
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            positionals.extend(args[i + 1 :])
            break
        if arg.startswith("-") and len(arg) > 1 and not arg.startswith("--"):
            cluster = arg[1:]
            for j, flag in enumerate(cluster):
                if flag == "i":  # the rest of the cluster is a backup suffix
                    in_place = True
                    break
                if flag in "eE":
                    code_given = True
                    if not cluster[j + 1 :]:
                        i += 1  # the code is the next argument
                    break
                if flag in "IMmxlo0":
                    break  # value attached to the flag
        else:
            positionals.append(arg)
        i += 1
    if in_place:
        files = positionals if code_given else positionals[1:]
        return _Effect("write", what="edit files in place (`perl -i`)", targets=files)
    return _Effect("code", what="`perl` code")


def _shell(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    if len(args) == 1 and args[0] in _VERSION_FLAGS:
        return _READ
    flags = ""
    i = 0
    while i < len(args) and args[i].startswith(("-", "+")) and args[i] not in ("-", "--"):
        arg = args[i]
        if arg in ("-o", "+o", "-O", "+O", "--rcfile", "--init-file"):
            i += 2
            continue
        if not arg.startswith("--"):
            flags += arg[1:]
        i += 1
    rest = args[i:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if "c" in flags:
        return _Effect("read", scripts=rest[:1]) if rest else _READ
    if "n" in flags:
        return _READ  # syntax check only
    return _Effect("code", what=f"a shell script with `{os.path.basename(argv[0])}`")


def _trap(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:])
    if _names(options) & {"-p", "-l"} or len(positionals) < 2:
        return _READ
    return _Effect("read", scripts=positionals[:1])


def _ripgrep(argv: list[str], *_: object) -> _Effect:
    if any(a.startswith("--pre") and not a.startswith("--pre-glob") for a in argv[1:]):
        return _Effect("code", what="`rg --pre` (it runs a preprocessor program)")
    return _READ


def _split(argv: list[str], *_: object) -> _Effect:
    return _Effect("write", what=f"write files with {argv[0]}", writes_cwd=True)


def _eval(argv: list[str], *_: object) -> _Effect:
    return _Effect("read", scripts=[" ".join(argv[1:])]) if argv[1:] else _READ


def _exec(argv: list[str], *_: object) -> _Effect:
    _, rest = _parse_options(argv[1:], ("-a",), stop_at_positional=True)
    return _Effect("read", inner=[rest]) if rest else _READ


def _source(argv: list[str], *_: object) -> _Effect:
    return _Effect("code", what="`source`, which runs a script")


def _privileged(argv: list[str], agent: _Agent, *_: object) -> _Effect:
    return _Effect("deny", reason=f"{agent.who} may not use `{os.path.basename(argv[0])}`: "
                   "agents run unprivileged. Ask your parent with `ov mail send`.")


# ---- wrappers that run another command


def _wrapper(with_value: tuple[str, ...] = (), *, leading_positionals: int = 0) -> _Handler:
    def handler(argv: list[str], *_: object) -> _Effect:
        _, rest = _parse_options(argv[1:], with_value, stop_at_positional=True)
        rest = rest[leading_positionals:]
        return _Effect("read", inner=[rest]) if rest else _READ

    return handler


def _nice(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    if args and re.match(r"^-\d+$", args[0]):
        args = args[1:]
    _, rest = _parse_options(args, ("-n", "--adjustment"), stop_at_positional=True)
    return _Effect("read", inner=[rest]) if rest else _READ


def _env(argv: list[str], *_: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-u", "--unset", "-C", "--chdir", "-S",
                                              "--split-string"), stop_at_positional=True)
    while rest and _ASSIGNMENT.match(rest[0]):
        rest = rest[1:]
    chdir = _values(options, "-C", "--chdir")
    split = _values(options, "-S", "--split-string")
    scripts = [" ".join(split + rest)] if split else []
    inner = [] if split else [rest]
    if not rest and not split:
        return _READ
    return _Effect("read", inner=inner, scripts=scripts, chdir=chdir[0] if chdir else None)


def _command(argv: list[str], *_: object) -> _Effect:
    options, rest = _parse_options(argv[1:], (), stop_at_positional=True)
    if _names(options) & {"-v", "-V"} or not rest:
        return _READ
    return _Effect("read", inner=[rest])


def _watch(argv: list[str], *_: object) -> _Effect:
    options, rest = _parse_options(argv[1:], ("-n", "--interval", "-q", "--equexit"),
                                   stop_at_positional=True)
    if not rest:
        return _READ
    if _names(options) & {"-x", "--exec"}:
        return _Effect("read", inner=[rest])
    return _Effect("read", scripts=[" ".join(rest)])


# ---- test runners, linters, build tools

_REPORT_FILE_OPTIONS = ("--junitxml", "--junit-xml", "--junit-prefix", "--result-log",
                        "--report-log", "--html", "--json-report-file", "--resultlog")


def _pytest(argv: list[str], *_: object) -> _Effect:
    return _test_args(argv[1:], "pytest")


def _test_args(args: list[str], label: str) -> _Effect:
    if any(a.split("=", 1)[0] in _REPORT_FILE_OPTIONS for a in args):
        return _Effect("write", what=f"write a report file with {label}")
    return _Effect("test", what=label)


def _fixable(check_flags: frozenset[str], fix_flags: frozenset[str] = frozenset()) -> _Handler:
    """Formatters/linters: read-only with a check flag and without a fix flag."""

    def handler(argv: list[str], *_: object) -> _Effect:
        args = set(a.split("=", 1)[0] for a in argv[1:])
        if not check_flags or args & check_flags:
            if not args & fix_flags:
                return _Effect("test", what=argv[0])
        paths = [a for a in argv[1:] if not a.startswith("-")]
        return _Effect("write", what=f"rewrite files with `{os.path.basename(argv[0])}`",
                       targets=paths, writes_cwd=not paths)

    return handler


def _ruff(argv: list[str], *_: object) -> _Effect:
    args = argv[1:]
    fix = {"--fix", "--unsafe-fixes", "--add-noqa", "--fix-only"}
    sub = next((a for a in args if not a.startswith("-")), "check")
    if any(a in _VERSION_FLAGS for a in args) or sub in ("version", "rule", "config", "linter",
                                                        "help"):
        return _READ
    if sub == "check" and not fix & {a.split("=", 1)[0] for a in args}:
        return _Effect("test", what="ruff check")
    if sub == "format" and {"--check", "--diff"} & set(args):
        return _Effect("test", what="ruff format --check")
    return _Effect("write", what=f"rewrite files with `ruff {sub}`", writes_cwd=True)


def _tsc(argv: list[str], *_: object) -> _Effect:
    if {"--noEmit", "--version", "-v", "--help", "-h"} & set(argv[1:]):
        return _Effect("test", what="tsc --noEmit")
    return _Effect("write", what="emit compiled files with `tsc`", writes_cwd=True)


def _make(argv: list[str], *_: object) -> _Effect:
    options, positionals = _parse_options(argv[1:], ("-C", "--directory", "-f", "--file",
                                                     "--makefile", "-j", "--jobs", "-l",
                                                     "-o", "-W", "-I"))
    names = _names(options)
    directory = _values(options, "-C", "--directory")
    if names & {"-n", "--dry-run", "--just-print", "-q", "--question", "-p",
                "--print-data-base", "--version", "-v", "-h", "--help"}:
        return _READ
    goals = [p for p in positionals if "=" not in p]
    if goals and all(g in ("test", "tests", "check", "lint", "typecheck") for g in goals):
        return _Effect("test", what=f"make {' '.join(goals)}")
    return _Effect("unknown", what="make", writes_cwd=True,
                   chdir=directory[0] if directory else None)


# ---- package managers

_PIP_READ = frozenset({"list", "show", "freeze", "check", "help", "index", "inspect", "debug",
                       "search", "hash", "cache"})
_NODE_READ = frozenset({"ls", "list", "ll", "la", "view", "v", "info", "show", "outdated",
                        "why", "explain", "help", "search", "root", "prefix", "bin", "doctor",
                        "whoami", "licenses"})
_NODE_TEST = frozenset({"test", "t", "tst"})
_NODE_INSTALL = frozenset({"install", "i", "in", "ci", "add", "uninstall", "remove", "rm", "r",
                           "un", "update", "up", "upgrade", "link", "ln", "unlink", "global",
                           "dedupe", "prune", "rebuild"})
_SYSTEM_PACKAGE_READ = frozenset({"list", "show", "search", "policy", "info", "depends",
                                  "rdepends", "madison", "showpkg", "--version", "-v",
                                  "help", "outdated", "deps", "desc", "leaves", "query"})


def _first_word(args: list[str]) -> tuple[str, list[str]]:
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            return arg, args[i + 1 :]
    return "", []


def _pip(argv: list[str], agent: _Agent, state: _ShellState, _a: Mapping[str, str]) -> _Effect:
    return _pip_args(argv[0], argv[1:], agent, state)


def _pip_args(program: str, args: list[str], agent: _Agent, state: _ShellState) -> _Effect:
    sub, rest = _first_word(args)
    if not sub or sub in _PIP_READ or any(a in _VERSION_FLAGS for a in args[:1]):
        return _READ
    if sub not in ("install", "uninstall", "download", "wheel"):
        return _Effect("unknown", what=f"pip {sub}")
    options, _ = _parse_options(rest, ("-t", "--target", "--prefix", "--root", "-d", "--dest",
                                       "-w", "--wheel-dir", "-r", "--requirement", "-c",
                                       "--constraint", "-e", "--editable", "-i", "--index-url",
                                       "--extra-index-url", "-f", "--find-links"))
    if sub in ("download", "wheel"):
        dest = _values(options, "-d", "--dest", "-w", "--wheel-dir")
        return _Effect("write", what=f"pip {sub}", targets=dest, writes_cwd=not dest)
    local = _values(options, "-t", "--target", "--prefix", "--root")
    if "--user" not in _names(options) and agent.worktree:
        places = local + [agent.env.get("VIRTUAL_ENV", "")]
        if "/" in program:
            places.append(program)
        for place in places:
            path = agent.expand(place, state.cwd) if place else None
            if path and _inside(path, agent.worktree):
                return _Effect("write", what=f"pip {sub}", targets=[place])
    return _Effect("install", what=f"`pip {sub}` writes to the shared Python environment")


def _node_pm(argv: list[str], *_: object) -> _Effect:
    tool = os.path.basename(argv[0])
    args = argv[1:]
    sub, rest = _first_word(args)
    if not sub:
        if tool == "yarn":  # bare `yarn` installs
            return _Effect("write", what="yarn install", writes_cwd=True)
        return _READ
    if any(a in _VERSION_FLAGS for a in args[:1]) or sub in _NODE_READ:
        return _READ
    if sub in _NODE_TEST or (sub == "run" and rest[:1] and rest[0] in ("test", "lint",
                                                                         "typecheck")):
        return _Effect("test", what=f"{tool} {sub}")
    if sub in _NODE_INSTALL:
        if sub == "global" or {"-g", "--global", "--location=global"} & set(args):
            shown = f"{tool} global" if sub == "global" else f"{tool} {sub} -g"
            return _Effect("install", what=f"`{shown}` installs globally")
        return _Effect("write", what=f"{tool} {sub}", writes_cwd=True)
    return _Effect("unknown", what=f"{tool} {sub}", writes_cwd=True)


def _cargo(argv: list[str], *_: object) -> _Effect:
    sub, _ = _first_word(argv[1:])
    if not sub or sub in ("tree", "metadata", "version", "help", "search", "locate-project",
                          "pkgid", "verify-project") or argv[1:2] == ["--version"]:
        return _READ
    if sub in ("test", "t", "check", "c", "clippy", "bench", "fmt") and (
        sub != "fmt" or "--check" in argv
    ):
        return _Effect("test", what=f"cargo {sub}")
    if sub in ("install", "uninstall"):
        return _Effect("install", what=f"`cargo {sub}` writes to ~/.cargo")
    return _Effect("unknown", what=f"cargo {sub}", writes_cwd=True)


def _go(argv: list[str], *_: object) -> _Effect:
    sub, rest = _first_word(argv[1:])
    if sub in ("version", "list", "doc", "help") or (sub == "env" and "-w" not in rest):
        return _READ
    if sub in ("test", "vet"):
        return _Effect("test", what=f"go {sub}")
    if sub == "install":
        return _Effect("install", what="`go install` writes to GOPATH/bin")
    return _Effect("unknown", what=f"go {sub}", writes_cwd=True)


def _system_packages(argv: list[str], *_: object) -> _Effect:
    tool = os.path.basename(argv[0])
    sub, _ = _first_word(argv[1:])
    if tool in ("apt-cache", "dpkg-query", "rpm") or not sub or sub in _SYSTEM_PACKAGE_READ:
        return _READ
    return _Effect("install", what=f"`{tool} {sub}` changes the system's packages")


def _global_installer(argv: list[str], *_: object) -> _Effect:
    tool = os.path.basename(argv[0])
    sub, _ = _first_word(argv[1:])
    if not sub or sub in ("list", "info", "search", "help", "environment", "show", "query"):
        return _READ
    if argv[1:2] and argv[1] in _VERSION_FLAGS:
        return _READ
    return _Effect("install", what=f"`{tool} {sub}` installs outside the worktree")


def _uv(argv: list[str], agent: _Agent, state: _ShellState, _a: Mapping[str, str]) -> _Effect:
    sub, rest = _first_word(argv[1:])
    if not sub or sub in ("tree", "version", "help") or argv[1:2] == ["--version"]:
        return _READ
    if sub == "pip":
        inner, inner_rest = _first_word(rest)
        if inner in _PIP_READ or not inner:
            return _READ
        if "--system" in rest:
            return _Effect("install", what=f"`uv pip {inner} --system` writes to the system")
        return _Effect("write", what=f"uv pip {inner}", writes_cwd=True)
    if sub == "tool":
        inner, _ = _first_word(rest)
        if inner in ("list", "dir"):
            return _READ
        if inner == "run":
            return _Effect("code", what="`uv tool run`")
        return _Effect("install", what=f"`uv tool {inner}` installs outside the worktree")
    if sub == "run":
        return _python_like_run(rest, agent, state, "uv run")
    return _Effect("write" if sub in ("add", "remove", "sync", "lock", "venv", "init") else
                   "unknown", what=f"uv {sub}", writes_cwd=True)


def _python_like_run(rest: list[str], agent: _Agent, state: _ShellState, label: str) -> _Effect:
    _, command = _parse_options(rest, ("--with", "--python", "-p", "--project", "--directory",
                                       "--extra", "--group"), stop_at_positional=True)
    if not command:
        return _Effect("code", what=f"`{label}`")
    return _Effect("read", inner=[command])


# ---- python


def _python(argv: list[str], agent: _Agent, state: _ShellState, _a: Mapping[str, str]) -> _Effect:
    args = argv[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("--version", "-V", "-VV", "--help", "-h"):
            return _READ
        if arg == "-" or not arg.startswith("-"):
            return _Effect("code", what=f"a Python script (`{arg}`)")
        if not arg.startswith("--"):
            cluster = arg[1:]
            for j, flag in enumerate(cluster):
                if flag == "c":
                    return _Effect("code", what="`python -c` (inline code)")
                if flag == "m":
                    attached = cluster[j + 1 :]
                    if attached:
                        return _python_module(attached, args[i + 1 :], argv[0], agent, state)
                    module = args[i + 1] if i + 1 < len(args) else ""
                    return _python_module(module, args[i + 2 :], argv[0], agent, state)
                if flag in "WX":
                    if not cluster[j + 1 :]:
                        i += 1
                    break
        i += 1
    return _Effect("code", what="Python reading code from stdin")


def _python_module(
    module: str, rest: list[str], program: str, agent: _Agent, state: _ShellState
) -> _Effect:
    if module in ("pytest", "unittest", "doctest"):
        return _test_args(rest, f"python -m {module}")
    if module == "pip":
        return _pip_args(program, rest, agent, state)
    if module in ("overstory",):
        return _READ
    if module == "json.tool":
        return _uniq(["json.tool", *rest]) if len(rest) >= 2 else _READ
    if module in ("mypy", "pyright", "pyflakes", "flake8", "pylint", "compileall"):
        return _Effect("test", what=f"python -m {module}")
    if module in ("ruff", "black", "isort"):
        return _HANDLERS[module]([module, *rest], agent, state, {})
    if module in ("venv", "virtualenv"):
        _, positionals = _parse_options(rest, ("--prompt",))
        return _Effect("write", what=f"create a virtualenv with `python -m {module}`",
                       targets=positionals)
    return _Effect("code", what=f"`python -m {module}`")


# ---- git

_GIT_GLOBAL_VALUE = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace",
                               "--config-env", "--super-prefix", "--list-cmds"})
_GIT_READ = frozenset(
    """
    status log diff show rev-parse blame annotate grep ls-files ls-tree ls-remote cat-file
    describe shortlog merge-base name-rev rev-list show-ref for-each-ref whatchanged
    range-diff diff-tree diff-index diff-files check-ignore check-attr check-ref-format
    count-objects var version help verify-commit verify-tag cherry show-branch merge-tree
    check-mailmap get-tar-commit-id
    """.split()
)
_GIT_RISKY_CONFIG = ("pager", "editor", "alias.", "sshcommand", "external", "textconv",
                     "fsmonitor", "hookspath", "askpass", "credential", "filter.", "program",
                     "command", "proxy", "exec")
_BRANCH_CHANGES = frozenset({"-d", "-D", "--delete", "-f", "--force", "-m", "-M", "--move",
                             "-C", "--copy", "-u", "--set-upstream-to", "--unset-upstream",
                             "--edit-description", "-c"})


def _git(argv: list[str], agent: _Agent, state: _ShellState, assignments: Mapping[str, str]) -> _Effect:
    args = argv[1:]
    directory = state.cwd
    work_tree = assignments.get("GIT_WORK_TREE")
    configs: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, eq, value = args[i].partition("=")
        if key in _GIT_GLOBAL_VALUE and not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        if key == "-C":
            directory = agent.expand(value, directory)
        elif key == "-c":
            configs.append(value)
        elif key == "--work-tree":
            work_tree = value
        elif key in ("--version", "--help", "-h", "--exec-path", "--html-path", "--man-path",
                     "--info-path"):
            return _READ
        i += 1
    if work_tree:
        directory = agent.expand(work_tree, directory)
    if i >= len(args):
        return _READ
    sub, sub_args = args[i], args[i + 1 :]
    options, positionals = _parse_options(sub_args, _GIT_SUB_VALUE)
    flags = _names(options)

    refusal = _git_refusal(sub, sub_args, positionals, flags, agent)
    if refusal:
        return _Effect("deny", reason=refusal)

    if _git_reads(sub, positionals, flags):
        if not agent.writable:
            risky = [c for c in configs
                     if any(r in c.split("=", 1)[0].lower() for r in _GIT_RISKY_CONFIG)]
            if risky:
                return _Effect("code", what=f"`git -c {risky[0]}` (it can run programs)")
            if flags & {"--output", "-o"} and sub in ("diff", "log", "show"):
                return _Effect("write", what=f"write a file with `git {sub} --output`")
            if sub == "grep" and flags & {"-O", "--open-files-in-pager"}:
                return _Effect("code", what="`git grep -O` (it runs a pager program)")
        return _READ

    if not agent.writable:
        return _Effect("write", what=f"run `git {sub}`, which changes the repository")
    if sub in ("checkout", "switch"):
        reason = _git_branch_switch(sub, sub_args, positionals, flags, directory, agent)
        if reason:
            return _Effect("deny", reason=reason)
    return _Effect("write", what=f"git {sub}", targets=[directory] if directory else [])


_GIT_SUB_VALUE = (
    "-m", "--message", "-F", "--file", "-o", "--output", "--format", "--sort", "--points-at",
    "--contains", "--no-contains", "--merged", "--no-merged", "-u", "--set-upstream-to", "-X",
    "--strategy-option", "-s", "--strategy", "--author", "--date", "-S", "--gpg-sign", "--onto",
    "-x", "--exec", "-t", "--track", "--pretty", "-n", "--max-count", "--since", "--until",
    "--grep", "-G", "--depth", "--shallow-since",
)


def _git_reads(sub: str, positionals: list[str], flags: set[str]) -> bool:
    """Is this git subcommand (in this form) read-only?"""
    first = positionals[:1]
    if sub in _GIT_READ:
        return True
    if sub == "branch":
        return not positionals or bool(flags & {"-l", "--list"})
    if sub == "tag":
        return not positionals or bool(flags & {"-l", "--list", "-v", "--verify"})
    if sub == "config":
        return not _git_config_writes(positionals, flags)
    return (sub, first[0] if first else "") in _GIT_READ_FORMS


_GIT_READ_FORMS = frozenset({
    ("stash", "list"), ("stash", "show"), ("remote", ""), ("remote", "show"),
    ("remote", "get-url"), ("worktree", ""), ("worktree", "list"), ("reflog", ""),
    ("reflog", "show"), ("notes", ""), ("notes", "list"), ("notes", "show"),
    ("submodule", ""), ("submodule", "status"), ("submodule", "summary"),
})


def _git_refusal(
    sub: str, sub_args: list[str], positionals: list[str], flags: set[str], agent: _Agent
) -> str | None:
    """Git commands refused for every agent, whatever its capability."""
    own = agent.own_branch
    if sub == "push":
        return (
            f"nobody pushes from an ov agent ({agent.who} tried `git push`). Commit on your "
            f"branch {own}; `ov merge` brings it into the project. Tell your parent it is "
            "ready with `ov mail send`."
        )
    if sub == "reset" and "--hard" in flags:
        return (
            "`git reset --hard` throws work away and is refused for every agent. Use `git "
            "restore <path>` to undo changes to a file, or `git revert` to undo a commit."
        )
    if (sub == "checkout" and "-B" in flags) or (
        sub == "switch" and flags & {"-C", "--force-create"}
    ):
        return (
            f"`git {sub} {'-B' if sub == 'checkout' else '-C'}` force-resets a branch and is "
            f"refused for every agent. Your work belongs on {own}."
        )
    if (
        sub in ("update-ref", "filter-branch", "filter-repo")
        or (sub == "symbolic-ref" and (len(positionals) >= 2 or flags & {"-d", "--delete"}))
        or (sub == "replace" and not flags & {"-l", "--list"} and (positionals or flags))
    ):
        return f"`git {sub}` rewrites refs directly and is refused for every agent."
    if sub == "branch" and flags & _BRANCH_CHANGES:
        if flags & {"-m", "-M", "--move"}:
            return (
                f"renaming branches is refused: ov tracks your work as {own}, and other "
                "branches belong to other agents or the operator."
            )
        others = [p for p in positionals if p != own]
        if others:
            return (
                f"`git branch {' '.join(sorted(flags & _BRANCH_CHANGES))}` would change "
                f"{', '.join(others)}, which {agent.who} does not own; it may only work on "
                f"{own}. Ask your parent with `ov mail send` if a branch must change."
            )
    if sub == "tag" and flags & {"-d", "--delete", "-f", "--force"}:
        return "deleting or moving tags rewrites shared refs and is refused for every agent."
    if sub == "worktree" and positionals[:1] not in ([], ["list"]):
        return (
            "ov manages git worktrees (`ov sling` creates them, `ov stop`/`ov merge` clean "
            "them up); agents may not add, move or remove them."
        )
    if sub == "stash" and positionals[:1] == ["clear"]:
        return "`git stash clear` drops the stash shared by every worktree; refused."
    if sub == "config" and _git_config_writes(positionals, flags):
        if not (agent.writable and "--worktree" in flags):
            return (
                "the repository's git config is shared by every agent and the operator; "
                "agents may not change it (writers may use `git config --worktree`)."
            )
    if sub == "remote" and positionals[:1] not in ([], ["show"], ["get-url"]):
        return "git remotes are shared by every agent and the operator; agents may not change them."
    if sub in ("fetch", "pull"):
        for spec in positionals[1:]:
            destination = spec.lstrip("+").partition(":")[2]
            if destination and not destination.startswith("refs/remotes/"):
                return (
                    f"`git {sub} {spec}` would overwrite the local branch {destination}; "
                    f"agents only update their own branch {own}. Fetch without `:dst`."
                )
    return None


def _git_config_writes(positionals: list[str], flags: set[str]) -> bool:
    reads = {"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l", "--list",
             "--show-origin", "--show-scope", "--get-color", "--get-colorbool", "--name-only"}
    if flags & reads or positionals[:1] in (["get"], ["list"]):
        return False
    writes = {"--unset", "--unset-all", "--add", "--replace-all", "--rename-section",
              "--remove-section", "-e", "--edit"}
    if flags & writes or positionals[:1] in (["set"], ["unset"], ["edit"],
                                             ["rename-section"], ["remove-section"]):
        return True
    return len(positionals) >= 2


def _git_branch_switch(
    sub: str,
    sub_args: list[str],
    positionals: list[str],
    flags: set[str],
    directory: str | None,
    agent: _Agent,
) -> str | None:
    own = agent.own_branch
    reason = (
        f"{agent.who} works on branch {own}; `git {sub}` to another branch would take its "
        f"worktree off that branch. Restore files with `git restore <path>`; look at other "
        f"branches with `git show <branch>:<path>` or `git diff {own}...<branch>`."
    )
    if sub == "switch":
        if flags & {"-c", "--create", "--orphan", "-d", "--detach"}:
            return reason
        return None if positionals in ([], [own]) else reason
    if flags & {"-b", "--orphan", "--detach", "-t", "--track"}:
        return reason
    if "--" in sub_args or flags & {"--ours", "--theirs", "-p", "--patch",
                                    "--pathspec-from-file"}:
        return None
    if not positionals or positionals == [own] or len(positionals) >= 2:
        return None
    base = directory
    if base and os.path.lexists(os.path.join(base, positionals[0])):
        return None
    return reason


def _gh(argv: list[str], agent: _Agent, *_: object) -> _Effect:
    args = argv[1:]
    words = [a for a in args if not a.startswith("-")]
    reads = {("pr", "view"), ("pr", "list"), ("pr", "diff"), ("pr", "status"), ("pr", "checks"),
             ("issue", "view"), ("issue", "list"), ("issue", "status"), ("repo", "view"),
             ("run", "view"), ("run", "list"), ("auth", "status"), ("release", "list"),
             ("release", "view"), ("search", "issues"), ("search", "prs"), ("search", "code")}
    if not words or any(a in _VERSION_FLAGS for a in args[:1]) or tuple(words[:2]) in reads:
        return _READ
    if words[0] == "api" and not {"-X", "--method", "-f", "-F", "--field", "--raw-field",
                                  "--input"} & {a.split("=", 1)[0] for a in args}:
        return _READ
    return _Effect("deny", reason=(
        f"`gh {' '.join(words[:2])}` changes the remote and is refused for every agent; "
        "`ov merge` and the operator handle what leaves this machine. Report with "
        "`ov mail send`."
    ))


_HANDLERS: dict[str, _Handler] = {
    "tee": _tee,
    "sort": _sort,
    "uniq": _uniq,
    "shuf": _output_option("-o", "--output", label="shuf -o"),
    "iconv": _output_option("-o", "--output", label="iconv -o"),
    "xxd": _xxd,
    "tree": _output_option("-o", label="tree -o"),
    "trap": _trap,
    "rg": _ripgrep,
    "split": _split,
    "csplit": _split,
    "date": _date,
    "hostname": _hostname,
    "sed": _sed,
    "gsed": _sed,
    "awk": _awk,
    "gawk": _awk,
    "mawk": _awk,
    "nawk": _awk,
    "find": _find,
    "xargs": _xargs,
    "rm": _targets_all("delete files", removes=True),
    "rmdir": _targets_all("delete directories", removes=True),
    "unlink": _targets_all("delete files", removes=True),
    "shred": _targets_all("destroy files", ("-n", "-s", "--iterations", "--size"), removes=True),
    "touch": _targets_all("create files with touch", ("-d", "-t", "-r", "--date", "--reference")),
    "mkdir": _targets_all("create directories", ("-m", "--mode")),
    "mkfifo": _targets_all("create fifos", ("-m", "--mode")),
    "mknod": _targets_all("create device files", ("-m", "--mode")),
    "truncate": _truncate,
    "chmod": _chmod_like("change file modes", has_mode=True),
    "chown": _chmod_like("change file owners", has_mode=False),
    "chgrp": _chmod_like("change file groups", has_mode=False),
    "cp": _copy_like("copy files"),
    "install": _copy_like("install files", ("-m", "--mode", "-o", "--owner", "-g", "--group")),
    "rsync": _copy_like("copy files with rsync", ("-e", "--rsh", "--exclude", "--include",
                                                  "--backup-dir", "-f", "--filter")),
    "scp": _copy_like("copy files with scp", ("-P", "-i", "-o", "-F", "-J", "-l", "-c")),
    "ln": _copy_like("create links", one_means_cwd=True),
    "mv": _copy_like("move files", moves=True),
    "dd": _dd,
    "patch": _patch,
    "tar": _tar,
    "unzip": _unzip,
    "gzip": _compressor,
    "gunzip": _compressor,
    "bzip2": _compressor,
    "bunzip2": _compressor,
    "xz": _compressor,
    "unxz": _compressor,
    "zstd": _compressor,
    "curl": _curl,
    "wget": _wget,
    "yq": _yq,
    "perl": _perl,
    "eval": _eval,
    "exec": _exec,
    "source": _source,
    ".": _source,
    "sudo": _privileged,
    "su": _privileged,
    "doas": _privileged,
    "pkexec": _privileged,
    "runuser": _privileged,
    "timeout": _wrapper(("-s", "--signal", "-k", "--kill-after"), leading_positionals=1),
    "nice": _nice,
    "nohup": _wrapper(),
    "time": _wrapper(("-f", "--format", "-o", "--output")),
    "stdbuf": _wrapper(("-i", "-o", "-e", "--input", "--output", "--error")),
    "ionice": _wrapper(("-c", "-n", "-t", "--class", "--classdata")),
    "builtin": _wrapper(),
    "chronic": _wrapper(),
    "unbuffer": _wrapper(),
    "env": _env,
    "command": _command,
    "watch": _watch,
    "pytest": _pytest,
    "py.test": _pytest,
    "tox": _fixable(frozenset()),
    "nox": _fixable(frozenset()),
    "mypy": _fixable(frozenset()),
    "pyright": _fixable(frozenset()),
    "pyflakes": _fixable(frozenset()),
    "flake8": _fixable(frozenset()),
    "pylint": _fixable(frozenset()),
    "shellcheck": _fixable(frozenset()),
    "eslint": _fixable(frozenset(), frozenset({"--fix", "--fix-dry-run"})),
    "black": _fixable(frozenset({"--check", "--diff"})),
    "isort": _fixable(frozenset({"--check", "--check-only", "-c", "--diff"})),
    "prettier": _fixable(frozenset({"--check", "-c", "--list-different", "-l"}),
                         frozenset({"--write", "-w"})),
    "ruff": _ruff,
    "tsc": _tsc,
    "make": _make,
    "git": _git,
    "gh": _gh,
    "pip": _pip,
    "pip3": _pip,
    "npm": _node_pm,
    "pnpm": _node_pm,
    "yarn": _node_pm,
    "cargo": _cargo,
    "go": _go,
    "uv": _uv,
    "apt": _system_packages,
    "apt-get": _system_packages,
    "apt-cache": _system_packages,
    "aptitude": _system_packages,
    "dpkg": _system_packages,
    "dnf": _system_packages,
    "yum": _system_packages,
    "apk": _system_packages,
    "pacman": _system_packages,
    "zypper": _system_packages,
    "brew": _system_packages,
    "port": _system_packages,
    "snap": _system_packages,
    "gem": _global_installer,
    "pipx": _global_installer,
    "conda": _global_installer,
    "mamba": _global_installer,
    "micromamba": _global_installer,
}
for _name in _SHELLS:
    _HANDLERS[_name] = _shell
