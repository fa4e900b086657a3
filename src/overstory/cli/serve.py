"""`ov serve`: the HTTP API, live events and the web page (Starlette on uvicorn, imported only here)."""

from __future__ import annotations

import typing as t

import click

from overstory.cli._common import project_paths
from overstory.ui.serve.spec import help_text


@click.command(name="serve", epilog=help_text())
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback is reachable by others (a warning says so).")
@click.option("--port", type=click.IntRange(0, 65535), default=7321, show_default=True,
              help="Port to listen on (0 picks a free one).")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@click.option("--heartbeat", type=click.FloatRange(0.05, 3600), default=15.0, show_default=True,
              help="Seconds between keep-alive comments on /events/stream.")
def serve(host: str, port: int, open_browser: bool, heartbeat: float) -> None:
    """Serve the HTTP API, the live event stream and the web dashboard until Ctrl-C.

    It prints an address with the token (`.overstory/serve-token`, made by `ov init`
    or here) after `#`; open it to sign that browser tab in (the token never goes into
    a cookie). Scripts send `Authorization: Bearer TOKEN`.

    \b
    ov serve                          # http://127.0.0.1:7321/#token=...
    ov serve --port 0 --open          # any free port, and open the page
    curl -H "Authorization: Bearer $(cat .overstory/serve-token)" http://127.0.0.1:7321/api/agents
    ov serve --host 0.0.0.0           # reachable from your phone on the same network (plain HTTP!)
    """
    try:
        from overstory.ui.serve.server import is_loopback
        from overstory.ui.serve.server import serve as run_server
    except ImportError as exc:  # installed without its dependencies
        from overstory.errors import OrchestratorError

        raise OrchestratorError(f"ov serve needs starlette and uvicorn ({exc.name} is missing): "
                                "pip install 'starlette>=1.0' 'uvicorn>=0.30'") from None

    project = project_paths()
    if not is_loopback(host):
        click.echo(f"warning: listening on {host}: anyone who can reach this address and has the token can "
                   "steer your agents, and plain HTTP sends the token unencrypted; prefer an SSH tunnel or a "
                   "TLS proxy", err=True)

    def announce(listening: t.Any) -> None:
        click.echo(f"ov serve: {listening.url}")
        click.echo(f"  open that address to sign a browser tab in; API docs at {listening.base}/api/docs; "
                   "Ctrl-C stops")

    run_server(project, host=host, port=port, open_browser=open_browser, heartbeat=heartbeat, on_listening=announce)
    click.echo("ov serve: stopped")
