"""Which model an agent's turns ask for, and which provider's quota window it shares.

Apart from ``agents.turns`` so that `ov sling`, which settles both when it plans a spawn, need not import the
turn machinery (its executors, the stream parsers, the ledger).
"""

from __future__ import annotations

import typing as t

from overstory.errors import OrchestratorError
from overstory.runtimes import get_runtime, ollama

if t.TYPE_CHECKING:
    from overstory.config.model import Config


def model_choice(model: str | None, capability: str, config: Config,
                 environ: t.Mapping[str, str], runtime: str | None = None) -> tuple[str | None, dict[str, str]]:
    """``--model`` (or sling's) > config ``models[capability]`` > ``runtime.model``.

    ov's two built-in ``models`` entries (``DEFAULT_MODELS``: Claude aliases) are skipped for a
    runtime that does not speak Anthropic's API.

    ``provider/model`` routes the agent to that config ``providers`` entry: the runtime
    turns its ``base_url`` and the key held by the variable named in ``api_key_env``
    into its own environment (for claude: ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY).
    That variable must be set: falling back to whatever key the environment holds
    would send one provider's key to another's endpoint. Raises OrchestratorError on
    an unknown provider or a missing key.
    """
    from overstory.config.snapshot import DEFAULT_MODELS  # not from config: no pydantic in the loop

    adapter = get_runtime(runtime or config.runtime_for(capability))
    configured = config.models.get(capability)
    if configured and configured == DEFAULT_MODELS.get(capability) and "anthropic" not in adapter.protocols:
        configured = None  # ov's built-in default is a Claude alias: another CLI keeps its own default
    choice = model or configured or config.runtime.model
    extra: dict[str, str] = {}
    if choice and "/" in choice:
        provider_name, _, model_name = choice.partition("/")
        provider = config.providers.get(provider_name)
        if provider is None:
            known = ", ".join(sorted(config.providers)) or "none configured"
            raise OrchestratorError(f"model {choice!r} names provider {provider_name!r}, which is not in config "
                                    f"`providers` ({known})")
        if provider.protocol and adapter.protocols and provider.protocol not in adapter.protocols:
            raise OrchestratorError(f"provider {provider_name!r} speaks {provider.protocol}; the {adapter.name} runtime "
                                    f"needs {' or '.join(adapter.protocols)} (model {choice!r})")
        extra.update(adapter.provider_env(*ollama.endpoint(provider_name, provider, adapter.protocols, environ, choice)))
        return model_name or None, extra
    return choice, extra


def provider_of(model: str | None, capability: str, config: Config, runtime: str | None = None) -> str:
    """The quota window an agent shares: its config provider's name, else its runtime's own endpoint."""
    choice = model or config.models.get(capability) or config.runtime.model
    if choice and "/" in choice:
        return choice.partition("/")[0]
    return runtime or config.runtime.default
