"""The watchdog: the one process that settles agents' states, and whole-machine recovery."""
