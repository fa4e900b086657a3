"""Local models through an Ollama server (``providers: {name: {kind: ollama}}``, overstory.runtimes.ollama).

Ollama is the model server and cannot be installed here, so its API is mocked on 127.0.0.1 (like
every other model API in these tests): ``GET /api/tags`` lists the pulled models. The agent run
against it (claude runtime, Ollama's Anthropic-compatible API) is in tests/e2e/test_ollama_provider.py.
"""

from __future__ import annotations

import json
import threading
import typing as t
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from conftest import run_ov
from overstory.config.model import Config, Provider
from overstory.errors import OrchestratorError
from overstory.paths import ProjectPaths
from overstory.project.doctor import check_local_providers
from overstory.runtimes.ollama import endpoint, priced_at_zero
from overstory.runtimes.prices import PriceTable, Tokens


class MockOllama:
    """``GET /api/tags`` of an Ollama server that has pulled ``models``."""

    def __init__(self, models: t.Sequence[str]) -> None:
        listing = {"models": [{"name": m, "model": m, "size": 1} for m in models]}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = json.dumps(listing if self.path == "/api/tags" else {}).encode()
                self.send_response(200 if self.path == "/api/tags" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: t.Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> MockOllama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_doctor_says_which_model_is_not_pulled_and_when_the_server_is_down() -> None:
    with MockOllama(["qwen3-coder:latest", "llama3.2:3b"]) as server:
        pulled = check_local_providers(Config(providers={"ollama": Provider(base_url=server.url, kind="ollama")},
                                              models={"builder": "ollama/qwen3-coder"}))
        missing = check_local_providers(Config(providers={"ollama": Provider(base_url=server.url + "/v1", kind="ollama")},
                                               models={"builder": "ollama/qwen3-coder", "scout": "ollama/gpt-oss:20b"}))
    assert [(c.name, c.status) for c in pulled] == [("provider ollama", "ok")]  # a bare name means :latest
    assert [(c.name, c.status) for c in missing] == [("provider ollama", "fail")]
    assert "gpt-oss:20b" in missing[0].detail and "qwen3-coder" not in missing[0].detail
    assert missing[0].hint == "ollama pull gpt-oss:20b"
    down = check_local_providers(Config(providers={"ollama": Provider(base_url=server.url, kind="ollama")}))
    assert down[0].status == "fail" and "does not answer" in down[0].detail and down[0].hint.endswith("ollama serve")


def test_ov_doctor_json_fails_on_a_missing_model(project: ProjectPaths) -> None:
    with MockOllama(["llama3.2:3b"]) as server:
        project.local_config_file.write_text(yaml.safe_dump({
            "providers": {"ollama": {"base_url": server.url, "kind": "ollama"}},
            "models": {"builder": "ollama/qwen3-coder"}}))
        result = run_ov("doctor", "--json", cwd=project.root)
    document = json.loads(result.stdout)
    (check,) = [c for c in document["checks"] if c["name"] == "provider ollama"]
    assert result.returncode != 0 and document["ok"] is False
    assert check["status"] == "fail" and "qwen3-coder" in check["detail"] and check["hint"] == "ollama pull qwen3-coder"


def test_each_runtime_gets_the_api_it_speaks_and_needs_no_key() -> None:
    local = Provider(base_url="http://gpu-box:11434/", kind="ollama")
    assert endpoint("ollama", local, ("anthropic",), {}, "ollama/m") == ("http://gpu-box:11434", "ollama")
    assert endpoint("ollama", local, ("openai-chat",), {}, "ollama/m") == ("http://gpu-box:11434/v1", "ollama")
    assert endpoint("ollama", local, ("openai-responses",), {"ANTHROPIC_API_KEY": "k"}, "ollama/m")[1] == "k"
    with pytest.raises(OrchestratorError, match="Ollama server"):
        endpoint("ollama", local, ("gemini",), {}, "ollama/m")
    remote = Provider(base_url="https://api.example", api_key_env="EXAMPLE_KEY")
    with pytest.raises(OrchestratorError, match=r"\$EXAMPLE_KEY, which is not set"):
        endpoint("remote", remote, ("anthropic",), {}, "remote/m")


def test_a_model_on_ollama_is_priced_at_zero_and_only_there() -> None:
    config = Config(providers={"ollama": Provider(base_url="http://x:11434", kind="ollama"),
                               "paid": Provider(base_url="http://y", api_key_env="K")})
    tokens = Tokens(1_000_000, 1_000_000)
    free = priced_at_zero(config, "ollama", "qwen3-coder")
    assert PriceTable(free.prices).lookup("qwen3-coder").price.cost(tokens) == 0.0
    assert priced_at_zero(config, "paid", "qwen3-coder") is config
    assert PriceTable(config.prices).lookup("qwen3-coder").price.cost(tokens) > 0  # unknown: the dearest


def test_sling_provider_is_model_with_its_provider(project: ProjectPaths) -> None:
    bad = run_ov("sling", "builder", "t-1", "--provider", "ollama", cwd=project.root)
    assert bad.returncode != 0 and "--provider needs --model" in bad.stderr and "Traceback" not in bad.stderr
    unknown = run_ov("sling", "builder", "t-2", "--provider", "nowhere", "--model", "m", "--runtime", "scripted",
                     cwd=project.root)
    assert unknown.returncode != 0 and "'nowhere/m'" in unknown.stderr, unknown.stderr
