"""Typed payloads of the protocol mail types (pydantic).

Imported only when a protocol type is sent or validated, never on the plain
``ov mail send`` / ``ov mail check`` path: pydantic costs more to import than the
whole rest of those commands.

Field names are snake_case. ``SENDER_FIELDS`` lists the fields that describe the
sending agent itself (its task, branch and name); ``mail.send`` fills those from
the environment or the sender's session row when the caller leaves them out.
"""

from __future__ import annotations

import typing as t

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from overstory.errors import PayloadError

NonEmpty = t.Annotated[str, Field(min_length=1)]


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    SENDER_FIELDS: t.ClassVar[tuple[str, ...]] = ()


class DispatchPayload(Payload):
    """Sent to a new agent: the task it is to work on."""

    task_id: NonEmpty
    capability: str | None = None
    spec_path: str | None = None
    base_branch: str | None = None
    file_scope: list[str] = Field(default_factory=list)


class WorkerDonePayload(Payload):
    """An agent reports to its parent that its task is finished."""

    SENDER_FIELDS = ("task_id", "branch", "agent")

    task_id: NonEmpty
    branch: NonEmpty
    agent: NonEmpty
    files_modified: list[str] = Field(default_factory=list)
    commit: str | None = None


class WorkerDiedPayload(Payload):
    """The watchdog (or loop) tells a parent that a child died."""

    agent: NonEmpty
    reason: NonEmpty
    task_id: str | None = None
    generation: int | None = None
    previous_state: str | None = None
    branch: str | None = None
    last_activity: str | None = None


class MergeReadyPayload(Payload):
    """A branch is ready to be merged."""

    SENDER_FIELDS = ("task_id", "branch", "agent")

    task_id: NonEmpty
    branch: NonEmpty
    agent: NonEmpty
    target_branch: str | None = None
    files_modified: list[str] = Field(default_factory=list)


class MergedPayload(Payload):
    branch: NonEmpty
    tier: int = Field(ge=1, le=3)
    agent: str | None = None
    task_id: str | None = None
    target_branch: str | None = None
    commit: str | None = None
    commits: list[str] = Field(default_factory=list)  # what the merge brought in, oldest first


class MergeFailedPayload(Payload):
    branch: NonEmpty
    reason: NonEmpty
    agent: str | None = None
    task_id: str | None = None
    target_branch: str | None = None
    tier: int | None = Field(default=None, ge=1, le=3)
    conflict_files: list[str] = Field(default_factory=list)


class EscalationPayload(Payload):
    """Something the sender cannot resolve alone; the body says what."""

    SENDER_FIELDS = ("task_id", "agent")

    severity: t.Literal["warning", "error", "critical"]
    task_id: str | None = None
    agent: str | None = None


class DecisionGatePayload(Payload):
    """A choice the sender needs someone else to make before it can go on."""

    SENDER_FIELDS = ("task_id", "agent")

    options: list[NonEmpty] = Field(min_length=2)
    recommended: str | None = None
    task_id: str | None = None
    agent: str | None = None


PAYLOAD_MODELS: dict[str, type[Payload]] = {
    "dispatch": DispatchPayload,
    "worker_done": WorkerDonePayload,
    "worker_died": WorkerDiedPayload,
    "merge_ready": MergeReadyPayload,
    "merged": MergedPayload,
    "merge_failed": MergeFailedPayload,
    "escalation": EscalationPayload,
    "decision_gate": DecisionGatePayload,
}


def required_fields(mail_type: str) -> list[str]:
    model = PAYLOAD_MODELS[mail_type]
    return [name for name, info in model.model_fields.items() if info.is_required()]


def validate_payload(mail_type: str, payload: t.Mapping[str, t.Any] | None,
                     known: t.Mapping[str, str | None] | None = None) -> dict[str, t.Any]:
    """Check ``payload`` against the model of ``mail_type``; return it normalised.

    ``known`` holds what the environment knows about the sender (task_id, branch,
    agent); those values fill the model's SENDER_FIELDS the payload leaves out.
    Raises PayloadError naming every missing or wrong field.
    """
    model = PAYLOAD_MODELS.get(mail_type)
    if model is None:
        raise PayloadError(f"{mail_type} is not a protocol mail type")
    if payload is not None and not isinstance(payload, t.Mapping):
        raise PayloadError(f"the {mail_type} payload must be a JSON object, not {type(payload).__name__}")
    data = dict(payload or {})
    for name in model.SENDER_FIELDS:
        value = (known or {}).get(name)
        if data.get(name) in (None, "") and value:
            data[name] = value
    missing = [name for name in required_fields(mail_type) if name not in data]
    if payload is None and missing:
        raise PayloadError(
            f"{mail_type} mail needs a payload (--payload JSON); missing field(s): {', '.join(missing)}"
        )
    try:
        validated = model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(f"invalid {mail_type} payload: {describe_errors(exc)}") from None
    return validated.model_dump(mode="json")


def describe_errors(exc: ValidationError) -> str:
    """One line naming each bad field: ``branch: missing; tier: must be <= 3``."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "payload"
        kind = error["type"]
        if kind == "missing":
            text = "missing (required)"
        elif kind == "extra_forbidden":
            text = "unknown field"
        else:
            text = error["msg"]
        parts.append(f"{field}: {text}")
    return "; ".join(parts)


def describe_types() -> str:
    """Fields per protocol type, for help texts and error hints."""
    lines = []
    for name, model in PAYLOAD_MODELS.items():
        fields = [f"{f}" if info.is_required() else f"[{f}]" for f, info in model.model_fields.items()]
        lines.append(f"{name}: {' '.join(fields)}")
    return "\n".join(lines)
