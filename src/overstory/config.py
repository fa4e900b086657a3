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

    def as_limits(self) -> dict[str, float | int | None]:
        return self.model_dump()


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


class SandboxSection(_Section):
    mode: t.Literal["auto", "bwrap", "off"] = "auto"
    network: bool | dict[str, bool] = True
    writable: list[str] = Field(default_factory=list)
    tmp_size_mb: int = Field(1024, ge=16)

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_booleans(cls, value: t.Any) -> t.Any:
        """YAML reads a bare `off` (and `on`) as a boolean."""
        if value is False:
            return "off"
        if value is True:
            return "bwrap"
        return value

    @field_validator("network")
    @classmethod
    def _known_capabilities(cls, value: bool | dict[str, bool]) -> bool | dict[str, bool]:
        if isinstance(value, dict):
            from overstory.store.sessions import CAPABILITIES

            unknown = sorted(set(value) - {"default", *CAPABILITIES})
            if unknown:
                raise ValueError(f"unknown capability {', '.join(map(repr, unknown))}; use default or one of: "
                                 f"{', '.join(CAPABILITIES)}")
        return value

    @field_validator("writable")
    @classmethod
    def _absolute(cls, value: list[str]) -> list[str]:
        relative = [path for path in value if not Path(path).is_absolute()]
        if relative:
            raise ValueError(f"paths must be absolute: {', '.join(relative)}")
        return value

    def network_for(self, capability: str) -> bool:
        """Whether an agent of ``capability`` shares the host's network."""
        if isinstance(self.network, bool):
            return self.network
        return self.network.get(capability, self.network.get("default", True))


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


# Cheaper than the Claude CLI's own default (its most capable, most expensive model) for the
# capabilities that do the bulk of the turns; every other capability keeps the CLI's default.
DEFAULT_MODELS = {"builder": "sonnet", "scout": "haiku"}


class Config(_Section):
    project: ProjectSection = Field(default_factory=ProjectSection)
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    turns: TurnsSection = Field(default_factory=TurnsSection)
    watchdog: WatchdogSection = Field(default_factory=WatchdogSection)
    agents: AgentsSection = Field(default_factory=AgentsSection)
    merge: MergeSection = Field(default_factory=MergeSection)
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    logs: LogsSection = Field(default_factory=LogsSection)
    budgets: BudgetsSection = Field(default_factory=BudgetsSection)
    quota: QuotaSection = Field(default_factory=QuotaSection)
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
        return self.runtimes.get(capability) or self.runtime.default


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

sandbox:
  # Every turn runs inside bubblewrap (see README "Security"): auto (bwrap where a probe shows it
  # works, else off with a warning), bwrap (required: an agent does not start without it) or off.
  mode: auto
  # Share the host's network: on or off for everyone, or per capability, e.g. {default: on, scout: off}.
  # Off also cuts the model API: only for runtimes that need no network.
  network: on
  # Extra absolute paths bound writable into every agent's sandbox (a shared cache, ...): each is a hole.
  writable: []
  # Size limit of the sandbox's private /tmp (a tmpfs, so it uses memory), in MiB.
  tmp_size_mb: 1024

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
    "OV_BWRAP": "the bubblewrap binary to use instead of `bwrap` on PATH",
    "OV_CONTAINMENT_MEASURE": "where the containment e2e test writes its guard-only measurement",
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
