"""``python -m overstory.runtimes.scripted``: run the scenario player (see ``player``)."""

from __future__ import annotations

import sys

from overstory.runtimes.scripted.player import main

sys.exit(main())
