"""ov: a multi-agent worktree orchestrator.

Layers (tests/test_layers.py checks the first four by parsing the source):

- ``store/`` holds durable state and is the only code that writes SQL; it imports
  no other layer of ov (only the base modules ``clock``, ``errors``, ``names``, ``paths``).
- ``runtimes/`` (the programs behind an agent, one adapter each behind
  ``runtimes.base.Runtime``) never imports ``agents/``, ``cli/`` or ``ui/``.
- No import circles anywhere, lazy imports inside functions included.
- ``guards/`` and the hot modules of ``store/`` import only the standard library.
- No module over 600 lines.
- ``cli/`` and ``ui/`` are the only users of click and rich; ``agents/`` (an agent's
  life) sits on ``store/`` and ``runtimes/``; the watchdog, status, doctor and demo
  sit on top of those.
"""

from __future__ import annotations

__version__ = "0.1.0"
