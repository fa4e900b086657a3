from __future__ import annotations

from overstory.cli.main import main

main()
