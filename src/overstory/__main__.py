from __future__ import annotations

from overstory.cli.fast import main

main()
