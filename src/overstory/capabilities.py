"""The capabilities and what each may do: the one place every layer reads them from.

Stdlib only and free of imports, so the hot paths (`ov guard`, `ov mail send`) and the
store may import it. The role files in ``agents/*.md`` say the same in words; test_docs
and test_coordinator keep them in step (a persistent role never sends a terminal mail).
"""

CAPABILITIES = ("coordinator", "lead", "scout", "builder", "reviewer", "merger", "monitor")

WRITERS = frozenset({"builder", "merger"})  # write in their own worktree and commit
READ_ONLY = frozenset(c for c in CAPABILITIES if c not in WRITERS)
SLINGERS = frozenset({"coordinator", "lead"})  # may `ov sling` children
NUDGERS = frozenset({"coordinator", "lead", "monitor"})  # may `ov nudge` other agents
STOPPERS = SLINGERS  # may `ov stop` other agents: their own descendants, and only slingers have any
MERGERS = frozenset({"coordinator", "merger"})  # may run `ov merge` (for agents below them)
CRITICS = frozenset({"reviewer", "scout"})  # may be an `ov loop` critic: read-only roles that judge work

# Persistent agents live as long as their run or the operator wants: no terminal mail ends them,
# they block no run summary, idle handling never nudges or stalls them, `ov wait` does not wait for them.
PERSISTENT = frozenset({"coordinator", "monitor"})

# Mail types that end an agent's task, by capability; persistent capabilities have none.
TERMINAL_MAIL_TYPES: dict[str, frozenset[str]] = {
    c: frozenset() if c in PERSISTENT else frozenset({"merged", "merge_failed"}) if c == "merger"
    else frozenset({"worker_done"}) for c in CAPABILITIES
}
