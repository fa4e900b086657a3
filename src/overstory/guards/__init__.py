"""PreToolUse decisions for agents (ARCHITECTURE §10): may this one tool call run?

`ov guard` runs once per tool call, so this package imports only the standard library,
and only the handler modules a command needs. It is the first layer, the one that
explains a refusal to the model; the kernel sandbox around each turn is the boundary
(issue 12). With ``sandbox.mode: off`` it is all there is, so it fails closed.

Policy:

- Outside an agent (no ``OVERSTORY_AGENT_NAME``) everything is allowed.
- Claude's own delegation, scheduling and worktree tools (``BLOCKED_TOOLS``) are denied
  for everyone: delegation goes through ``ov sling``, talk through ``ov mail``.
- Read-only capabilities (coordinator, lead, scout, reviewer, monitor, and any capability
  we do not know) may not use the file-writing tools, and every shell command they run
  must be positively read-only: a program on the plain-reader list, or one whose handler
  knows every option given (``git log`` yes, ``git commit`` no; ``pytest -k x`` yes,
  ``pytest --basetemp=…`` no). Anything else is refused: unknown programs and options,
  arguments computed at run time (they could turn into options), brace expansion,
  ANSI-C quoting, ``~user``, ``$IFS``, arithmetic on variables, variables that change
  what programs do (``PATH``, ``CDPATH``, ``LESSOPEN`` …), wrappers that detach or lock
  (``setsid``, ``coproc``, ``flock``). Output may only go to /dev/null or ``2>&1``.
- Writers (builder, merger) may write only inside their own worktree or the system temp
  dir. Never into another agent's worktree, ov's state under ``.overstory/``, the project
  checkout, the worktree's git metadata, or the ``.claude/settings*.json`` hook files
  that run this guard (nor remove the ``.claude`` holding them). Words are expanded as
  bash would (braces, ``$'...'``, ``~user``, variables assigned earlier in the command,
  globs against the files there now) and resolved against every directory the shell may
  be in (``walk``), with ``..`` and symlinks (``os.path.realpath``).
- For everyone, before any other rule: git options and variables that change what git
  reads, writes or runs (``--exec-path=``, ``--git-dir``, ``--work-tree``, ``-c``,
  ``GIT_*``, an alias, git outside the agent's worktree); ``OVERSTORY_*`` changes
  (``env -i``, ``unset``); aliases, ``hash -p``, ``${x@P}``, an unquoted ``$IFS``;
  commands over 64 KB. Nobody pushes, hard-resets, force-creates/deletes/renames other
  branches, updates refs directly, manages git worktrees, changes the shared git config
  or remotes, installs packages outside the worktree, uses sudo, schedules commands
  outside the turn (``at``, ``systemd-run``), kills processes by name, or changes the
  machine itself (clock, host name, mounts, kernel modules and settings, services, users,
  firewall, reboot: the ``machine`` module; their read-only forms stay allowed).
- In a phase of an `ov loop` whose spec lists ``tools``, any other tool is refused
  (``OVERSTORY_PHASE_TOOLS``, set by the loop for that phase's turns).
- ``ov`` subcommands by capability (``ov`` module): mail and reads for everyone, ``--from``
  only oneself, ``merge`` for mergers and the coordinator, stopping others for the
  coordinator and leads, ``stop --clean`` of another agent for the operator only.

Shell commands are split on operators by a quote-aware scanner (``shell``), which also
pulls out the commands inside ``$(...)``, backticks, ``<(...)``, ``${...}``, ``$((...))``,
unquoted heredocs, ``bash -c``, ``eval``, ``find -exec``, ``xargs`` and wrappers
(``env``, ``timeout``, ``setsid`` …), and into words by ``words``. Parsing is linear in the
command's length (tests/test_guard_parsing.py measures it).

Where no exact answer exists, this is what we chose:

- Inline interpreter code (``python -c``, ``node -e``, ``perl -e``, scripts, ``source``)
  cannot be checked for writes: denied for read-only agents, allowed for writers by
  design (the sandbox stops what they write outside); their arguments are still checked
  for paths into other agents' worktrees, ov's state and the project checkout.
- Test runners and linters (``pytest``, ``npm test``, ``cargo test``, ``go test``, ``make
  test``, ``mypy``, ``ruff check`` …) are allowed for read-only agents because reviewers
  need them, with the options ``testopts`` knows to be harmless. They may write caches
  (``.pytest_cache``, ``__pycache__``), which are build artefacts, not source.
- For writers, a target whose value cannot be known before the command runs (``$(...)``,
  a variable set from one, ``xargs`` input) is allowed; a relative target while the
  working directory is unknown is not. A symlink created and written through in the
  same command is allowed; the next tool call resolves it and is refused.
- ``ov sling`` is passed through: it checks the caller's capability and place in the
  hierarchy itself, and its refusal is what the model should see.
- A shell command we cannot parse (an unclosed quote, ``$(`` or heredoc word) is denied
  for everyone with a reason; bash would reject nearly all of these too.
- Reading is never restricted: a reviewer may read another agent's worktree (but runs
  git only in its own).
- Tools this package does not know (MCP tools, new Claude tools) are allowed.

Modules, lowest first (each imports only the ones above it):

- ``chars``: the character tests the lexer and walker use instead of regular expressions
  (``re`` with what it imports would be a quarter of every `ov guard`'s CPU time).
- ``words``, ``shell``: the word lexer and the quote-aware scanner (``split_shell``).
- ``agent``: capabilities and the agent's path model (``_Agent``).
- ``effects``: ``_Effect`` and the other types the handlers share, the option parser.
- ``programs``: the handler table (loaded lazily) and ``_analyze``.
- ``walk``: ``check_shell``; expansion (``expand``), the working directory, variables.
- ``policy``: ``decide`` and the hook reply.
- handlers, imported on first use: ``python``, ``git``, ``ov``, ``filetools``,
  ``textproc``, ``builtins``, ``wrappers``, ``toolchains`` (with ``testopts``).
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
