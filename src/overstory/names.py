"""Validation of names that become branch names, paths and tmux session names."""

from __future__ import annotations

import re

from overstory.errors import InvalidName

NAME_RULE = "lower-case letters, digits, '-', '_' and '.', not starting with '-' or '.', at most 64 characters"
# \A…\Z, not ^…$: "$" also matches before a final newline, so "x\n" would pass.
_NAME = re.compile(r"\A[a-z0-9_][a-z0-9._-]{0,63}\Z")


def validate_name(value: str, what: str = "name") -> str:
    if not _NAME.match(value or "") or ".." in value or value.endswith((".lock", ".")):
        raise InvalidName(f"invalid {what} {value!r}: use {NAME_RULE}")
    return value
