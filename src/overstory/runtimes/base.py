"""The interface every runtime adapter implements: the program behind an agent.

The turn runner, the per-agent loop, ``ov sling``, tmux mode and ``ov doctor`` talk
to a runtime only through ``Runtime``; none of them branches on a runtime's name.
A runtime answers five questions:

- how to start one headless turn (``headless_command``) and hand it the first user
  message (``stdin_message``);
- how to read its stdout: ``new_parser`` turns one line into ov's own events
  (``ParsedEvent``) and, at the end, says whether the turn succeeded, what it cost
  and, if it failed, which kind of failure it was (``TurnFailure``);
- which settings make it call ov's guard hooks (``hook_settings``), or None where the
  runtime has no hooks. ov keeps them, and the agent's instructions, in the agent's run
  dir (``.overstory/run/<agent>/``), out of the agent's reach, and hands both to the
  runtime on every command line; a runtime that reads them from an ov-owned home of its
  own (``state_dir``) has ov write them there (``state_files``) at sling, and sees them
  read-only in its sandbox;
- where it keeps one agent's state (``state_dir``, writable inside the sandbox), how to
  seed it before a turn (``prepare_state``), which temp-dir variables it reads
  (``tmp_env_vars``), and what of ov's environment a turn starts from (``inherited_env``,
  ``turn_env``);
- how to run its interactive TUI in tmux (``tui``), or None;
- whether it is installed and has credentials (``probe``, for ``ov doctor``).

Standard library only: the per-agent loop imports this on every start.
"""

from __future__ import annotations

import abc
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from overstory.records import Record
from overstory.runtimes.prices import Tokens

if t.TYPE_CHECKING:
    from typing import NamedTuple

    from overstory.config.model import Config
else:  # typing's, without typing (deferred in an agent loop) and without compiling each field's annotation
    from overstory.records import NamedTuple

# The kinds of failed turn. The turn runner decides what each means for the agent. A parser says
# TRANSIENT only for a failure it recognises as one; an error it cannot place is UNKNOWN, never a guess.
TRANSIENT = "transient"          # crashed, killed, overloaded, 5xx: retry with the same mail
RATE_LIMIT = "rate_limit"        # 429 or a usage limit; ``reset_at_ms`` when the runtime said when it ends
AUTH = "auth"                    # not logged in, bad key: retrying cannot help until a person fixes it
PERMANENT = "permanent"          # a request the API will never accept
RESUME_FAILED = "resume_failed"  # the session to resume is gone: start a fresh one
UNKNOWN = "unknown"              # an error ov cannot classify: not retried (it could cost a whole turn again);
#                                  the agent parks with the runtime's message until a person looks
FAILURE_KINDS = (TRANSIENT, RATE_LIMIT, AUTH, PERMANENT, RESUME_FAILED, UNKNOWN)


@dataclass
class ParsedEvent:
    """One of ov's own event kinds, made from a runtime's output line.

    Kinds: turn_start, assistant_text, thinking, tool_start, tool_end, api_retry, rate_limit,
    turn_result, user_message, runtime_event (anything else), malformed_line (all in store/event_kinds.py).
    """

    kind: str
    summary: str | None = None
    tool: str | None = None
    data: dict[str, t.Any] | None = None
    # A tool_start's whole input where the parser has it: for the ledger only, never stored as an event.
    call_input: dict[str, t.Any] | None = None


class TurnFailure(Record):
    """Why a turn failed, as a runtime classifies it."""

    __slots__ = ("kind", "reason", "reset_at_ms")
    _defaults = {"reset_at_ms": None}

    kind: str
    reason: str
    reset_at_ms: int | None


class Usage(NamedTuple):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class ModelCost(Record):
    """One model's share of a finished turn, as the runtime reported it."""

    __slots__ = ("tokens", "cost_usd")

    tokens: Tokens
    cost_usd: float | None  # None: the runtime gave no figure for this model


class TurnParser(abc.ABC):
    """What one turn's stdout has said so far. Pure: no I/O, so it is tested on captured output."""

    session_id: str | None = None
    model: str | None = None       # the model the runtime reported, when it does (for the price table)
    events_seen: int = 0
    tool_calls: int = 0
    current_tool: str | None = None
    last_text: str = ""            # the model's latest text, whole (parsers set it; events carry it trimmed)
    # A limit crossed while a tool call is in flight: stop the turn only once the refused call's tool_end is
    # in (Claude Code saves the message to its session only then; killed sooner, the session cannot resume).
    stop_after_refusal: bool = False

    @abc.abstractmethod
    def feed(self, line: str, *, now: float | None = None) -> list[ParsedEvent]:
        """Parse one stdout line; a malformed line is an event, never an exception."""

    @property
    @abc.abstractmethod
    def finished(self) -> bool:
        """The runtime printed its end-of-turn event (successful or not)."""

    @property
    @abc.abstractmethod
    def succeeded(self) -> bool:
        """The runtime reported a successful end of the turn."""

    @abc.abstractmethod
    def failure(self, *, resumed: bool) -> TurnFailure:
        """Why a turn that did not succeed failed (only meaningful when ``succeeded`` is False)."""

    @abc.abstractmethod
    def usage(self) -> Usage:
        """Tokens and dollars of the turn as reported so far (dollars 0.0 when the runtime does not say)."""

    def final_text(self) -> str:
        """The model's last message of the turn, whole ('' when it said nothing): where an `ov loop`
        looks for its completion promise."""
        return self.last_text

    def finish(self, exit_code: int | None, stderr_tail: str) -> None:  # noqa: B027 (an optional hook)
        """The process has exited: its status and the end of its stderr, before ``succeeded``/``failure``
        are asked. For runtimes that report some outcomes only there (an unknown session to resume, a
        broken config, a turn that has no closing event)."""

    # ---- for budgets (optional: a runtime that reports none is priced only at the turn's end, and its
    # turns are bounded by the other limits: tool calls in the guard, wall clock in the turn runner)

    # How many usage reports (a model message's tokens, a step's cost) the stream has carried so far in
    # this turn: the turn runner prices the turn again whenever it changes.
    live_reports: int = 0

    def live_usage(self) -> dict[str, Tokens]:
        """Tokens per model that the stream has reported so far in this turn (priced live by ov); a model
        named '' is the one the turn was started with. Not the tokens ``live_cost_usd`` already covers."""
        return {}

    def live_cost_usd(self) -> float:
        """Dollars the runtime itself reported so far in this turn, for work not in ``live_usage``."""
        return 0.0

    def model_costs(self) -> dict[str, ModelCost]:
        """Per model, what the finished turn used and cost (empty when the runtime did not say)."""
        return {}

    def early_failure(self) -> TurnFailure | None:
        """A failure the runtime is still retrying but that retrying cannot fix (a rejected key).

        The turn runner stops the turn at once instead of waiting out the runtime's retries.
        """
        return None


@dataclass(frozen=True)
class TurnRequest:
    """What the turn runner knows when it asks for a command line."""

    model: str | None
    resume_session_id: str | None
    run_dir: Path              # .overstory/run/<agent>/: ov's instructions and hook settings, runtime state
    at_project_root: bool = False  # no worktree (the coordinator)
    scenario: Path | None = None
    # What ``provider_env`` returned for this turn's provider (empty without one): a runtime whose CLI
    # takes the endpoint on its command line, not from the environment, reads it here.
    provider_env: t.Mapping[str, str] = field(default_factory=dict)
    # ov runs this turn inside its own bubblewrap sandbox (docs/security.md): a runtime with a sandbox of its
    # own turns it off (it could not nest one inside, and ov's already is the boundary).
    sandboxed: bool = False
    # Settings to pass instead of the run dir's command-hook settings (the loop's HTTP hooks, endpoint.hooks).
    settings_file: Path | None = None
    # `ov resume --fork`'s first turn: continue ``resume_session_id`` (another agent's) in a new session of its
    # own, leaving that one as it was (only for a runtime with ``session_fork``).
    fork_session: bool = False


class AgentSetup(Record):
    """What ``ov sling`` knows of a new agent when a runtime writes the files of its state dir."""

    __slots__ = ("name", "capability", "writable", "project_root", "worktree", "run_dir", "instructions", "ov_command",
                 "tmux_mode", "model")
    _defaults = {"tmux_mode": False, "model": None}

    name: str
    capability: str
    writable: bool             # a writer (builder, merger); everyone else is read-only
    project_root: Path
    worktree: Path | None      # None: the agent works at the project root (the coordinator)
    run_dir: Path              # .overstory/run/<agent>/
    instructions: str          # the rendered overlay
    ov_command: list[str]      # how hooks call ov
    tmux_mode: bool
    model: str | None   # the model as resolved at sling (for a CLI that must declare it up front)


class Screen(Record):
    """What ov understands of one capture of a TUI's pane."""

    __slots__ = ("text", "ready", "busy", "input_text", "blocker")

    text: str
    ready: bool
    busy: bool
    input_text: str | None  # what is typed in the prompt box; None when there is no prompt box
    blocker: Blocker | None

    @property
    def idle(self) -> bool:
        """Ready, not working, nothing typed: the only state in which ov types."""
        return self.ready and not self.busy and self.input_text == "" and self.blocker is None


class Blocker(Record):
    """A start-up screen that stops the TUI. ``answer`` (tmux key names) gets past it; None means give up."""

    __slots__ = ("name", "marks", "answer", "message")

    name: str
    marks: tuple[str, ...]
    answer: tuple[str, ...] | None
    message: str


class Tui(abc.ABC):
    """A runtime's interactive program, run in a tmux pane (tmux mode)."""

    extra_env: t.ClassVar[dict[str, str]] = {}

    @abc.abstractmethod
    def command(self, config: Config, model: str | None, *, hook_settings: dict[str, t.Any] | None,
                instructions_file: Path | None) -> list[str]:
        """The TUI's command line, with ov's hook settings and the instructions file (in the run dir)."""

    @abc.abstractmethod
    def read_screen(self, text: str) -> Screen:
        """Parse a ``capture-pane`` of the TUI."""

    @abc.abstractmethod
    def activity_fingerprint(self, text: str) -> str:
        """A hash of the screen that changes with news, not with spinners or timers."""

    @abc.abstractmethod
    def last_lines(self, text: str, count: int = 6) -> str:
        """The last meaningful lines of a screen, for error messages."""


class RuntimeProbe(Record):
    """What ``ov doctor`` reports about one runtime."""

    __slots__ = ("name", "status", "detail", "credentials", "hint", "has_credentials")
    _defaults = {"hint": "", "has_credentials": None}

    name: str
    status: str          # "ok", "outdated" (older than ov supports), "missing" (not installed) or "broken"
    detail: str          # version and path, or why it is missing
    credentials: str     # e.g. "ANTHROPIC_API_KEY set", "logged in", "none found", "not needed"
    hint: str
    has_credentials: bool | None  # None: the runtime needs none

    @property
    def installed(self) -> bool:
        return self.status in ("ok", "outdated")


class Runtime(abc.ABC):
    """One program behind an agent. Instances are stateless; take them from the registry."""

    name: t.ClassVar[str]
    # A copy of the instructions inside the worktree, for humans only: the runtime never reads it.
    instructions_file: t.ClassVar[str]
    # ov's own files in the agent's run dir (.overstory/run/<agent>/), read-only inside the sandbox:
    # the instructions and (where the runtime has hooks) the hook settings, passed on every command line.
    run_instructions_file: t.ClassVar[str] = "instructions.md"
    run_settings_file: t.ClassVar[str] = "settings.json"
    # Environment variables naming a temp dir the runtime writes; inside the sandbox each points into
    # the sandbox's private /tmp instead (a host path there would be read-only or shared).
    tmp_env_vars: t.ClassVar[tuple[str, ...]] = ()
    # Which tool-call hooks call ov: "pre" (``ov guard`` before each call, which also writes the
    # tool-call ledger's row) and "post" (``ov guard --post``, the call's result, in tmux mode: a
    # headless turn's receipts come from the stream's tool_end events). Without "pre", the turn
    # runner fills the ledger from the stream's tool_start/tool_end events instead.
    tool_hooks: t.ClassVar[frozenset[str]] = frozenset()
    # Its tools whose ledger receipts a post-tool hook writes in a headless turn too (``ov guard --post``),
    # because its stream does not say how they ended: their ``tool_end`` events are not receipts.
    hook_receipts: t.ClassVar[frozenset[str]] = frozenset()
    # Whether its tool-call hooks can be HTTP calls to the agent's endpoint instead of `ov guard` processes.
    http_hooks: t.ClassVar[bool] = False
    # Whether its pre-tool hook is given the same call id as its stream's tool events. Where it is not
    # (codex, gemini), a receipt finds its ledger row through ``hook_call`` instead.
    hook_ids_match: t.ClassVar[bool] = True
    # Whether its stream reports usage (tokens or dollars) as each model message or step arrives, so a
    # budget can stop a turn inside it (``TurnParser.live_usage``); else only at the turn's end.
    usage_during_turn: t.ClassVar[bool] = False
    # Its own ways to start sub-agents or teams, as the roles name them ("Do not use ..."): only `ov sling`
    # creates agents. The roles in agents/ say Claude's; ``agents.overlay`` puts each runtime's in their place.
    own_agent_tools: t.ClassVar[str] = "Claude's own sub-agent or team tools (Task, Agent, SendMessage, team creation)"
    # How its CLI continues a session in a new one, leaving the original as it was (`ov resume --fork`
    # carries the source's conversation that way), as the docs say it; None: it has no such thing, and a
    # fork starts a fresh session. A runtime that sets it implements ``import_session``.
    session_fork: t.ClassVar[str | None] = None
    # Environment variables that carry its credentials (`ov resume` of an agent parked for
    # auth brings fixed values from the operator's environment into the agent's).
    credential_vars: t.ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def program(self, config: Config) -> list[str]:
        """The executable (and fixed leading arguments); raises RuntimeNotAvailable when missing."""

    @abc.abstractmethod
    def headless_command(self, request: TurnRequest, config: Config) -> list[str]:
        """The full argv of one headless turn."""

    @abc.abstractmethod
    def stdin_message(self, prompt: str) -> bytes:
        """What is written to the turn's stdin (which is then closed)."""

    @abc.abstractmethod
    def new_parser(self) -> TurnParser:
        """A parser for one turn's stdout."""

    def hook_call(self, tool: str, tool_input: dict[str, t.Any]) -> tuple[str, dict[str, t.Any]] | None:
        """A call as its stream's ``tool_start`` gives it (tool, ``call_input``), in the shape its
        pre-tool hook was given it as ``ov guard`` reads it (Claude's); None for a call no hook sees."""
        return tool, tool_input

    # The wire protocols this runtime can speak to a provider (config ``providers.<name>.protocol``).
    protocols: t.ClassVar[tuple[str, ...]] = ()

    def provider_env(self, base_url: str, api_key: str) -> dict[str, str]:
        """Environment that routes this runtime to a configured provider endpoint."""
        return {}

    def inherited_env(self, environ: t.Mapping[str, str]) -> dict[str, str]:
        """The part of ov's environment a turn starts from: a runtime drops what would make it read the
        user's own config or account, or change its behaviour (all of it by default)."""
        return dict(environ)

    def turn_env(self, run_dir: Path) -> dict[str, str]:
        """Environment every turn of this agent needs (e.g. where its state dir is)."""
        return {}

    def state_dir(self, run_dir: Path) -> Path | None:
        """Where the runtime keeps this agent's own state and config (CLAUDE_CONFIG_DIR, CODEX_HOME...), under
        its run dir: besides the worktree and /tmp, the only place it may write inside the sandbox. None when
        it keeps them where it always does."""
        return None

    def prepare_state(self, state_dir: Path, environ: t.Mapping[str, str], cwd: Path) -> None:
        """Create (and seed) the state dir before a turn, outside the sandbox; ``cwd`` is where the agent works."""
        state_dir.mkdir(parents=True, exist_ok=True)

    def import_session(self, source_state_dir: Path, source_cwd: Path, state_dir: Path, cwd: Path,
                       session_id: str) -> bool:
        """Copy the files of session ``session_id``, kept in another agent's state dir (where it worked in
        ``source_cwd``), into this agent's ``state_dir`` (where it works in ``cwd``), so that a turn can
        fork it. Reads the source's files only. False when there was nothing to copy."""
        return False

    def state_files(self, setup: AgentSetup) -> dict[str, str] | None:
        """Files ``ov sling`` writes into ``state_dir`` ({relative path: text}): the agent's instructions and
        the config that makes the runtime call ``ov guard`` (read-only inside the sandbox). None: ov writes
        them into the run dir (``run_instructions_file``, ``run_settings_file``) and passes them on the
        command line."""
        return None

    def hook_settings(self, ov_command: list[str], *, tmux_mode: bool) -> dict[str, t.Any] | None:
        """The settings that make the runtime call ``ov guard`` before each tool call; None: no hooks."""
        return None

    @property
    def tui(self) -> Tui | None:
        """The interactive program for tmux mode; None when the runtime is headless only."""
        return None

    def default_scenario(self, capability: str, task_id: str) -> dict[str, t.Any] | None:
        """A built-in script for runtimes that play one instead of calling a model."""
        return None

    def check_scenario(self, text: str, *, yaml: bool) -> None:  # noqa: B027 (an optional check)
        """Refuse (ValueError saying why) a scenario this runtime could not play; one that plays none takes any."""

    @abc.abstractmethod
    def probe(self, config: Config | None) -> RuntimeProbe:
        """Installed? Which version? Credentials? (May run the program: not for hot paths.)"""


def find_program(name_or_path: str) -> str | None:
    """An executable on PATH, or an existing file path; None when neither."""
    from overstory.procs import which  # not shutil's: every idle agent loop looks a program up

    return which(name_or_path) or (name_or_path if Path(name_or_path).is_file() else None)
