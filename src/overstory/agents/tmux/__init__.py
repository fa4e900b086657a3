"""tmux mode: an agent's TUI in a session on the project's own tmux server."""
