"""Line-based three-way merging for tier 2, and the "nothing was lost" check.

Pure functions over bytes; no git. Tier 2 re-merges a conflicted file from its three
versions (base, ours = target, theirs = source) with its own diff3 walk and resolves a
region where both sides changed only when that loses nothing:

``identical``
    both sides made the same change;
``whitespace only``
    both sides' versions of the region differ only in whitespace (blank lines
    included); ours (the target's formatting) is kept;
``one side unchanged``
    looked at line by line, every base line was changed by at most one side and the
    two sides never insert at the same place (the typical "edits on adjacent lines"
    conflict git reports); both changes are applied;
``both sides only added``
    the region holds no base line: both sides only inserted lines at the same place
    (two builders appending to one file). Both insertions are kept whole, ours (the
    target's) first: the target holds what was merged before, and ``ov merge --all``
    merges in the order the branches became ready, so the earlier-ready branch comes
    first and nothing already on the target moves. Callers that must not combine
    blindly pass ``keep_both=False``.

Anything else (the same lines changed differently, a deletion against an edit) is
left unresolved.

``lost_lines`` is the verification every resolution (tier 2, union, model) must pass:
each line that ours or theirs added relative to base must still be in the result.
``duplicated_lines`` is tier 2's second check: no line may occur more often than the
base plus what each side added to it (a base line copied twice is a broken merge).
"""

from __future__ import annotations

import typing as t
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher

IDENTICAL = "identical"
WHITESPACE = "whitespace only"
ONE_SIDE = "one side unchanged"
BOTH_ADDED = "both sides only added (both kept, the target's first)"

Lines = list[bytes]


def split_lines(data: bytes) -> Lines:
    """Lines with their ``\\n`` kept; a final line without one stays as it is."""
    lines = data.split(b"\n")
    out = [line + b"\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def line_key(line: bytes) -> bytes:
    """A line's identity for whitespace-insensitive comparison (runs collapsed, ends trimmed)."""
    return b" ".join(line.split())


def _same_ignoring_whitespace(a: Lines, b: Lines) -> bool:
    return [k for k in map(line_key, a) if k] == [k for k in map(line_key, b) if k]


def _changes(base: Lines, other: Lines) -> list[tuple[int, int, Lines]]:
    """Non-equal regions of ``other`` against ``base`` as (base_start, base_end, new_lines)."""
    matcher = SequenceMatcher(None, base, other, autojunk=False)
    return [(i1, i2, other[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]


def _matches(base: Lines, other: Lines) -> dict[int, int]:
    matcher = SequenceMatcher(None, base, other, autojunk=False)
    mapping: dict[int, int] = {}
    for block in matcher.get_matching_blocks():
        for n in range(block.size):
            mapping[block.a + n] = block.b + n
    return mapping


@dataclass(frozen=True)
class Chunk:
    """One stretch of the diff3 walk; ``stable`` chunks are unchanged on both sides."""

    stable: bool
    base: Lines
    ours: Lines
    theirs: Lines


def diff3_chunks(base: Lines, ours: Lines, theirs: Lines) -> t.Iterator[Chunk]:
    """Walk the three versions, alternating stable runs and changed regions."""
    to_ours, to_theirs = _matches(base, ours), _matches(base, theirs)
    i = j = k = 0
    while True:
        run = 0
        while i + run < len(base) and to_ours.get(i + run) == j + run and to_theirs.get(i + run) == k + run:
            run += 1
        if run:
            lines = base[i : i + run]
            yield Chunk(True, lines, lines, lines)
            i, j, k = i + run, j + run, k + run
        sync = i
        while sync < len(base) and not (sync in to_ours and sync in to_theirs):
            sync += 1
        if sync == len(base):
            if i < len(base) or j < len(ours) or k < len(theirs):
                yield Chunk(False, base[i:], ours[j:], theirs[k:])
            return
        # Both sides keep base[sync] (the matching is monotone, so their indexes are ahead of j, k).
        yield Chunk(False, base[i:sync], ours[j : to_ours[sync]], theirs[k : to_theirs[sync]])
        i, j, k = sync, to_ours[sync], to_theirs[sync]


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two base ranges (insertions are empty ranges) touch the same base lines or spot."""
    (a1, a2), (b1, b2) = a, b
    if a1 == a2 and b1 == b2:
        return a1 == b1
    if a1 == a2:
        return b1 < a1 < b2
    if b1 == b2:
        return a1 < b1 < a2
    return a1 < b2 and b1 < a2


def _apply_disjoint(base: Lines, ours: Lines, theirs: Lines) -> Lines | None:
    """Apply both sides' line-level changes if no base line or insertion point is claimed twice."""
    ours_ops, theirs_ops = _changes(base, ours), _changes(base, theirs)
    for o in ours_ops:
        for th in theirs_ops:
            if _overlap(o[:2], th[:2]):
                return None
    # Insertions sort before a replacement starting at the same base line.
    ops = sorted(ours_ops + theirs_ops, key=lambda op: (op[0], op[1] != op[0], op[1]))
    out: Lines = []
    pos = 0
    for start, end, new in ops:
        out.extend(base[pos:start])
        out.extend(new)
        pos = end
    out.extend(base[pos:])
    return out


@dataclass(frozen=True)
class Resolution:
    """The outcome of ``resolve_mechanically``: ``content`` is None when a region stayed in conflict."""

    content: bytes | None
    rules: frozenset[str]
    unresolved_regions: int


def resolve_mechanically(base: bytes, ours: bytes, theirs: bytes, *, keep_both: bool = True) -> Resolution:
    out: Lines = []
    rules: set[str] = set()
    unresolved = 0
    for chunk in diff3_chunks(split_lines(base), split_lines(ours), split_lines(theirs)):
        if chunk.stable:
            out.extend(chunk.base)
        elif chunk.ours == chunk.base:
            out.extend(chunk.theirs)
        elif chunk.theirs == chunk.base:
            out.extend(chunk.ours)
        elif chunk.ours == chunk.theirs:
            out.extend(chunk.ours)
            rules.add(IDENTICAL)
        elif _same_ignoring_whitespace(chunk.ours, chunk.theirs):
            out.extend(chunk.ours)
            rules.add(WHITESPACE)
        elif keep_both and not chunk.base:
            # No base line in the region: both sides only inserted here. Keep both, the target's first.
            out.extend(chunk.ours + chunk.theirs)
            rules.add(BOTH_ADDED)
        else:
            both = _apply_disjoint(chunk.base, chunk.ours, chunk.theirs)
            if both is None:
                unresolved += 1
            else:
                out.extend(both)
                rules.add(ONE_SIDE)
    if unresolved:
        return Resolution(None, frozenset(rules), unresolved)
    # git saw a conflict where this alignment sees only one-sided changes.
    return Resolution(b"".join(out), frozenset(rules or {ONE_SIDE}), 0)


def added_lines(base: bytes, other: bytes) -> Counter[bytes]:
    """Keys of the lines ``other`` added or rewrote relative to ``base`` (blank lines ignored)."""
    added: Counter[bytes] = Counter()
    for _, _, new in _changes(split_lines(base), split_lines(other)):
        added.update(k for k in map(line_key, new) if k)
    return added


def lost_lines(base: bytes, ours: bytes, theirs: bytes, result: bytes) -> list[str]:
    """Lines added on either side that the result no longer holds (empty list: nothing lost).

    A multiset check, whitespace-insensitive (see ``line_key``): for every line, the result
    must hold at least as many copies as either side added. A change made identically on
    both sides is therefore needed once, not twice.
    """
    needed = added_lines(base, ours) | added_lines(base, theirs)
    present = Counter(k for k in map(line_key, split_lines(result)) if k)
    return sorted(key.decode("utf-8", "replace") for key, count in needed.items() if present[key] < count)


def duplicated_lines(base: bytes, ours: bytes, theirs: bytes, result: bytes) -> list[str]:
    """Lines the result holds more often than the base plus what each side added (empty list: none).

    Whitespace-insensitive and blind to blank lines, like ``lost_lines``. A line both sides
    added may be there twice (each side's copy); a base line neither side added to may not.
    What a side added is counted from its diff against the base, not from the net change of a
    line's count: a side that removes one ``a`` and inserts another elsewhere added one.
    """
    base_keys = [k for k in map(line_key, split_lines(base)) if k]
    in_base = Counter(base_keys)
    added = [_inserted(base_keys, [k for k in map(line_key, split_lines(side)) if k]) for side in (ours, theirs)]
    present = Counter(k for k in map(line_key, split_lines(result)) if k)
    allowed = {key: in_base[key] + added[0][key] + added[1][key] for key in present}
    return sorted(key.decode("utf-8", "replace") for key, count in present.items() if count > allowed[key])


def _inserted(base: list[bytes], side: list[bytes]) -> Counter[bytes]:
    """The lines ``side`` inserts into ``base`` (the insert and replace blocks of their diff), by count."""
    found: Counter[bytes] = Counter()
    for op, _, _, start, end in SequenceMatcher(None, base, side, autojunk=False).get_opcodes():
        if op in ("insert", "replace"):
            found.update(side[start:end])
    return found


def marker_lines(text: bytes, *allowed_from: bytes) -> list[str]:
    """Conflict-marker lines in ``text`` that do not also occur in one of ``allowed_from``."""
    known = {line.rstrip(b"\r\n") for source in allowed_from for line in split_lines(source)}
    found = []
    for line in split_lines(text):
        bare = line.rstrip(b"\r\n")
        is_marker = bare == b"=======" or (
            bare[:7] in (b"<<<<<<<", b"|||||||", b">>>>>>>") and (len(bare) == 7 or bare[7:8] == b" ")
        )
        if is_marker and bare not in known:
            found.append(bare.decode("utf-8", "replace"))
    return found
