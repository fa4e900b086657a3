"""PreToolUse decisions for agents (ARCHITECTURE §10): may this one tool call run?

`ov guard` runs once per tool call, so this package imports only the standard library.

Policy:

- Outside an agent (no ``OVERSTORY_AGENT_NAME``) everything is allowed.
- Claude's own delegation, scheduling and worktree tools (``BLOCKED_TOOLS``) are denied
  for everyone: delegation goes through ``ov sling``, talk through ``ov mail``.
- Read-only capabilities (coordinator, lead, scout, reviewer, monitor, and any capability
  we do not know) may not use the file-writing tools, and every shell command they run
  must be on an allow-list of read-only programs and forms (``git log`` yes, ``git
  commit`` no). Output may only go to /dev/null or be duplicated (``2>&1``).
- Writers (builder, merger) may write only inside their own worktree or the system temp
  dir. Never into another agent's worktree, ov's state under ``.overstory/``, the project
  checkout, the worktree's git metadata, or the ``.claude/settings*.json`` hook files
  that run this guard. Paths are resolved against the tool's cwd (and ``cd`` within the
  command), with ``~``, known ``$VARS``, ``..`` and symlinks (``os.path.realpath``).
- Nobody pushes, hard-resets, force-creates/deletes/renames other branches, updates refs
  directly, manages git worktrees, changes the shared git config or remotes, installs
  packages outside the worktree, or uses sudo.

Shell commands are split on operators by a quote-aware scanner, which also pulls out the
commands inside ``$(...)``, backticks, ``<(...)``, unquoted heredocs, ``bash -c``,
``eval``, ``find -exec``, ``xargs`` and wrappers (``env``, ``timeout``, ``nohup`` …).
Each simple command is split into words with :mod:`shlex`.

Where no exact answer exists, this is what we chose:

- Inline interpreter code (``python -c``, ``node -e``, ``perl -e``, scripts, ``source``)
  cannot be checked for writes: denied for read-only agents, allowed for writers (whose
  arguments are still checked for paths into other agents' worktrees and ov's state).
- Test runners and linters (``pytest``, ``python -m pytest``, ``npm test``, ``cargo
  test``, ``go test``, ``make test``, ``mypy``, ``ruff check`` …) are allowed for
  read-only agents because reviewers need them. They may write caches
  (``.pytest_cache``, ``__pycache__``), which are build artefacts, not source; options
  that write report files are denied.
- ``awk`` and ``sed`` programs get a best-effort look for ``system()``, ``print >``,
  ``| "cmd"`` and sed's ``w``/``e``.
- For writers, a target that cannot be known before the command runs (``$(...)``, an
  unknown ``$VAR``, anything after ``cd -``) is allowed. So is a symlink created and
  written through in the same command; the next tool call resolves it and is refused.
- A shell command we cannot parse (an unclosed quote, ``$(`` or heredoc word) is denied
  for everyone with a reason; bash would reject nearly all of these too.
- Reading is never restricted: a reviewer may read another agent's worktree.
- Tools this package does not know (MCP tools, new Claude tools) are allowed.
- The git stash is shared by all worktrees: ``git stash clear`` is refused; other stash
  commands are left to writers.

Modules, lowest first (each imports only the ones above it):

- ``shell``: the quote-aware scanner (``split_shell``, ``ShellCommand``).
- ``agent``: capabilities and the agent's path model (``_Agent``).
- ``effects``: ``_Effect`` and the other types the handlers share, the option parser.
- ``filetools``, ``wrappers``, ``toolchains``, ``git``: the per-program handlers.
- ``programs``: the handler table and ``_analyze``.
- ``policy``: ``decide``, ``check_shell`` and the hook reply.
"""

from __future__ import annotations

from overstory.guards.agent import READ_ONLY_CAPABILITIES, WRITE_CAPABILITIES
from overstory.guards.agent import _Agent as _Agent  # the tests build agents directly
from overstory.guards.policy import (
    ALLOW,
    BLOCKED_TOOLS,
    CODE_TOOLS,
    FILE_WRITE_TOOLS,
    SHELL_TOOLS,
    Decision,
    check_shell,
    decide,
    decide_hook_text,
    guard_reply,
    hook_response,
)
from overstory.guards.shell import ShellCommand, split_shell

__all__ = [
    "ALLOW",
    "BLOCKED_TOOLS",
    "CODE_TOOLS",
    "FILE_WRITE_TOOLS",
    "READ_ONLY_CAPABILITIES",
    "SHELL_TOOLS",
    "WRITE_CAPABILITIES",
    "Decision",
    "ShellCommand",
    "check_shell",
    "decide",
    "decide_hook_text",
    "guard_reply",
    "hook_response",
    "split_shell",
]
