"""Project configuration: built-in defaults < config.yaml < config.local.yaml < OV_<SECTION>_<KEY>.

The schema and its validation. Imports pydantic and yaml, so only ``config_load.load`` imports this
module, when a configuration file changed (hot commands never do).
"""

from __future__ import annotations

import json
import os
import types
import typing as t
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from overstory.config.approvals import ApprovalRule, ApprovalsSection, NotifySection  # noqa: F401
from overstory.config.defaults import DEFAULT_CONFIG_YAML  # noqa: F401 - re-exported: `ov init` writes it
from overstory.config.snapshot import DEFAULT_MODELS, runtime_for  # shared with the loop's snapshot (no pydantic)
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
    kilo_bin: str = "kilo"
    qwen_bin: str = "qwen"
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


class AgentLimits(BudgetLimits):
    """``budgets.agent``: one task agent's limits unless `ov sling` says otherwise (docs/budgets.md).

    Sized for a first day: a builder task costs $0.10-$1 on sonnet and several times that on a CLI's
    default model, takes a handful of turns and minutes of wall clock.
    """

    max_usd: float | None = Field(5.0, ge=0)
    max_turns: int | None = Field(50, ge=0)
    max_wallclock: float | None = Field(4 * 3600, ge=0)


class RunLimits(BudgetLimits):
    """``budgets.run``: a whole run's limits (its coordinator and every agent it slings), a working day's worth."""

    max_usd: float | None = Field(25.0, ge=0)
    max_turns: int | None = Field(300, ge=0)
    max_wallclock: float | None = Field(8 * 3600, ge=0)


class BudgetsSection(_Section):
    agent: AgentLimits = Field(default_factory=AgentLimits)
    run: RunLimits = Field(default_factory=RunLimits)


class QuotaSection(_Section):
    backoff_initial: float = Field(60, gt=0)
    backoff_max: float = Field(1800, gt=0)
    stagger: float = Field(5, ge=0)


class ModelPrice(_Section):
    """US dollars per million tokens (``overstory.runtimes.prices``): live estimates, and CLIs that report no cost."""

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
    exclusive_scopes: bool = False  # refuse (not only warn about) a builder whose --files overlap another's


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


class LoopSection(_Section):
    max_iterations: int = Field(20, ge=1)
    same_failure_limit: int = Field(3, ge=1)
    check_timeout: float = Field(900, gt=0)
    output_tail: int = Field(3000, ge=200)
    critic_timeout: float = Field(1800, gt=0)
    protected_paths: list[str] = Field(default_factory=list)
    check_env: str | None = None

    @field_validator("protected_paths")
    @classmethod
    def _inside(cls, value: list[str]) -> list[str]:
        for path in value:
            if not path.strip() or path.startswith(("/", ":")) or ".." in path.split("/"):
                raise ValueError(f"{path!r}: a protected path is relative to the repository root, without `..`")
        return [p.strip() for p in value]


class SchedulesSection(_Section):
    catch_up: t.Literal["latest", "none"] = "latest"
    timeout: float = Field(600, gt=0)
    backoff: float = Field(60, gt=0)
    backoff_max: float = Field(3600, gt=0)


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
    hook_transport: t.Literal["auto", "command"] = "auto"
    # An agent polling for mail in a shell loop (guards.mail_poll): warn (an event) or refuse (the guard says why).
    mail_polling: t.Literal["warn", "refuse"] = "warn"


class LogsSection(_Section):
    keep_days: float = Field(14, gt=0)


class RayExecutorSection(_Section):
    """Where the ray executor finds its cluster (one that someone started: ov never starts one)."""

    address: str | None = None
    turn_resources: dict[str, float] = Field(default_factory=lambda: {"CPU": 1.0})
    namespace: str = "overstory"
    # Where the nodes reach this machine's agent endpoints (the workspace, guards, mail of a remote turn).
    control_host: str = "127.0.0.1"

    @field_validator("turn_resources")
    @classmethod
    def _amounts(cls, value: dict[str, float]) -> dict[str, float]:
        negative = sorted(name for name, amount in value.items() if amount < 0)
        if negative:
            raise ValueError(f"resource amounts must not be negative: {', '.join(negative)}")
        return value


class ExecutorSection(_Section):
    """Where turns run (``overstory.executors``): local processes, or tasks on a Ray cluster."""

    kind: t.Literal["local", "ray"] = "local"
    ray: RayExecutorSection = Field(default_factory=RayExecutorSection)

    @model_validator(mode="after")
    def _ray_needs_an_address(self) -> ExecutorSection:
        if self.kind == "ray" and not self.ray.address:
            raise ValueError("kind ray needs executor.ray.address (HOST:PORT of a running cluster: ray start --head)")
        return self


PROTOCOLS = ("anthropic", "openai-responses", "openai-chat", "gemini")


class Provider(_Section):
    base_url: str
    api_key_env: str = "ANTHROPIC_API_KEY"
    # The API the endpoint speaks; when set, ov refuses to point a runtime that speaks another at it.
    protocol: str | None = None
    # "ollama": a local Ollama server (overstory.runtimes.ollama): no key needed, every runtime that speaks the
    # Anthropic or an OpenAI API can use it, its models are priced at $0, `ov doctor` checks it.
    kind: t.Literal["api", "ollama"] = "api"

    @field_validator("protocol")
    @classmethod
    def _known_protocol(cls, value: str | None) -> str | None:
        if value is not None and value not in PROTOCOLS:
            raise ValueError(f"unknown protocol; choose one of: {', '.join(PROTOCOLS)}")
        return value


class TelemetrySection(_Section):
    """Tracing export (OpenTelemetry): off unless an endpoint is set here or in OTEL_EXPORTER_OTLP_*."""

    otlp_endpoint: str | None = None
    service_name: str = "ov"


class Config(_Section):
    project: ProjectSection = Field(default_factory=ProjectSection)
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    turns: TurnsSection = Field(default_factory=TurnsSection)
    watchdog: WatchdogSection = Field(default_factory=WatchdogSection)
    agents: AgentsSection = Field(default_factory=AgentsSection)
    merge: MergeSection = Field(default_factory=MergeSection)
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    ledger: LedgerSection = Field(default_factory=LedgerSection)
    guards: GuardsSection = Field(default_factory=GuardsSection)
    approvals: ApprovalsSection = Field(default_factory=ApprovalsSection)
    notify: NotifySection = Field(default_factory=NotifySection)
    logs: LogsSection = Field(default_factory=LogsSection)
    budgets: BudgetsSection = Field(default_factory=BudgetsSection)
    quota: QuotaSection = Field(default_factory=QuotaSection)
    loop: LoopSection = Field(default_factory=LoopSection)
    schedules: SchedulesSection = Field(default_factory=SchedulesSection)
    executor: ExecutorSection = Field(default_factory=ExecutorSection)
    telemetry: TelemetrySection = Field(default_factory=TelemetrySection)
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


def load_config(config_file: Path, local_file: Path | None = None,
                environ: t.Mapping[str, str] | None = None) -> Config:
    """Merge the layers and build the models; an invalid result is blamed on the first layer that made it invalid.

    Commands and loops load the configuration with ``config_load.load``, which calls this only when a file
    (or an OV_* variable) changed since the last validation. Called directly by what needs the models
    themselves (`ov init`'s check of the file it writes, tests that change a value in place)."""
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
    "OV_SCRIPTED_FORGET_SESSIONS": "tests: the scripted runtime starts a new session when asked to resume one",
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
