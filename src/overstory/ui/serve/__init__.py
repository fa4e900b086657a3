"""`ov serve`: the HTTP API, the live event stream and the web page.

- ``spec``: the route table (paths, parameters, bodies, what each route does), which
  `ov serve --help`, the OpenAPI document and the router are all built from;
- ``bodies``: the JSON request bodies, validated at the boundary;
- ``security``: the token, the one-time login URL, the same-origin check, the Host check;
- ``events``: one reader of events.db's cursor fanned out to every SSE client;
- ``routes``: thin handlers, each calling the core function the CLI calls;
- ``app`` and ``server``: the Starlette application and its uvicorn runner;
- ``static/``: the page (plain JavaScript, no build step).

Only `ov serve` imports this package; nothing on a hot path does.
"""

from __future__ import annotations
