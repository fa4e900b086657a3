"""Local models through an Ollama server: a ``providers`` entry with ``kind: ollama``.

Ollama serves an Anthropic-compatible API at its root (``POST /v1/messages``) and an OpenAI-compatible
one under ``/v1`` (chat completions, responses), so any runtime that speaks one of them can use it:
claude gets the root, the OpenAI-speaking CLIs (codex, opencode, kilo, qwen) get ``<root>/v1``; gemini
cannot. It needs no key (the runtimes are given ``ollama`` when ``api_key_env`` is unset), and its
models cost nothing: a turn on an Ollama provider keeps its token counts and is priced at $0.
``ov doctor`` checks that the server answers (``GET /api/tags``) and that every model the config
names on it is pulled.

Standard library only: the per-agent loop imports it.
"""

from __future__ import annotations

import typing as t

from overstory import jsontext
from overstory.errors import OrchestratorError

if t.TYPE_CHECKING:
    from overstory.config.model import Config, Provider

OLLAMA = "ollama"
DEFAULT_URL = "http://localhost:11434"
NO_KEY = "ollama"  # Ollama ignores the key; the CLIs want one
ZERO = {"input_per_mtok": 0.0, "output_per_mtok": 0.0, "cache_read_per_mtok": 0.0, "cache_write_per_mtok": 0.0}


def is_local(provider: Provider | None) -> bool:
    return provider is not None and provider.kind == OLLAMA


def endpoint(name: str, provider: Provider, protocols: t.Sequence[str], environ: t.Mapping[str, str],
             choice: str) -> tuple[str, str]:
    """(base URL, key) that route a runtime speaking ``protocols`` to provider ``name``. OrchestratorError
    when a key the provider needs is not set, or an Ollama provider speaks none of the runtime's protocols."""
    key = environ.get(provider.api_key_env or "")
    if not is_local(provider):
        if not key:
            raise OrchestratorError(f"provider {name!r} (model {choice!r}) takes its API key from "
                                    f"${provider.api_key_env}, which is not set")
        return provider.base_url, key
    root = provider.base_url.rstrip("/").removesuffix("/v1")
    if protocols and "anthropic" in protocols:
        return root, key or NO_KEY
    if not protocols or {"openai-chat", "openai-responses"} & set(protocols):
        return root + "/v1", key or NO_KEY
    raise OrchestratorError(f"provider {name!r} is an Ollama server, which speaks the Anthropic and OpenAI APIs; "
                            f"this runtime needs {' or '.join(protocols)} (model {choice!r})")


def priced_at_zero(config: Config, provider_name: str, model: str | None) -> Config:
    """``config`` with ``model`` priced at $0 when ``provider_name`` is an Ollama provider; else ``config``."""
    if not model or not is_local(config.providers.get(provider_name)):
        return config
    return t.cast("Config", _WithPrices(config, {**config.prices, model: dict(ZERO)}))


class _WithPrices:
    """A configuration (the pydantic one, or the loop's snapshot) seen with other ``prices``."""

    priced_at_zero = True  # the turn runner also zeroes what a CLI reports (Claude Code prices any model it runs)

    def __init__(self, config: t.Any, prices: dict[str, t.Any]) -> None:
        self._config = config
        self.prices = prices

    def __getattr__(self, name: str) -> t.Any:
        return getattr(self._config, name)


def pulled_models(base_url: str, timeout: float = 5.0) -> list[str]:
    """The models an Ollama server has pulled (``GET /api/tags``); OSError when it does not answer."""
    import urllib.error  # here, not at the top: it brings hashlib, email and http (the idle loop imports us)
    import urllib.request

    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/api/tags", timeout=timeout) as response:  # noqa: S310 (a configured URL)
            body = jsontext.loads(response.read().decode("utf-8") or "{}")
    except (urllib.error.URLError, ValueError) as exc:
        raise OSError(str(getattr(exc, "reason", exc))) from exc
    return [str(m.get("name") or m.get("model")) for m in body.get("models") or [] if isinstance(m, dict)]


def wanted_models(config: Config, provider_name: str) -> list[str]:
    """The models the config names on ``provider_name`` (``models`` and ``runtime.model``)."""
    choices = [*config.models.values(), config.runtime.model or ""]
    return sorted({c.partition("/")[2] for c in choices if c.startswith(provider_name + "/") and c.partition("/")[2]})


def has_model(pulled: t.Sequence[str], model: str) -> bool:
    """Ollama names a model ``name:tag``; a bare name means ``:latest``."""
    return model in pulled or (":" not in model and f"{model}:latest" in pulled)


def doctor_findings(config: Config) -> list[tuple[str, bool, str, str]]:
    """Per Ollama provider: (check name, ok, detail, hint)."""
    found = []
    for name, provider in sorted(config.providers.items()):
        if not is_local(provider):
            continue
        check = f"provider {name}"
        try:
            pulled = pulled_models(provider.base_url)
        except OSError as exc:
            found.append((check, False, f"the Ollama server at {provider.base_url} does not answer ({exc})",
                          "start it: ollama serve"))
            continue
        missing = [m for m in wanted_models(config, name) if not has_model(pulled, m)]
        if missing:
            found.append((check, False, f"Ollama at {provider.base_url} has not pulled {', '.join(missing)}",
                          " && ".join(f"ollama pull {m}" for m in missing)))
        else:
            found.append((check, True, f"Ollama at {provider.base_url}: {len(pulled)} model(s) pulled, priced at $0", ""))
    return found
