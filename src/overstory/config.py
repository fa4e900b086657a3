"""Project configuration: built-in defaults < config.yaml < config.local.yaml < OV_<SECTION>_<KEY>.

Imports pydantic and yaml, so hot commands (mail, guard, status) never import this module.
"""

from __future__ import annotations

import json
import os
import types
import typing as t
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from overstory.config_approvals import APPROVALS_YAML, ApprovalRule, ApprovalsSection, NotifySection  # noqa: F401
from overstory.config_snapshot import DEFAULT_MODELS, runtime_for  # shared with the loop's snapshot (no pydantic)
from overstory.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ProjectSection(_Section):
    canonical_branch: str = "main"


class RuntimeSection(_Section):
    default: str = "claude"
    claude_bin: str = "claude"
    codex_bin: str = "codex"
    gemini_bin: str = "gemini"
    opencode_bin: str = "opencode"
    model: str | None = None
    tmux: bool = False

    @field_validator("default")
    @classmethod
    def _known_runtime(cls, value: str) -> str:
        from overstory.runtimes import RUNTIME_NAMES

        if value not in RUNTIME_NAMES:
            raise ValueError(f"unknown runtime; choose one of: {', '.join(repr(name) for name in RUNTIME_NAMES)}")
        return value


class TurnsSection(_Section):
    stall_timeout: float = Field(600, gt=0)
    max_retries: int = Field(2, ge=0)
    max_concurrent: int = Field(4, ge=1)
    retry_backoff: float = Field(2.0, ge=0)
    kill_grace: float = Field(5.0, ge=0)
    idle_nudge: float = Field(60, gt=0)
    max_nudges: int = Field(2, ge=0)


def _seconds(value: t.Any) -> t.Any:
    """A duration as seconds: a number, or text such as "90m", "4h"."""
    if isinstance(value, str):
        from overstory.clock import parse_duration

        return parse_duration(value)
    return value


class BudgetLimits(_Section):
    """The four optional limits of an agent or a run; null means no limit."""

    max_usd: float | None = Field(None, ge=0)
    max_turns: int | None = Field(None, ge=0)
    max_tool_calls: int | None = Field(None, ge=0)
    max_wallclock: float | None = Field(None, ge=0)

    @field_validator("max_wallclock", mode="before")
    @classmethod
    def _duration(cls, value: t.Any) -> t.Any:
        return _seconds(value)


class BudgetsSection(_Section):
    agent: BudgetLimits = Field(default_factory=BudgetLimits)
    run: BudgetLimits = Field(default_factory=BudgetLimits)


class QuotaSection(_Section):
    backoff_initial: float = Field(60, gt=0)
    backoff_max: float = Field(1800, gt=0)
    stagger: float = Field(5, ge=0)


class ModelPrice(_Section):
    """US dollars per million tokens (``overstory.prices``): live estimates, and CLIs that report no cost."""

    input_per_mtok: float = Field(ge=0)
    output_per_mtok: float = Field(ge=0)
    cache_read_per_mtok: float | None = Field(None, ge=0)
    cache_write_per_mtok: float | None = Field(None, ge=0)


class WatchdogSection(_Section):
    interval: float = Field(5, gt=0)
    stale_after: float = Field(300, gt=0)
    zombie_after: float = Field(900, gt=0)


class AgentsSection(_Section):
    max_depth: int = Field(2, ge=0)
    max_children_per_lead: int = Field(5, ge=1)
    max_concurrent_agents: int = Field(20, ge=1)


class MergeSection(_Section):
    tier_max: int = Field(2, ge=1, le=3)
    ai_resolve: bool = False
    model: str = "claude-sonnet-4-5"
    gates: list[str] = Field(default_factory=list)
    lock_wait: float = Field(30, ge=0)


class LoopSection(_Section):
    max_iterations: int = Field(20, ge=1)
    same_failure_limit: int = Field(3, ge=1)
    check_timeout: float = Field(900, gt=0)
    output_tail: int = Field(3000, ge=200)
    critic_timeout: float = Field(1800, gt=0)


class SchedulesSection(_Section):
    catch_up: t.Literal["latest", "none"] = "latest"
    timeout: float = Field(600, gt=0)


class LedgerSection(_Section):
    """The tool-call ledger: which calls are side effects, and what a retried turn may repeat."""

    side_effects: list[str] = Field(default_factory=list)
    read_only: list[str] = Field(default_factory=list)
    replay: dict[str, str] = Field(default_factory=lambda: {"read": "rerun", "local_write": "rerun",
                                                            "side_effect": "skip"})

    @field_validator("side_effects", "read_only")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        from overstory.guards.patterns import parse_pattern

        for text in value:
            parse_pattern(text)  # a ValueError names the broken pattern
        return value

    @field_validator("replay")
    @classmethod
    def _replay(cls, value: dict[str, str]) -> dict[str, str]:
        classes, policies = ("read", "local_write", "side_effect"), ("skip", "rerun", "ask")
        for klass, policy in value.items():
            if klass not in classes:
                raise ValueError(f"unknown class {klass!r}; use {', '.join(classes)}")
            if policy not in policies:
                raise ValueError(f"unknown replay policy {policy!r} for {klass}; use {', '.join(policies)}")
        return {"read": "rerun", "local_write": "rerun", "side_effect": "skip", **value}


class GuardsSection(_Section):
    push_remotes: list[str] = Field(default_factory=list)


class LogsSection(_Section):
    keep_days: float = Field(14, gt=0)


PROTOCOLS = ("anthropic", "openai-responses", "openai-chat", "gemini")


class Provider(_Section):
    base_url: str
    api_key_env: str = "ANTHROPIC_API_KEY"
    # The API the endpoint speaks; when set, ov refuses to point a runtime that speaks another at it.
    protocol: str | None = None

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, value: str | None) -> str | None:
        if value is not None and value not in PROTOCOLS:
            raise ValueError(f"unknown protocol; choose one of: {', '.join(PROTOCOLS)}")
        return value


class Config(_Section):
    project: ProjectSection = Field(default_factory=ProjectSection)
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    turns: TurnsSection = Field(default_factory=TurnsSection)
    watchdog: WatchdogSection = Field(default_factory=WatchdogSection)
    agents: AgentsSection = Field(default_factory=AgentsSection)
    merge: MergeSection = Field(default_factory=MergeSection)
    ledger: LedgerSection = Field(default_factory=LedgerSection)
    guards: GuardsSection = Field(default_factory=GuardsSection)
    approvals: ApprovalsSection = Field(default_factory=ApprovalsSection)
    notify: NotifySection = Field(default_factory=NotifySection)
    logs: LogsSection = Field(default_factory=LogsSection)
    budgets: BudgetsSection = Field(default_factory=BudgetsSection)
    quota: QuotaSection = Field(default_factory=QuotaSection)
    loop: LoopSection = Field(default_factory=LoopSection)
    schedules: SchedulesSection = Field(default_factory=SchedulesSection)
    providers: dict[str, Provider] = Field(default_factory=dict)
    models: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_MODELS))
    runtimes: dict[str, str] = Field(default_factory=dict)
    prices: dict[str, ModelPrice] = Field(default_factory=dict)

    @field_validator("runtimes")
    @classmethod
    def _known_runtimes(cls, value: dict[str, str]) -> dict[str, str]:
        from overstory.runtimes import RUNTIME_NAMES
        from overstory.store.sessions import CAPABILITIES

        for capability, runtime in value.items():
            if capability not in CAPABILITIES:
                raise ValueError(f"unknown capability {capability!r}; choose among: {', '.join(CAPABILITIES)}")
            if runtime not in RUNTIME_NAMES:
                raise ValueError(f"unknown runtime {runtime!r} for {capability}; choose one of: "
                                 f"{', '.join(RUNTIME_NAMES)}")
        return value

    def runtime_for(self, capability: str) -> str:
        """The runtime of a new agent: ``runtimes[capability]``, else ``runtime.default``."""
        return runtime_for(self, capability)


# Written by `ov init`. Every key is documented; tests check none is missing.
DEFAULT_CONFIG_YAML = """\
# ov project configuration. Precedence: built-in defaults < this file <
# config.local.yaml (per machine, git-ignored) < environment variables named
# OV_<SECTION>_<KEY>, e.g. OV_TURNS_STALL_TIMEOUT=30. Durations are seconds.

project:
  # Branch that merges target when an agent's own base branch is unknown.
  canonical_branch: main

runtime:
  # Runtime for new agents (unless `runtimes` names one for the capability): claude (Claude Code),
  # codex (OpenAI Codex CLI), gemini (Gemini CLI), opencode (OpenCode) or scripted (built-in fake).
  default: claude
  # Program started for the claude runtime (a name on PATH or an absolute path).
  claude_bin: claude
  # Program started for the codex runtime (npm package @openai/codex).
  codex_bin: codex
  # Program started for the gemini runtime (npm package @google/gemini-cli).
  gemini_bin: gemini
  # Program started for the opencode runtime (npm package opencode-ai).
  opencode_bin: opencode
  # Model passed as --model to every agent unless `models` or `ov sling --model` says otherwise (null: the CLI's default).
  model: null
  # Run agents' interactive TUI in tmux instead of headless spawn-per-turn.
  tmux: false

turns:
  # A turn with no output event for this long is killed and the agent becomes zombie.
  stall_timeout: 600
  # How many times a failed turn (crash, transient API error) is retried before giving up.
  max_retries: 2
  # Turns allowed to run at once across the project (one claude process takes ~300 MB).
  max_concurrent: 4
  # Seconds before the first retry; doubles on each further retry.
  retry_backoff: 2.0
  # Seconds between SIGTERM and SIGKILL when a turn's process group is stopped.
  kill_grace: 5.0
  # A turn that ended without the agent's report (worker_done...) and with no mail waiting
  # gets an automatic follow-up turn (a nudge) after this many seconds...
  idle_nudge: 60
  # ...at most this many times; then its parent gets one escalation and it is `stalled` (no report).
  max_nudges: 2

watchdog:
  # Seconds between watchdog ticks.
  interval: 5
  # No activity for this long: the agent is marked stalled and nudged.
  stale_after: 300
  # No activity for this long: the agent is declared zombie and its processes are killed.
  zombie_after: 900

agents:
  # Deepest level of the hierarchy (operator = 0, coordinator's children = 1, ...).
  max_depth: 2
  # Children one lead (or the coordinator) may have active at once.
  max_children_per_lead: 5
  # Non-terminal agents allowed in the project at once.
  max_concurrent_agents: 20

merge:
  # Highest resolution tier `ov merge` tries: 1 plain merge, 2 mechanical, 3 model-assisted.
  tier_max: 2
  # Allow tier 3 (model-assisted conflict resolution through the Messages API).
  ai_resolve: false
  # Model used by tier 3.
  model: claude-sonnet-4-5
  # Shell commands run on the merged tree before committing, e.g. ["python -m pytest -q"].
  gates: []
  # Seconds to wait for another merge into the same branch before giving up.
  lock_wait: 30

ledger:
  # Extra tool patterns that are side effects, e.g. ["Bash(./deploy.sh*)", "mcp__*__deploy*"].
  # Patterns: TOOL or TOOL(ARGUMENT) globs; for Bash, ARGUMENT is each simple command.
  side_effects: []
  # Tool patterns known to be read-only, e.g. MCP tools: ["mcp__github__get_*"].
  read_only: []
  # What a retried turn may repeat, per class (read, local_write, side_effect): rerun,
  # skip (a call that already succeeded is answered with its result instead), or ask
  # (a person decides through an approval gate, as for approvals.rules; approved, it runs once).
  replay: {read: rerun, local_write: rerun, side_effect: skip}

guards:
  # Remotes an agent (builder or merger) may push its own branch to with `git push REMOTE
  # BRANCH`; empty: nobody pushes. Force pushes and other branches are always refused.
  push_remotes: []

""" + APPROVALS_YAML + """\
logs:
  # `ov clean` deletes agents' turn logs (.overstory/logs/) with nothing newer than this many days.
  keep_days: 14

budgets:
  # Spending limits of each agent (`ov sling --max-usd ...` overrides them). null: no limit.
  # Crossing one parks the agent (`ov resume NAME --add-usd 5` goes on); a child's limits
  # never exceed what is left of its run's.
  agent:
    # Dollars: the runtime's own figure after each turn, a live estimate (`prices`) during it.
    max_usd: null
    # Turns started.
    max_turns: null
    # Tool calls, counted by `ov guard` (the call past the limit is denied).
    max_tool_calls: null
    # Wall-clock time since the agent was slung: seconds or 90m, 4h.
    max_wallclock: null
  # The same limits for a whole run (`ov coordinator start --budget-usd ...` overrides them);
  # wall clock counts from the run's start. Crossing one parks every agent of the run.
  run:
    # Dollars spent by all of the run's agents together.
    max_usd: null
    # Turns started by all of them.
    max_turns: null
    # Tool calls made by all of them.
    max_tool_calls: null
    # Wall-clock time since the run started.
    max_wallclock: null

quota:
  # A rate or usage limit with no reset time parks every agent of that provider for this long
  # (seconds), doubling on each further limit in a row...
  backoff_initial: 60
  # ...up to this many seconds.
  backoff_max: 1800
  # Seconds between the agents of one provider un-parking after a reset (no stampede).
  stagger: 5

loop:
  # `ov loop` without --max-iterations (or a spec's max_iterations) stops, parked, after this many iterations.
  max_iterations: 20
  # The same check failure (same exit code and output, numbers aside) this many iterations in a row parks the loop.
  same_failure_limit: 3
  # Seconds a loop's check command (or a phase's gate) may run before it counts as failed.
  check_timeout: 900
  # Characters of the last check's output (its end) that the next iteration's message carries.
  output_tail: 3000
  # Seconds to wait for a phase's critic (`critic: reviewer`) to send its verdict before parking the loop.
  critic_timeout: 1800

schedules:
  # Fires missed while no watchdog ran: latest (fire once, for the latest missed time) or none (skip them).
  catch_up: latest
  # Seconds a fired command (`ov sling ...`) may run before it is stopped and the fire counts as failed.
  timeout: 600

# Model providers by name: {name: {base_url: ..., api_key_env: ENV_VAR_WITH_KEY, protocol: ...}}.
# protocol (optional) is the API the endpoint speaks: anthropic (claude), openai-responses (codex),
# openai-chat (opencode) or gemini (gemini); a runtime is never pointed at an endpoint of another.
providers: {}

# Model per capability: "provider/model" or a plain model alias (e.g. opus, sonnet, haiku).
# A capability not listed uses runtime.model, else the CLI's default (its most capable and
# most expensive model). `models: {}` gives every capability the CLI's default.
models:
  # Builders write the code: sonnet does it for a fraction of the default's price.
  builder: sonnet
  # Scouts only read and report: haiku is enough and cheaper still.
  scout: haiku

# Runtime per capability, e.g. {builder: codex, reviewer: gemini}; the rest use runtime.default.
# (The two model defaults above are Claude's: a capability run by another runtime ignores them.)
runtimes: {}

# Model prices in US dollars per million tokens, {model: {input_per_mtok: ..., output_per_mtok: ...,
# cache_read_per_mtok: ..., cache_write_per_mtok: ...}} (the cache prices are optional). They price the
# live estimate of a turn (budgets) and the turns of CLIs that report tokens but no cost (codex, gemini,
# opencode). Entries here add to or override ov's built-in list (`ov costs --prices` prints it); a model
# in neither is priced as the most expensive known one, and `ov costs` says so.
prices: {}
"""


def load_config(config_file: Path, local_file: Path | None = None,
                environ: t.Mapping[str, str] | None = None) -> Config:
    """Merge the layers; an invalid result is blamed on the first layer that made it invalid."""
    merged: dict[str, t.Any] = {}
    layers: list[tuple[str, dict[str, t.Any]]] = []
    for path in (config_file, local_file):
        if path is not None and path.exists():
            layers.append((str(path), _read_yaml(path)))
    environ = os.environ if environ is None else environ
    _check_env_names(environ)
    overrides = _env_overrides(environ)
    if overrides:
        layers.append(("environment (" + ", ".join(_override_names(overrides)) + ")", overrides))
    config = Config()
    for source, data in layers:
        _deep_merge(merged, data)
        try:
            config = Config.model_validate(merged)
        except ValidationError as exc:
            raise ConfigError(_describe(exc, source)) from None
    return config


def _override_names(overrides: dict[str, t.Any]) -> list[str]:
    return [f"OV_{section.upper()}_{key.upper()}" for section, keys in overrides.items() for key in keys]


def _read_yaml(path: Path) -> dict[str, t.Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} "
                          "is not UTF-8); compare it with `ov config --defaults`") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be an ov config; compare it with "
                          "`ov config --defaults`") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: broken YAML{where}: {getattr(exc, 'problem', exc)}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, found {type(data).__name__}")
    # A section whose keys are all commented out parses as null: it overrides nothing.
    return {key: {} if value is None else value for key, value in data.items()}


# OV_* variables that are not config keys: what ov reads besides, and what its own test
# suite reads. Any other OV_* name is a mistake and is reported like an unknown key.
OTHER_VARIABLES: dict[str, str] = {
    "OV_DEBUG": "1 prints tracebacks for errors",
    "OV_SCRIPTED_SCENARIO": "the scripted runtime's scenario file when --scenario is not given",
    "OV_SCRIPTED_STATE_DIR": "where the scripted runtime keeps its sessions",
    "OV_CLAUDE_BIN": "the claude binary the test suite's e2e tests use",
    "OV_CAPTURE_STREAM_FIXTURES": "1 makes the e2e tests save stream fixtures",
    "OV_SCREENSHOTS": "where the browser tests save the dashboard's screenshots",
}
OTHER_PREFIXES = ("OV_TEST_",)  # fault-injection hooks used by the tests


def _check_env_names(environ: t.Mapping[str, str]) -> None:
    known = set(env_var_names()) | set(OTHER_VARIABLES)
    unknown = sorted(name for name in environ if name.startswith("OV_") and name not in known
                     and not name.startswith(OTHER_PREFIXES))
    if not unknown:
        return
    problems = []
    for name in unknown:
        section = next((s for s in Config.model_fields if name.startswith(f"OV_{s.upper()}_")), None)
        same_section = [v for v in env_var_names() if section and v.startswith(f"OV_{section.upper()}_")]
        if section in ("providers", "models"):
            expected = f"`{section}` is set in config.yaml only"
        elif same_section:
            expected = f"expected one of: {', '.join(same_section)}"
        else:
            sections = ", ".join(f"OV_{s.upper()}_*" for s in Config.model_fields if s not in ("providers", "models"))
            expected = (f"expected OV_<SECTION>_<KEY> with a section of {sections}, "
                        f"or one of {', '.join(OTHER_VARIABLES)}")
        problems.append(f"unknown variable {name} ({expected})")
    raise ConfigError("environment: " + "; ".join(problems))


def _env_overrides(environ: t.Mapping[str, str]) -> dict[str, t.Any]:
    overrides: dict[str, t.Any] = {}
    for section_name, section_field in Config.model_fields.items():
        annotation = section_field.annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            continue
        for key, key_field in annotation.model_fields.items():
            raw = environ.get(f"OV_{section_name.upper()}_{key.upper()}")
            if raw is not None:
                value = _parse_env_value(raw)
                takes_text = _accepts_text(key_field.annotation)
                if takes_text and value is not None and not isinstance(value, str):
                    value = raw  # a branch or model named "123" stays text
                overrides.setdefault(section_name, {})[key] = value
    return overrides


def _accepts_text(annotation: t.Any) -> bool:
    """``str`` or an optional ``str`` (not ``list[str]``)."""
    if annotation is str:
        return True
    return t.get_origin(annotation) in (t.Union, types.UnionType) and str in t.get_args(annotation)


def _parse_env_value(raw: str) -> t.Any:
    """JSON when it parses (numbers, true/false, lists), the plain string otherwise."""
    if raw.strip().lower() in ("null", "none"):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _deep_merge(into: dict[str, t.Any], new: t.Mapping[str, t.Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


def _describe(exc: ValidationError, source: str) -> str:
    problems = []
    for error in exc.errors():
        key = ".".join(str(p) for p in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            known = _known_keys(error["loc"][:-1])
            expected = f" (expected one of: {', '.join(known)})" if known else ""
            problems.append(f"unknown key '{key}'{expected}")
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"'{key}': {message} (got {error.get('input')!r})")
    return f"{source}: " + "; ".join(problems)


def _known_keys(parent: tuple[int | str, ...]) -> list[str]:
    """The keys the model accepts under ``parent`` (a pydantic error location)."""
    model: t.Any = Config
    parts = list(parent)
    while parts:
        field_info = model.model_fields.get(str(parts.pop(0))) if isinstance(model, type) else None
        if field_info is None:
            return []
        annotation = field_info.annotation
        if t.get_origin(annotation) is dict:
            annotation = t.get_args(annotation)[1]
            if not parts:
                return []
            parts.pop(0)  # the free-form name (a provider's name, a capability)
        model = annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def env_var_names() -> list[str]:
    """Every OV_<SECTION>_<KEY> the loader understands."""
    names = []
    for section_name, section_field in Config.model_fields.items():
        annotation = section_field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += [f"OV_{section_name.upper()}_{k.upper()}" for k in annotation.model_fields]
    return names


def snapshot_shape(annotation: t.Any = None) -> t.Any:
    """Where ``Config`` has models (see ``config_snapshot``): {field: shape} for a model, {"*": shape} for a
    mapping of models, None for a plain value."""
    annotation = Config if annotation is None else annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {name: snapshot_shape(field.annotation) for name, field in annotation.model_fields.items()}
    origin = t.get_origin(annotation)
    if origin is dict:
        inner = snapshot_shape(t.get_args(annotation)[1])
        return None if inner is None else {"*": inner}
    if origin in (t.Union, types.UnionType):
        return next((shape for arg in t.get_args(annotation) if (shape := snapshot_shape(arg)) is not None), None)
    return None


def write_agent_snapshot(config_file: Path, local_file: Path | None, environ: t.Mapping[str, str],
                         run_dir: Path) -> Config:
    """Validate the configuration as an agent's loop would see it (its launch environment) and hand it
    over as ``run_dir/config.json``, so the loop needs no pydantic. ConfigError if it is invalid."""
    from overstory import config_snapshot

    config = load_config(config_file, local_file, environ=environ)
    config_snapshot.write(config.model_dump(mode="json"), snapshot_shape(), config_snapshot.snapshot_path(run_dir))
    return config
