"""Model prices: what a token costs, for every runtime.

Two uses. Claude Code reports a turn's real cost only when the turn ends (its
``result`` carries ``total_cost_usd``); while it runs, ov prices the usage the stream
reports, so a budget can stop a turn *inside* the turn that crosses it, and the real
figure replaces the estimate afterwards. The codex, gemini and opencode CLIs report
tokens but no dollars at all: ov prices their turns with the same table.

Prices are USD per million tokens. The Claude rows were measured, not copied: the real
Claude Code CLI 2.1.330 was run against the mock Messages API (``tests/mockapi.py``)
with one million input, output, cache-read and cache-write tokens per model, and the
table holds what its own ``total_cost_usd`` said. The other rows are the vendors'
published list prices (2025). Config ``prices`` adds entries or overrides these
(``{model: {input_per_mtok, output_per_mtok, cache_read_per_mtok?, cache_write_per_mtok?}}``).
A model is found by its exact name, then without a ``[...]`` suffix, a date suffix or
a ``provider/`` prefix, then by the longest listed name it starts with followed by
``-`` (``gpt-5-2025-08-07`` is priced as ``gpt-5``).

``PriceTable`` (the turn runner, budgets, `ov costs`) prices a model it does not know
as the most expensive known one, so a budget errs on the side of stopping early, and
says so. ``price_of``/``cost_usd`` answer only for listed models (None / 0.0 otherwise).

Standard library only: the turn runner uses it on every streamed event.
"""

from __future__ import annotations

import re
import typing as t
from collections.abc import Mapping

from overstory.records import Record

if t.TYPE_CHECKING:
    from typing import NamedTuple
else:  # typing's, without typing (deferred in an agent loop) and without compiling each field's annotation
    from overstory.records import NamedTuple

# Claude Code's defaults when no cache price is given: reads cost a tenth of input, writes 1.25x.
CACHE_READ_FACTOR = 0.1
CACHE_WRITE_FACTOR = 1.25

# Measured with claude 2.1.330 against the mock (see the module docstring). The aliases
# `opus`, `sonnet` and `haiku` resolved to the *-5-5 models in that version.
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "claude-opus-5-5": {"input_per_mtok": 4.0, "output_per_mtok": 20.0, "cache_read_per_mtok": 0.2,
                        "cache_write_per_mtok": 5.0},
    "claude-opus-5": {"input_per_mtok": 5.0, "output_per_mtok": 25.0, "cache_read_per_mtok": 0.5,
                      "cache_write_per_mtok": 6.25},
    "claude-opus-4-8": {"input_per_mtok": 5.0, "output_per_mtok": 25.0, "cache_read_per_mtok": 0.5,
                        "cache_write_per_mtok": 6.25},
    "claude-opus-4-7": {"input_per_mtok": 5.0, "output_per_mtok": 25.0, "cache_read_per_mtok": 0.5,
                        "cache_write_per_mtok": 6.25},
    "claude-opus-4-6": {"input_per_mtok": 5.0, "output_per_mtok": 25.0, "cache_read_per_mtok": 0.5,
                        "cache_write_per_mtok": 6.25},
    "claude-sonnet-5-5": {"input_per_mtok": 2.0, "output_per_mtok": 10.0, "cache_read_per_mtok": 0.1,
                          "cache_write_per_mtok": 2.5},
    "claude-sonnet-5": {"input_per_mtok": 2.0, "output_per_mtok": 10.0, "cache_read_per_mtok": 0.2,
                        "cache_write_per_mtok": 2.5},
    "claude-sonnet-4-6": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cache_read_per_mtok": 0.3,
                          "cache_write_per_mtok": 3.75},
    "claude-sonnet-4-5": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cache_read_per_mtok": 0.3,
                          "cache_write_per_mtok": 3.75},
    "claude-haiku-5-5": {"input_per_mtok": 0.5, "output_per_mtok": 0.5, "cache_read_per_mtok": 0.05,
                         "cache_write_per_mtok": 0.625},
    "claude-haiku-4-5": {"input_per_mtok": 1.0, "output_per_mtok": 5.0, "cache_read_per_mtok": 0.1,
                         "cache_write_per_mtok": 1.25},
    # Vendors' list prices (2025) for the runtimes whose CLI reports tokens only. Codex reports its cached
    # input apart (priced at the cache-read rate); the others' cached input is counted as input (an upper bound).
    "gpt-5": {"input_per_mtok": 1.25, "output_per_mtok": 10.0, "cache_read_per_mtok": 0.125},
    "gpt-5-codex": {"input_per_mtok": 1.25, "output_per_mtok": 10.0, "cache_read_per_mtok": 0.125},
    "gpt-5-mini": {"input_per_mtok": 0.25, "output_per_mtok": 2.0, "cache_read_per_mtok": 0.025},
    "gpt-5-nano": {"input_per_mtok": 0.05, "output_per_mtok": 0.40, "cache_read_per_mtok": 0.005},
    "gpt-4.1": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cache_read_per_mtok": 0.50},
    "gpt-4.1-mini": {"input_per_mtok": 0.40, "output_per_mtok": 1.60, "cache_read_per_mtok": 0.10},
    "o4-mini": {"input_per_mtok": 1.10, "output_per_mtok": 4.40, "cache_read_per_mtok": 0.275},
    "gemini-2.5-pro": {"input_per_mtok": 1.25, "output_per_mtok": 10.0},
    "gemini-2.5-flash": {"input_per_mtok": 0.30, "output_per_mtok": 2.50},
    "gemini-2.5-flash-lite": {"input_per_mtok": 0.10, "output_per_mtok": 0.40},
}
ALIASES = {"opus": "claude-opus-5-5", "sonnet": "claude-sonnet-5-5", "haiku": "claude-haiku-5-5"}

_SUFFIX = re.compile(r"\[[^\]]*\]$")      # "claude-opus-4-8[1m]" (the context-window mark)
_DATE = re.compile(r"-\d{8}(-v\d+)?$")   # "claude-haiku-4-5-20251001"


class Tokens(NamedTuple):
    """Token counts of one model's share of a turn."""

    input: int = 0        # not read from or written to the cache
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def __add__(self, other: object) -> Tokens:  # type: ignore[override]
        if not isinstance(other, Tokens):
            return NotImplemented
        return Tokens(*(a + b for a, b in zip(self, other)))

    @property
    def total(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_write


class Price(Record):
    """USD per million tokens."""

    __slots__ = ("input", "output", "cache_read", "cache_write")

    input: float
    output: float
    cache_read: float
    cache_write: float

    @classmethod
    def from_entry(cls, entry: t.Any) -> Price:
        """From a config entry (a mapping or a ``ModelPrice``) or an ``(input, output)`` pair."""
        if isinstance(entry, tuple):
            entry = {"input_per_mtok": entry[0], "output_per_mtok": entry[1]}
        elif not isinstance(entry, Mapping):
            entry = entry.model_dump() if hasattr(entry, "model_dump") else vars(entry)
        given_input = float(entry["input_per_mtok"])
        read = entry.get("cache_read_per_mtok")
        write = entry.get("cache_write_per_mtok")
        return cls(given_input, float(entry["output_per_mtok"]),
                   float(read) if read is not None else given_input * CACHE_READ_FACTOR,
                   float(write) if write is not None else given_input * CACHE_WRITE_FACTOR)

    def cost(self, tokens: Tokens) -> float:
        return (tokens.input * self.input + tokens.output * self.output + tokens.cache_read * self.cache_read
                + tokens.cache_write * self.cache_write) / 1_000_000

    def describe(self) -> str:
        return f"${self.input:g}/${self.output:g} per million input/output tokens"


class Lookup(Record):
    """A model's price, and which table entry it came from; ``guessed`` when the model was unknown."""

    __slots__ = ("model", "entry", "price", "guessed")

    model: str
    entry: str
    price: Price
    guessed: bool

    @property
    def note(self) -> str | None:
        if not self.guessed:
            return None
        return (f"unknown model {self.model!r}: priced as the most expensive known model, {self.entry} "
                f"({self.price.describe()}); add it to config `prices` for an exact estimate")


class PriceTable:
    """The built-in prices plus config ``prices`` (which add entries or override them)."""

    def __init__(self, configured: t.Mapping[str, t.Any] | None = None) -> None:
        merged: dict[str, Price] = {name: Price.from_entry(entry) for name, entry in DEFAULT_PRICES.items()}
        for name, entry in (configured or {}).items():
            merged[str(name)] = Price.from_entry(entry)
        self.prices = merged
        self.most_expensive = max(merged, key=lambda name: (merged[name].output, merged[name].input, name))
        self._cache: dict[str, Lookup] = {}

    def lookup(self, model: str | None) -> Lookup:
        key = model or "(unknown)"
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._find(key)
        return found

    def _find(self, model: str) -> Lookup:
        listed = self.listed(model)
        if listed is not None:
            return Lookup(model, listed, self.prices[listed], guessed=False)
        return Lookup(model, self.most_expensive, self.prices[self.most_expensive], guessed=True)

    def listed(self, model: str) -> str | None:
        """The table entry ``model`` is priced by, or None when no entry fits it."""
        candidates = [model, model.rpartition("/")[2]]
        candidates.append(_SUFFIX.sub("", candidates[-1]))
        candidates.append(_DATE.sub("", candidates[-1]))
        candidates.append(ALIASES.get(candidates[-1], candidates[-1]))
        for name in candidates:
            if name in self.prices:
                return name
        # A longer name that starts with a listed one ("gpt-5-mini-2025-08-07"), longest first.
        base = candidates[1]
        for name in sorted(self.prices, key=len, reverse=True):
            if base.startswith(name + "-"):
                return name
        return None

    def cost(self, usage: t.Mapping[str, Tokens]) -> tuple[float, list[str]]:
        """Dollars for ``{model: tokens}``, and a note for each model that had to be guessed."""
        total = 0.0
        notes = []
        for model, tokens in usage.items():
            if not tokens.total:
                continue
            found = self.lookup(model)
            total += found.price.cost(tokens)
            if found.note:
                notes.append(found.note)
        return total, notes

    def as_rows(self) -> list[dict[str, t.Any]]:
        return [{"model": name, "input_per_mtok": p.input, "output_per_mtok": p.output,
                 "cache_read_per_mtok": p.cache_read, "cache_write_per_mtok": p.cache_write}
                for name, p in sorted(self.prices.items())]


def price_of(model: str | None, configured: t.Mapping[str, t.Any] | None = None) -> tuple[float, float] | None:
    """(input, output) dollars per million tokens for ``model``, or None when it is not listed."""
    if not model:
        return None
    table = PriceTable(configured)
    name = table.listed(model)
    return None if name is None else (table.prices[name].input, table.prices[name].output)


def cost_usd(model: str | None, input_tokens: int, output_tokens: int,
             configured: t.Mapping[str, t.Any] | None = None) -> float:
    """What ``input_tokens`` and ``output_tokens`` of ``model`` cost; 0.0 for a model not listed."""
    price = price_of(model, configured)
    if price is None:
        return 0.0
    return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000
