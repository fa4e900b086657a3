"""An agent's authenticated channel to ov (docs/security.md).

- ``client``: the agent's side, standard library only (hot: `ov mail send/check`).
- ``server``: the HTTP-over-unix-socket server its loop or tmux driver runs, with the per-turn secret.
- ``routes``: what an agent may ask, each checked against its capability and the hierarchy, each
  calling the same core function as the CLI.
"""
