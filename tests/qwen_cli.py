"""Finding the real Qwen Code CLI for the e2e tests (its agents run through `ov sling` against
``tests/mock_openai_chat.py``; the adapter sets up everything else). Facts behind the adapter's
settings: tests/fixtures/QWEN_PROBE_NOTES.md.

When the CLI is missing the test is skipped, except on CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import os
import typing as t
from pathlib import Path

from claude_cli import pinned_version as pinned
from requires import requires

REPO_ROOT = Path(__file__).resolve().parent.parent
QWEN_CODE_VERSION = pinned("QWEN_CODE_VERSION")
MODEL_ID = "mock-model"
MISSING_MESSAGE = (f"real Qwen Code CLI not found: run `npm install --prefix .ci/node @qwen-code/qwen-code@"
                   f"{QWEN_CODE_VERSION}` or set OV_QWEN_BIN")


def find_qwen() -> str | None:
    """$OV_QWEN_BIN, else the repo's ``.ci/node`` install."""
    explicit = os.environ.get("OV_QWEN_BIN")
    candidate = Path(explicit) if explicit else REPO_ROOT / ".ci" / "node" / "node_modules" / ".bin" / "qwen"
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


# Resolved once at import: tests/conftest.py removes OV_* variables from each test's environment.
QWEN_BIN = find_qwen()


def requires_qwen(test: t.Callable[..., t.Any]) -> t.Any:
    return requires(QWEN_BIN is not None, MISSING_MESSAGE, e2e=True)(test)
