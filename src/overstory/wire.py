"""Requests that travel (`ov sling`, `ov merge`, `ov stop`): one dataclass per request, built once
by the CLI and either handed to the core (the operator's `ov`) or sent through the agent's endpoint
(``to_wire``) and read back by the endpoint's route (``from_wire``). A new option touches the
dataclass and its table, not three places.

``from_wire`` trusts nothing: the document comes from inside an agent's sandbox. A field it does
not know, a required one missing, or one of the wrong type is a ``UsageError`` (one line; exit 2
at the agent's CLI, HTTP 400 from the endpoint). Plain dataclasses and ``isinstance`` checks, no
pydantic: the endpoint serves every agent's calls from its loop, and this module is all it imports
to read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from overstory.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import typing as t
    from pathlib import Path

# What each kind of field accepts, and how an error names it.
_KINDS: dict[str, tuple[t.Callable[[t.Any], bool], str]] = {
    "text": (lambda v: isinstance(v, str), "a string"),
    "texts": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    "object": (lambda v: isinstance(v, dict), "an object"),
}


def _type_name(value: t.Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def read_fields(request: str, document: t.Any, fields: t.Mapping[str, str],
                required: t.Collection[str] = ()) -> dict[str, t.Any]:
    """``document``'s fields, checked against ``fields`` (name -> kind); null is "not given" for the optional ones."""
    if not isinstance(document, dict):
        raise UsageError(f"{request}: the request must be a JSON object, not {_type_name(document)}")
    unknown = sorted(str(key) for key in document if key not in fields)
    if unknown:
        raise UsageError(f"{request}: unknown field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(repr(key) for key in unknown)}")
    missing = [key for key in required if document.get(key) is None]
    if missing:
        raise UsageError(f"{request}: missing field{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(repr(key) for key in missing)}")
    for key, value in document.items():
        accepts, described = _KINDS[fields[key]]
        if value is not None and not accepts(value):
            raise UsageError(f"{request}: {key} must be {described}, not {_type_name(value)}")
    return dict(document)


BUDGET_KEYS = ("max_usd", "max_turns", "max_tool_calls", "max_wallclock")


def checked_budget(requested: t.Any) -> dict[str, t.Any] | None:
    """A child's limits as the CLI would have parsed them (the core clamps them to the run's)."""
    if requested is None:
        return None
    if not isinstance(requested, dict) or not set(requested) <= set(BUDGET_KEYS):
        raise UsageError(f"budget: expected an object with keys {', '.join(sorted(BUDGET_KEYS))}")
    for key, value in requested.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise UsageError(f"budget: {key} must be a number >= 0")
    return dict(requested)


@dataclass
class SlingRequest:
    """`ov sling`'s request (``agents.spawn.sling`` takes it).

    On the wire: every field down to ``executor``. ``spec_file`` and ``scenario`` are files on the
    caller's side: ``read_files`` reads them into ``prompt`` and ``scenario_text`` before the
    request is sent (in an agent's sandbox, where the files are). The fields after ``executor``
    are set only by ov itself (the coordinator, `ov loop`, recovery) and never travel.
    """

    capability: str
    task_id: str
    name: str | None = None
    prompt: str | None = None
    files: t.Sequence[str] = ()
    parent: str | None = None
    runtime: str | None = None
    model: str | None = None
    base_branch: str | None = None
    scenario_text: str | None = None  # the scenario itself (an agent's sling through its endpoint sends the text)
    scenario_name: str | None = None  # the file scenario_text came from (its suffix says YAML or JSON)
    tmux: bool | None = None  # run the interactive TUI in tmux (None: config runtime.tmux)
    budget: dict[str, t.Any] | None = None  # max_usd, max_turns, max_tool_calls, max_wallclock (None: config)
    approve: t.Sequence[str] = ()  # tool patterns whose calls need approval (ov sling --approve)
    executor: str | None = None  # where its turns run: local or ray (None: config executor.kind)
    group: str | None = None  # a task group (`ov group`) the new agent joins once it is slung
    # -- not on the wire -----------------------------------------------------------------
    spec_file: Path | None = None
    scenario: Path | None = None
    at_project_root: bool = False  # the coordinator works at the root, with no worktree
    start_point: str | None = None  # the commit the new branch starts at (default: the base branch's tip)
    continue_branch: bool = False  # `ov resume NAME --restart`: its existing ov/NAME branch (and worktree) go on
    loop: dict[str, t.Any] | None = None  # an `ov loop`'s definition (agents.loop_spec): it works in iterations
    # `ov resume --fork`: the source it forks (agent, generation, parent_run_id, and the session its first turn
    # continues where the runtime can fork one, with where that session's files are)
    fork_of: dict[str, t.Any] | None = None

    WIRE = {  # no annotation: a class constant, not a field
        "capability": "text", "task_id": "text", "name": "text", "prompt": "text", "files": "texts",
        "parent": "text", "runtime": "text", "model": "text", "base_branch": "text", "scenario_text": "text",
        "scenario_name": "text", "tmux": "flag", "budget": "object", "approve": "texts",
        "executor": "text", "group": "text"}
    REQUIRED = ("capability", "task_id")

    def read_files(self) -> SlingRequest:
        """This request with ``spec_file`` read into ``prompt`` and ``scenario`` into ``scenario_text``."""
        from dataclasses import replace

        prompt = _read(self.spec_file, "--spec") or self.prompt
        scenario_text, scenario_name = self.scenario_text, self.scenario_name
        if self.scenario is not None:
            scenario_text, scenario_name = _read(self.scenario, "--scenario"), str(self.scenario)
        return replace(self, prompt=prompt, spec_file=None, scenario=None, scenario_text=scenario_text,
                       scenario_name=scenario_name)

    def to_wire(self) -> dict[str, t.Any]:
        """The JSON object the endpoint's ``sling`` route reads (``from_wire``)."""
        local = [key for key in ("spec_file", "scenario", "start_point", "loop", "fork_of") if getattr(self, key) is not None]
        if self.continue_branch:
            local.append("continue_branch")
        if local or self.at_project_root:
            raise ValueError(f"not sent through the endpoint: {', '.join(local) or 'at_project_root'} "
                             "(read_files() reads the files first)")
        document = {key: getattr(self, key) for key in self.WIRE}
        document["files"], document["approve"] = list(self.files), list(self.approve)
        return document

    @classmethod
    def from_wire(cls, document: t.Any) -> SlingRequest:
        """The request an agent sent; a ``UsageError`` for a field that is unknown, missing or of the wrong type."""
        fields = read_fields("sling", document, cls.WIRE, cls.REQUIRED)
        fields["files"] = tuple(fields.get("files") or ())
        fields["approve"] = tuple(fields.get("approve") or ())
        fields["budget"] = checked_budget(fields.get("budget"))
        return cls(**fields)


@dataclass
class MergeRequest:
    """`ov merge`'s request: AGENT, --branch or --all, and how. ``allow_protected`` and
    ``allow_out_of_scope`` are the operator's alone (a person has looked at the change) and never travel."""

    agent: str | None = None
    branch: str | None = None
    all: bool = False
    into: str | None = None
    dry_run: bool = False
    tier_max: int | None = None
    force: bool = False
    # -- not on the wire -----------------------------------------------------------------
    allow_protected: bool = False
    allow_out_of_scope: bool = False

    WIRE = {"agent": "text", "branch": "text", "all": "flag", "into": "text", "dry_run": "flag", "tier_max": "count",
            "force": "flag"}

    def to_wire(self) -> dict[str, t.Any]:
        """The JSON object the endpoint's ``merge`` route reads (``from_wire``)."""
        if self.allow_protected:
            raise ValueError("not sent through the endpoint: allow_protected (the operator's own decision)")
        if self.allow_out_of_scope:
            raise ValueError("not sent through the endpoint: allow_out_of_scope (the operator's own decision)")
        return {key: getattr(self, key) for key in self.WIRE}

    @classmethod
    def from_wire(cls, document: t.Any) -> MergeRequest:
        """The request an agent sent; a ``UsageError`` for a field that is unknown or of the wrong type."""
        fields = read_fields("merge", document, cls.WIRE)
        return cls(**{key: value for key, value in fields.items() if value is not None})


@dataclass
class StopRequest:
    """`ov stop`'s request."""

    agent: str
    force: bool = False
    clean: bool = False

    WIRE = {"agent": "text", "force": "flag", "clean": "flag"}

    def to_wire(self) -> dict[str, t.Any]:
        return {key: getattr(self, key) for key in self.WIRE}

    @classmethod
    def from_wire(cls, document: t.Any) -> StopRequest:
        fields = read_fields("stop", document, cls.WIRE, ("agent",))
        return cls(**{key: value for key, value in fields.items() if value is not None})


def _read(path: Path | None, option: str) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {option} {path}: {exc.strerror}") from None
