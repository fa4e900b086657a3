"""Finding the real Kilo CLI for the e2e tests (its agents run through `ov sling` against
``tests/mock_openai_chat.py``; the adapter sets up everything else). Facts behind the adapter's
settings: tests/fixtures/KILO_PROBE_NOTES.md.

When the CLI is missing the test is skipped, except on CI (``CI=true``) where it fails.
"""

from __future__ import annotations

import os
import typing as t
from pathlib import Path

from claude_cli import pinned_version as pinned
from requires import requires

REPO_ROOT = Path(__file__).resolve().parent.parent
KILO_VERSION = pinned("KILO_VERSION")
MODEL_ID = "mock-model"
MISSING_MESSAGE = f"real Kilo CLI not found: run `npm install --prefix .ci/node @kilocode/cli@{KILO_VERSION}` or set OV_KILO_BIN"
_STUB_MAX_BYTES = 64 * 1024  # the npm package's bin/kilo is a small node launcher; the native binary is ~170 MB


def find_kilo() -> str | None:
    """$OV_KILO_BIN, else the native binary of the repo's ``.ci/node`` install (its platform package)."""
    explicit = os.environ.get("OV_KILO_BIN")
    modules = REPO_ROOT / ".ci" / "node" / "node_modules"
    candidates = [Path(explicit)] if explicit else [modules / "@kilocode" / "cli-linux-x64" / "bin" / "kilo",
                                                     modules / "@kilocode" / "cli" / "bin" / ".kilo"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK) and candidate.stat().st_size > _STUB_MAX_BYTES:
            return str(candidate)
    return None


# Resolved once at import: tests/conftest.py removes OV_* variables from each test's environment.
KILO_BIN = find_kilo()


def requires_kilo(test: t.Callable[..., t.Any]) -> t.Any:
    return requires(KILO_BIN is not None, MISSING_MESSAGE, e2e=True)(test)
