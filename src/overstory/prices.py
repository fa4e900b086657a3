"""Model prices: what a token costs, for the live estimate of a turn in progress.

A runtime reports a turn's real cost only when the turn ends (Claude's ``result``
carries ``total_cost_usd``). While it runs, ov prices the token usage the stream
reports with this table, so a budget can stop a turn *inside* the turn that crosses
it. The real figure replaces the estimate when the runtime gives one.

Prices are USD per million tokens. The built-in table was measured, not copied: the
real Claude Code CLI 2.1.330 was run against the mock Messages API
(``tests/mockapi.py``) with one million input, output, cache-read and cache-write
tokens per model, and the table holds what its own ``total_cost_usd`` said. Config
``prices`` adds entries or overrides these (``{model: {input_per_mtok, output_per_mtok,
cache_read_per_mtok?, cache_write_per_mtok?}}``); every runtime shares this module.

A model the table does not know is priced as the most expensive known model, so an
estimate errs on the side of stopping early, and the lookup says so.

Standard library only: the turn runner uses it on every streamed event.
"""

from __future__ import annotations

import re
import typing as t
from dataclasses import dataclass

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
}
ALIASES = {"opus": "claude-opus-5-5", "sonnet": "claude-sonnet-5-5", "haiku": "claude-haiku-5-5"}

_SUFFIX = re.compile(r"\[[^\]]*\]$")      # "claude-opus-4-8[1m]" (the context-window mark)
_DATE = re.compile(r"-\d{8}(-v\d+)?$")   # "claude-haiku-4-5-20251001"


class Tokens(t.NamedTuple):
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


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_read: float
    cache_write: float

    @classmethod
    def from_entry(cls, entry: t.Mapping[str, t.Any]) -> Price:
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


@dataclass(frozen=True)
class Lookup:
    """A model's price, and which table entry it came from; ``guessed`` when the model was unknown."""

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
            if hasattr(entry, "model_dump"):
                entry = entry.model_dump()
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
        candidates = [model, _SUFFIX.sub("", model)]
        candidates.append(_DATE.sub("", candidates[-1]))
        candidates.append(ALIASES.get(candidates[-1], candidates[-1]))
        for name in candidates:
            if name in self.prices:
                return Lookup(model, name, self.prices[name], guessed=False)
        # A longer name that starts with a known one ("claude-sonnet-4-5-foo"), longest first.
        base = candidates[-1]
        for name in sorted(self.prices, key=len, reverse=True):
            if base.startswith(name + "-"):
                return Lookup(model, name, self.prices[name], guessed=False)
        return Lookup(model, self.most_expensive, self.prices[self.most_expensive], guessed=True)

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
