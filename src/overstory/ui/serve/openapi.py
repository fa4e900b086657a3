"""The OpenAPI 3.1 document and the readable docs page, both built from ``spec.ENDPOINTS``."""

from __future__ import annotations

import functools
import html
import re
import typing as t

from overstory import __version__
from overstory.ui.serve import bodies
from overstory.ui.serve.spec import ENDPOINTS, STATIC_PREFIX, Endpoint

PUBLIC_OPS = frozenset({"page", "api_docs", "openapi"})
DESCRIPTION = (
    "The HTTP API of `ov serve`: the same core functions as the `ov` commands. Every route but the page, its "
    "files, these docs and the webhook triggers (`/hooks/NAME`, which take their own secret) needs the token in `.overstory/serve-token`, as `Authorization: Bearer <token>`; "
    "`GET /events/stream` also takes `?ticket=` from `POST /api/events/ticket` (single use, 30 s), for browsers. "
    "No cookie carries a credential (a cookie would reach every port of this machine). Requests that change "
    "state and name a foreign Origin are refused. Errors are JSON `{\"error\": \"one line\"}`: 400/422 for a "
    "bad request, 401 without the token, 403 cross-origin, 404 for something that does not exist, 409 when the "
    "project's state refuses the action."
)
ERRORS = {"400": "bad request", "401": "missing or wrong token", "403": "cross-origin write refused",
          "404": "not found", "409": "refused by the project's current state", "422": "bad request body"}


def _parameter(param: t.Any) -> dict[str, t.Any]:
    schema: dict[str, t.Any] = {"type": param.type}
    if param.repeat:
        schema = {"type": "array", "items": schema}
    return {"name": param.name, "in": param.where, "required": param.where == "path", "description": param.description,
            "schema": schema, **({"explode": True} if param.repeat else {})}


def _operation(endpoint: Endpoint) -> dict[str, t.Any]:
    success: dict[str, t.Any] = {"description": "ok", "content": {endpoint.media: {}}}
    operation: dict[str, t.Any] = {
        "operationId": endpoint.op, "summary": endpoint.summary,
        "parameters": [_parameter(p) for p in endpoint.params],
        "responses": {str(endpoint.status): success, **{code: {"description": text} for code, text in ERRORS.items()}},
    }
    if endpoint.op in PUBLIC_OPS:
        operation["security"] = []
    elif endpoint.op == "webhook":
        operation["security"] = [{"webhook_secret": []}, {"webhook_secret_query": []}]
    elif endpoint.op == "event_stream":
        operation["security"] = [{"bearer": []}, {"ticket": []}]
    if endpoint.body:
        operation["requestBody"] = {"required": False, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{endpoint.body}"}}}}
    return operation


@functools.lru_cache(maxsize=1)
def document() -> dict[str, t.Any]:
    paths: dict[str, dict[str, t.Any]] = {}
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint)
    paths[STATIC_PREFIX + "/{file}"] = {"get": {"operationId": "static", "summary": "The page's files.",
                                                "parameters": [{"name": "file", "in": "path", "required": True,
                                                                "schema": {"type": "string"}}],
                                                "security": [], "responses": {"200": {"description": "the file"}}}}
    schemas = {name: model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
               for name, model in bodies.MODELS.items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "ov serve", "version": __version__, "description": DESCRIPTION},
        "paths": paths,
        "components": {"schemas": schemas, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "description": "the token in .overstory/serve-token"},
            "ticket": {"type": "apiKey", "in": "query", "name": "ticket",
                       "description": "from POST /api/events/ticket; only for GET /events/stream"},
            "webhook_secret": {"type": "http", "scheme": "bearer",
                               "description": "a webhook trigger's own secret; only for POST /hooks/{name}"},
            "webhook_secret_query": {"type": "apiKey", "in": "query", "name": "secret",
                                     "description": "the same secret in the address"}}},
        "security": [{"bearer": []}],
    }


def _text(text: str) -> str:
    """Escaped, with `code` in backticks shown as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


def _fields(model_name: str) -> str:
    schema = document()["components"]["schemas"][model_name]
    required = set(schema.get("required", []))
    rows = []
    for name, info in schema.get("properties", {}).items():
        kind = info.get("type") or " | ".join(str(option.get("type")) for option in info.get("anyOf", []))
        note = info.get("description", "")
        rows.append(f"<li><code>{html.escape(name)}</code> {html.escape(kind)}"
                    f"{' (required)' if name in required else ''}{': ' + html.escape(note) if note else ''}</li>")
    return "<ul>" + "".join(rows) + "</ul>" if rows else "<p>(an empty object, or no body)</p>"


@functools.lru_cache(maxsize=1)
def docs_page() -> str:
    sections = []
    for endpoint in ENDPOINTS:
        params = "".join(f"<li><code>{html.escape(p.name)}</code> ({p.where}, {p.type}"
                         f"{', repeatable' if p.repeat else ''}): {html.escape(p.description)}</li>"
                         for p in endpoint.params)
        body = f"<h4>JSON body</h4>{_fields(endpoint.body)}" if endpoint.body else ""
        sections.append(
            f'<section class="endpoint" id="{endpoint.op}"><h3><span class="method">{endpoint.method}</span> '
            f"<code>{html.escape(endpoint.path)}</code></h3><p>{_text(endpoint.summary)}</p>"
            f"{'<ul>' + params + '</ul>' if params else ''}{body}"
            f"<p class=\"muted\">answers {endpoint.status} ({html.escape(endpoint.media)})</p></section>")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>ov serve API</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="stylesheet" href="{STATIC_PREFIX}/app.css"></head><body class="docs"><main>'
        f"<h1>ov serve API <small>{__version__}</small></h1><p>{_text(DESCRIPTION)}</p>"
        '<p><a href="/api/openapi.json">OpenAPI document</a> · <a href="/">dashboard</a></p>'
        + "".join(sections) + "</main></body></html>"
    )
