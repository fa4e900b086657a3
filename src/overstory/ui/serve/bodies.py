"""The JSON bodies the API accepts, checked strictly at the boundary.

Unknown fields, wrong types (no "1" for 1, no "yes" for true) and bodies that are
not one JSON object are refused with a 4xx and a message that names the field;
nothing is changed before a body has passed.
"""

from __future__ import annotations

import json
import typing as t

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from overstory.errors import BadBody

MAX_BODY_BYTES = 2 * 1024 * 1024  # a mail body may be 1 MiB; JSON escaping can double it


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class EmptyBody(Body):
    pass


class StopBody(Body):
    force: bool = Field(False, description="SIGKILL its processes at once")
    clean: bool = Field(False, description="also remove its worktree and branch (only if merged, unless force)")


class NudgeBody(Body):
    message: str | None = Field(None, description="what to say; the first line becomes the subject")


class ResumeBody(Body):
    add_usd: float | None = Field(None, description="raise the dollar limit by this much")
    add_turns: int | None = Field(None, description="raise the turn limit by this many")
    add_time: str | None = Field(None, description="raise the wall-clock limit, e.g. 30m")


class SlingBody(Body):
    capability: str
    task_id: str
    name: str | None = None
    prompt: str | None = None
    files: list[str] = Field(default_factory=list, description="file scope")
    parent: str | None = None
    runtime: str | None = None
    model: str | None = None
    base_branch: str | None = None
    tmux: bool | None = None


class SendBody(Body):
    to: str | None = Field(None, description="agent, operator, @all or @<capability>s; protocol types may omit it")
    subject: str
    body: str = ""
    type: str = "status"
    priority: str = "normal"
    payload: dict[str, t.Any] | None = None
    reply_to: int | None = None
    sender: str | None = Field(None, alias="from", description="sender (default operator)")
    allow_unknown: bool = False
    dedup_key: str | None = Field(None, description="send at most once per key: a retried request with the same "
                                                   "key sends nothing new (its answer then has no ids)")


class ReplyBody(Body):
    body: str
    subject: str | None = None
    sender: str | None = Field(None, alias="from", description="sender (default operator)")


class ApproveBody(Body):
    note: str | None = None


class RejectBody(Body):
    reason: str


MODELS: dict[str, type[Body]] = {model.__name__: model for model in (
    EmptyBody, StopBody, NudgeBody, ResumeBody, SlingBody, SendBody, ReplyBody, ApproveBody, RejectBody)}

Model = t.TypeVar("Model", bound=Body)


def parse(raw: bytes, content_type: str | None, model: type[Model]) -> Model:
    """Decode and validate one request body; an empty body counts as ``{}``."""
    if len(raw) > MAX_BODY_BYTES:
        raise BadBody(f"the request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}", status=413)
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in ("", "application/json"):
        raise BadBody(f"send the body as application/json, not {media}", status=415)
    if not raw.strip():
        data: t.Any = {}
    else:
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            raise BadBody(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadBody(f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False):
            where = ".".join(str(part) for part in error["loc"]) or "body"
            problems.append(f"{where}: {error['msg']}")
        raise BadBody("bad request body: " + "; ".join(problems), status=422) from None
