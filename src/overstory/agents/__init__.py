"""An agent's life: spawning, its per-agent loop and turns, tmux mode, stopping, the coordinator."""
