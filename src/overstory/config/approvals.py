"""Config sections of the human in the loop: ``approvals`` (gates) and ``notify`` (apprise targets).

Kept apart from ``overstory.config.model`` (which imports them) so that module stays small.
"""

from __future__ import annotations

import typing as t

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _seconds(value: t.Any) -> t.Any:
    if isinstance(value, str):
        from overstory.clock import parse_duration

        return parse_duration(value)
    return value


NOTIFY_EVENTS = ("approval_requested", "worker_died", "budget_parked", "quota_parked", "run_finished",
                 "merge_failed", "agent_completed", "session_lost")
NOTIFY_KINDS = (*NOTIFY_EVENTS, "approval_approved", "approval_rejected", "approval_expired")


class ApprovalRule(_Section):
    """A tool pattern (as in ``ledger.side_effects``) whose calls need a person's approval first."""

    match: str
    capability: str | None = None
    reason: str | None = None
    timeout: float | None = Field(None, gt=0)

    @field_validator("match")
    @classmethod
    def _pattern(cls, value: str) -> str:
        from overstory.guards.patterns import parse_pattern

        parse_pattern(value)
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: t.Any) -> t.Any:
        return _seconds(value)


class ApprovalsSection(_Section):
    rules: list[ApprovalRule] = Field(default_factory=list)
    timeout: float = Field(1800, gt=0)
    on_timeout: t.Literal["reject", "escalate"] = "reject"
    decider: t.Literal["parent", "operator"] = "parent"
    spend_over_usd: float | None = Field(None, ge=0)

    @field_validator("timeout", mode="before")
    @classmethod
    def _duration(cls, value: t.Any) -> t.Any:
        return _seconds(value)


class NotifySection(_Section):
    targets: list[str] = Field(default_factory=list)
    on: list[str] = Field(default_factory=lambda: list(NOTIFY_EVENTS))

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: t.Any) -> t.Any:
        """YAML 1.1 reads a bare ``on:`` key as the boolean true."""
        if isinstance(data, dict) and True in data:
            data = dict(data)
            data.setdefault("on", data.pop(True))
        return data

    @field_validator("on")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        for kind in value:
            if kind not in NOTIFY_KINDS:
                raise ValueError(f"unknown event {kind!r}; choose among: {', '.join(NOTIFY_KINDS)}")
        return value


# Their part of ``config.DEFAULT_CONFIG_YAML`` (every key documented; tests check it).
APPROVALS_YAML = """\
approvals:
  # Tool calls that need a person's approval first: [{match: "Bash(git push*)", reason: ..., timeout: 10m,
  # capability: builder}]; match is a tool pattern as in ledger. `ov sling --approve PATTERN` adds more.
  rules: []
  # How long a request waits for a decision (seconds or 30m) unless its rule says otherwise.
  timeout: 1800
  # What the watchdog does with an undecided request: reject, or escalate to the next ancestor.
  on_timeout: reject
  # Who decides: parent (the agent's parent: the operator for agents it slung), or operator.
  decider: parent
  # A turn that would start with the agent's spend past this many dollars needs approval (null: never).
  spend_over_usd: null

notify:
  # Where to tell a person: apprise URLs, e.g. ["ntfy://topic", "json://127.0.0.1:8080/hook"].
  targets: []
  # Which events: approval_requested, worker_died, budget_parked, quota_parked, run_finished,
  # merge_failed, agent_completed (an agent outside a run finished), session_lost (a runtime did not
  # resume the agent's session) (also approval_approved, approval_rejected, approval_expired). Quoted:
  # YAML reads a bare `on` as true (ov accepts that too).
  "on": [approval_requested, worker_died, budget_parked, quota_parked, run_finished, merge_failed, agent_completed, session_lost]

"""
