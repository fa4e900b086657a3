"""What a warm loop (``agents.warm_loop``) imports while it waits for its word: the modules its first turn would
import after it. Apart from ``warm_loop`` because ``ov sling`` imports that one, and these modules import sling.
"""

from __future__ import annotations


def warm_up(runtime: str | None) -> None:
    """Import, while waiting for the word, what the first turn would import after it (the turn machinery, the
    endpoint, the runtime's adapter and stream parser): all of it stays loaded for the loop's life anyway."""
    from overstory.agents import idle, turn_exec, turns  # noqa: F401
    from overstory.endpoint import hooks, routes, server  # noqa: F401
    from overstory.executors import local  # noqa: F401
    from overstory.store import mail_text, quota  # noqa: F401

    # The first turn's shim, started now that the imports are done and the loop only waits: ready by the launch.
    # Started as a sandboxed agent's are (watching this loop), the default; a turn that starts them otherwise,
    # or runs elsewhere, ends it unused (executors.local).
    local.start_early(die_with_submitter=True)
    if runtime:
        from overstory.errors import OrchestratorError
        from overstory.runtimes import get_runtime

        try:
            get_runtime(runtime).new_parser()
        except (OrchestratorError, ImportError):
            pass  # not a runtime ov knows: the turn says so
