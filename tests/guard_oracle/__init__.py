"""Frozen copies of code the guard replaced, kept as oracles for differential tests (see each module)."""
