"""Whether a shell command polls ov's mail (``sleep N; ov mail check``, a ``while`` loop around it, ``watch``).

An agent never needs to: mail to a headless agent starts its next turn, and a tmux agent is woken,
so a poll only burns turns (or holds a turn open until the shell tool's time limit). The agent's
loop records a ``mail_polling`` event when a tool call's command looks like one
(``agents.turn_stream``); the guard refuses it only when ``guards.mail_polling`` is ``refuse``.

One precompiled regular expression, standard library only (the guard may use it). Text quoted
after a message option (``--body "..."``, ``git commit -m '...'``) is removed first, so writing
about polling is not polling; code quoted for a shell (``bash -c 'while ...'``) is still seen.
"""

from __future__ import annotations

import re

_MAIL = r"\bov\b[^;&|\n]*?\bmail\s+(?:check|list)\b"
_SEPARATOR = r"(?:;|&&|\|\||\n)"
_NOT_DONE = r"(?:(?!\bdone\b)[\s\S])*?"
POLLING = re.compile(
    r"\b(?:while|until|for)\b" + _NOT_DONE + r"\bdo\b" + _NOT_DONE + _MAIL  # in a loop's body (before its `done`)
    + r"|\b(?:while|until)\b[^;\n]*?" + _MAIL
    + r"|\bwatch\b[^;&|\n]*?" + _MAIL  # watch [-n N] ov mail check
    + r"|\bsleep\s+[^;&|\n]*?" + _SEPARATOR + r"\s*" + _MAIL  # sleep N; ov mail check
    + r"|" + _MAIL + r"[^;&\n]*?" + _SEPARATOR + r"\s*sleep\b"  # ov mail check; sleep N
)
# What the agent reads when the guard refuses a poll (guards.mail_polling: refuse).
REFUSAL = ("ov: this command polls for mail, which you never need to do: mail to you starts your next turn by "
           "itself (a tmux agent is woken). Finish what you can and end your turn; to read mail that is already "
           "there, run `ov mail check` once, without sleep or a loop.")
EVENT_KIND = "mail_polling"
_MESSAGE_TEXT = re.compile(r"""(?:--(?:body|subject|payload|note|reason|prompt|message)|-m)(?:=|\s+)"""
                           r"""(?:"(?:[^"\\]|\\.)*"|'[^']*')""")


def polls_mail(command: str) -> bool:
    """True when ``command`` waits for ov mail by polling (see the module's docstring for the shapes)."""
    if "mail" not in command:
        return False
    return POLLING.search(_MESSAGE_TEXT.sub(" ", command)) is not None
