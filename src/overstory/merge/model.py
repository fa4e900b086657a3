"""Tier 3: asking a model to resolve one conflicted file, and deciding whether to trust the reply.

``AnthropicResolver`` only talks to the Messages API; ``accept_model_reply`` (applied by the
merge to whatever any resolver returns) decides what of the reply is the file:

* One surrounding markdown fence (a first line ```` ``` ```` or ```` ```lang ````, a last line
  ```` ``` ````) is stripped, provided no version of the file itself starts with a fence line
  and no other fence line is left inside. Any other fence line that is not part of the
  file's own versions rejects the reply (prose mixed with code).
* Conflict-marker lines that none of the three versions contains reject the reply.
* The first and the last non-blank line must each be a line of base, ours or theirs: a
  resolved file starts and ends like one of its versions, while "Here is the merged
  file:" or "Let me know if ..." does not.
* A missing final newline is added back when ours or theirs ends with one.

After that the merge still runs the same "nothing added was lost" check as tier 2.
"""

from __future__ import annotations

import os
import re
import typing as t

from overstory.errors import MergeError
from overstory.merge.threeway import marker_lines

SYSTEM_PROMPT = (
    "You resolve git merge conflicts. You receive one file in three versions: BASE (the common "
    "ancestor), OURS (the target branch) and THEIRS (the branch being merged). Reply with the "
    "complete resolved file and nothing else: no explanation, no markdown code fences, no "
    "conflict markers. Keep every change made on either side; where both sides added "
    "different lines at the same place, keep both in a sensible order."
)

_FENCE = re.compile(r"^\s*```")
_OPENING_FENCE = re.compile(r"^```[\w.+#-]*\s*$")


class ModelResolver(t.Protocol):
    """Anything that turns the three versions of a conflicted file into the resolved text."""

    def resolve(self, path: str, base: str, ours: str, theirs: str) -> str: ...


def build_prompt(path: str, base: str, ours: str, theirs: str) -> str:
    return (
        f"File: {path}\n\n"
        f"<base>\n{base}</base>\n\n"
        f"<ours>\n{ours}</ours>\n\n"
        f"<theirs>\n{theirs}</theirs>\n\n"
        "Reply with the full resolved content of the file only."
    )


class AnthropicResolver:
    """A ``ModelResolver`` over the anthropic SDK (imported on first use: it is slow to import).

    ``base_url`` None means the SDK's own default, which honours ``ANTHROPIC_BASE_URL``;
    ``api_key`` None means ``ANTHROPIC_API_KEY``.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 8192,
        *,
        timeout: float = 300.0,
        max_retries: int = 2,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self._client: t.Any = None

    def _get_client(self) -> t.Any:
        if self._client is None:
            import anthropic

            base_url = self.base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
            self._client = anthropic.Anthropic(
                base_url=base_url, api_key=self.api_key, timeout=self.timeout, max_retries=self.max_retries
            )
        return self._client

    def resolve(self, path: str, base: str, ours: str, theirs: str) -> str:
        message = self._get_client().messages.create(
            model=self.model,
            max_tokens=self.max_tokens,
            system=SYSTEM_PROMPT,
            messages=[{"role": "user", "content": build_prompt(path, base, ours, theirs)}],
        )
        if message.stop_reason == "max_tokens":
            raise MergeError(f"the model's reply for {path} was cut off at max_tokens={self.max_tokens}")
        return "".join(block.text for block in message.content if getattr(block, "type", None) == "text")


def _lines_of(*texts: str) -> set[str]:
    return {line.rstrip() for text in texts for line in text.split("\n")}


def accept_model_reply(reply: str, base: str, ours: str, theirs: str) -> str:
    """The file content in ``reply``, or MergeError saying why the reply is not trusted."""
    known = _lines_of(base, ours, theirs)
    lines = reply.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        if not (ours.strip() or theirs.strip()):
            return ""
        raise MergeError("the model's reply is empty")

    file_starts_with_fence = any(
        _FENCE.match(next((ln for ln in text.split("\n") if ln.strip()), "")) for text in (base, ours, theirs)
    )
    if (
        len(lines) >= 2
        and _OPENING_FENCE.match(lines[0])
        and lines[-1].strip() == "```"
        and not file_starts_with_fence
    ):
        lines = lines[1:-1]
    stray_fences = [ln for ln in lines if _FENCE.match(ln) and ln.rstrip() not in known]
    if stray_fences:
        raise MergeError("the model's reply contains markdown fences around or inside the content")

    body = "\n".join(lines)
    markers = marker_lines(body.encode(), base.encode(), ours.encode(), theirs.encode())
    if markers:
        raise MergeError(f"the model's reply still contains conflict markers ({markers[0]!r})")

    content_lines = [ln for ln in lines if ln.strip()]
    if content_lines:
        for which, line in (("first", content_lines[0]), ("last", content_lines[-1])):
            if line.rstrip() not in known:
                raise MergeError(
                    f"the model's reply does not look like the file: its {which} line {line.strip()[:80]!r} "
                    "is in no version of the file (prose around the content?)"
                )
    if ours.endswith("\n") or theirs.endswith("\n"):
        body += "\n"
    return body
