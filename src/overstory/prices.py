"""Model prices: what a turn cost when the runtime reports tokens but not dollars.

Claude Code reports each turn's cost itself; the codex, gemini and opencode CLIs report
only tokens. ov then prices the tokens with this table: config ``prices`` entries
(``{model: {input_per_mtok, output_per_mtok}}``, US dollars per million tokens) over
the built-in list below. A model is found by its exact name, then without a
``provider/`` prefix, then by the longest listed name it starts with followed by ``-``
(``gpt-5-2025-08-07`` is priced as ``gpt-5``). Cached input tokens are priced as input
(an upper bound). An unknown model costs 0.0: the tokens are still recorded.

Standard library only.
"""

from __future__ import annotations

import typing as t

# List prices (USD per million tokens, input / output) as published by the vendors in 2025.
# They change: put the ones you pay in config `prices`, which wins over this list.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-5": (1.25, 10.0),
    "gpt-5-codex": (1.25, 10.0),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5-nano": (0.05, 0.40),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4.1-mini": (0.40, 1.60),
    "o4-mini": (1.10, 4.40),
    "gemini-2.5-pro": (1.25, 10.0),
    "gemini-2.5-flash": (0.30, 2.50),
    "gemini-2.5-flash-lite": (0.10, 0.40),
}


def _pair(entry: t.Any) -> tuple[float, float]:
    if isinstance(entry, tuple):
        return float(entry[0]), float(entry[1])
    if isinstance(entry, t.Mapping):
        return float(entry["input_per_mtok"]), float(entry["output_per_mtok"])
    return float(entry.input_per_mtok), float(entry.output_per_mtok)


def price_of(model: str | None, configured: t.Mapping[str, t.Any] | None = None) -> tuple[float, float] | None:
    """(input, output) dollars per million tokens for ``model``, or None when it is not listed."""
    if not model:
        return None
    table: dict[str, t.Any] = {**DEFAULT_PRICES, **(configured or {})}
    for name in (model, model.rpartition("/")[2]):
        if name in table:
            return _pair(table[name])
    bare = model.rpartition("/")[2]
    prefixes = [key for key in table if bare.startswith(key + "-")]
    if prefixes:
        return _pair(table[max(prefixes, key=len)])
    return None


def cost_usd(model: str | None, input_tokens: int, output_tokens: int,
             configured: t.Mapping[str, t.Any] | None = None) -> float:
    """What ``input_tokens`` and ``output_tokens`` of ``model`` cost; 0.0 for a model not listed."""
    price = price_of(model, configured)
    if price is None:
        return 0.0
    return (input_tokens * price[0] + output_tokens * price[1]) / 1_000_000
