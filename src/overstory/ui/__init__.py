"""Rich renderers for `ov watch`. Imported lazily: rich is never loaded by hot commands."""

from __future__ import annotations
