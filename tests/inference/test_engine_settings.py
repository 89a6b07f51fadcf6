"""The registry's engine settings as vLLM flags, the operator's own flags winning one by one,
and the worker's fetch of them (against a real local HTTP server; no vLLM started here)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from inference import worker as worker_module
from inference.engine import EngineConfig
from inference.hardware.engine_args import operator_flags
from inference.platform_client import PlatformClient, PlatformError
from inference.wire import EngineSettings, WireError
from inference.worker import Worker, parse_args
from tests.stack import free_port

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
EVERYTHING = EngineSettings(
    kind="embed", tool_call_parser="hermes", reasoning_parser="qwen3", chat_template=TEMPLATE
)


def config(tmp_path: Path, settings: EngineSettings | None, *operator: str) -> EngineConfig:
    return EngineConfig(
        model="/models/m",
        served_model_name="m",
        host="127.0.0.1",
        port=9000,
        run_dir=tmp_path / "run",
        extra_args=list(operator),
        settings=settings,
    )


def test_the_wire_type():
    assert EngineSettings.from_dict({}) == EngineSettings(kind="generate")
    assert EngineSettings.from_dict(EVERYTHING.to_dict()) == EVERYTHING
    assert EngineSettings.from_dict({"kind": "embed", "future_setting": 1}).kind == "embed"
    for bad, field in (({"kind": "rerank"}, "kind"), ({"tool_call_parser": 5}, "tool_call_parser")):
        with pytest.raises(WireError) as refused:
            EngineSettings.from_dict(bad)
        assert refused.value.field == field


def test_no_settings_no_flags(tmp_path):
    assert config(tmp_path, None).settings_args() == []
    assert config(tmp_path, EngineSettings()).settings_args() == []
    plain = config(tmp_path, EngineSettings()).command()
    assert not {"--runner", "--tool-call-parser", "--chat-template"} & set(plain)


def test_each_setting_becomes_its_flags(tmp_path):
    engine = config(tmp_path, EVERYTHING)
    template = str(tmp_path / "run" / "chat_template.jinja")
    assert engine.settings_args() == [
        "--runner", "pooling", "--convert", "embed",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--reasoning-parser", "qwen3",
        "--chat-template", template,
    ]  # fmt: skip
    command = engine.command()
    assert command[command.index("--tool-call-parser") + 1] == "hermes"
    # The chat template is written where the flag says, when the run directory is prepared.
    assert not Path(template).exists()
    engine.prepare_run_dir()
    assert Path(template).read_text() == TEMPLATE


HERMES = EngineSettings(tool_call_parser="hermes")


@pytest.mark.parametrize(
    ("settings", "operator", "kept"),
    [
        # Another parser: auto tool choice stays on, with theirs.
        (HERMES, ["--tool-call-parser", "mistral"], ["--enable-auto-tool-choice"]),
        # Auto tool choice off: named and required tool choices still parse with hermes.
        (HERMES, ["--no-enable-auto-tool-choice"], ["--tool-call-parser", "hermes"]),
        (EngineSettings(reasoning_parser="qwen3"), ["--reasoning-parser=deepseek_r1"], []),
        (EngineSettings(kind="embed"), ["--runner", "generate"], ["--convert", "embed"]),
    ],
)
def test_the_operators_flags_win_one_by_one(tmp_path, settings, operator, kept):
    engine = config(tmp_path, settings, *operator)
    assert engine.settings_args() == kept
    # The operator's arguments come last, as given.
    assert engine.command()[-len(operator) :] == operator
    flags = operator_flags(engine.command())
    for flag, value in operator_flags(operator).items():
        assert flags[flag] == value


def test_an_operators_chat_template_wins_and_ours_is_not_written(tmp_path):
    engine = config(tmp_path, EngineSettings(chat_template=TEMPLATE), "--chat-template", "/t.jinja")
    assert engine.settings_args() == []
    engine.prepare_run_dir()
    assert not (tmp_path / "run" / "chat_template.jinja").exists()


def test_the_recommendation_and_the_settings_together(tmp_path, monkeypatch):
    """On a CPU node the worker's vLLM command: the settings, the recommendation, then the
    operator's flags; what the operator sets appears once."""
    monkeypatch.setenv("DMX_NODE_TOKEN", "dmx-node-abcdefgh_secret")
    monkeypatch.setattr(worker_module, "open_backend", lambda: None)
    own = ["--model", str(tmp_path), "--run-dir", str(tmp_path / "run")]
    worker = Worker(
        parse_args([*own, "--", "--enforce-eager", "--tool-call-parser", "llama3_json"])
    )
    worker.engine.config.settings = EngineSettings(tool_call_parser="hermes")
    command = worker.engine.config.command()
    assert command.count("--tool-call-parser") == 1
    assert command[command.index("--tool-call-parser") + 1] == "llama3_json"
    assert command.index("--enable-auto-tool-choice") < command.index("--dtype")
    assert command.index("--dtype") < command.index("--enforce-eager")


class Platform(ThreadingHTTPServer):
    """Answers the engine-settings path of `known` versions; 404 for others."""

    daemon_threads = True

    def __init__(self, port: int, known: dict[tuple[str, str], dict]) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.known = known
        self.paths: list[str] = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Platform

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        assert self.headers["Authorization"] == "Bearer dmx-node-abcdefgh_secret"
        found = next(
            (
                settings
                for (model, version), settings in self.server.known.items()
                if self.path == f"/internal/v1/models/{model}/versions/{version}/engine"
            ),
            None,
        )
        status, body = (200, found) if found is not None else (404, {"error": {"code": "x"}})
        reply = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass


def serve(port: int, known: dict) -> Platform:
    server = Platform(port, known)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def platform() -> Iterator[Platform]:
    server = serve(free_port(), {("org%2Fm", "v%3A1"): EVERYTHING.to_dict()})
    yield server
    server.shutdown()
    server.server_close()


def test_the_client_fetches_a_versions_settings(platform):
    client = PlatformClient(f"http://127.0.0.1:{platform.server_port}", "dmx-node-abcdefgh_secret")
    assert client.engine_settings("org/m", "v:1") == EVERYTHING  # each part quoted whole
    with pytest.raises(PlatformError) as missing:
        client.engine_settings("org/m", "v2")
    assert missing.value.status == 404


def make_worker(port: int, monkeypatch, tmp_path) -> Worker:
    monkeypatch.setenv("DMX_NODE_TOKEN", "dmx-node-abcdefgh_secret")
    monkeypatch.setattr(worker_module, "open_backend", lambda: None)
    monkeypatch.setattr(worker_module, "RETRY_SECONDS", 0.05)
    argv = ["--model", str(tmp_path), "--name", "org/m", "--version", "v:1"]
    argv += ["--platform-url", f"http://127.0.0.1:{port}", "--run-dir", str(tmp_path / "run")]
    return Worker(parse_args(argv))


def test_the_worker_asks_until_the_platform_answers(monkeypatch, tmp_path, caplog):
    port = free_port()
    worker = make_worker(port, monkeypatch, tmp_path)
    later = threading.Timer(0.3, lambda: serve(port, {("org%2Fm", "v%3A1"): {"kind": "embed"}}))
    later.start()
    try:
        assert worker._engine_settings() == EngineSettings(kind="embed")
    finally:
        later.join()
    assert "fetching the engine settings failed" in caplog.text


def test_a_version_the_platform_does_not_know_starts_with_vllms_defaults(
    platform, monkeypatch, tmp_path
):
    worker = make_worker(platform.server_port, monkeypatch, tmp_path)
    worker.args.version = "v2"
    assert worker._engine_settings() == EngineSettings()


def test_a_worker_stopped_while_the_platform_is_down_fetches_nothing(monkeypatch, tmp_path):
    worker = make_worker(free_port(), monkeypatch, tmp_path)
    threading.Timer(0.2, worker.stopping.set).start()
    assert worker._engine_settings() is None


def test_the_registration_records_the_settings_it_started_with(platform, monkeypatch, tmp_path):
    worker = make_worker(platform.server_port, monkeypatch, tmp_path)
    monkeypatch.setattr(worker_module, "export_tokenizer", lambda model: None)
    monkeypatch.setattr(worker.engine, "max_model_len", lambda: 2048)
    assert worker._registration().engine_args["settings"] is None  # none fetched
    worker.engine.config.settings = worker._engine_settings()
    engine_args = worker._registration().engine_args
    assert engine_args["settings"] == {
        "kind": "embed",
        "tool_call_parser": "hermes",
        "reasoning_parser": "qwen3",
        "chat_template_sha256": hashlib.sha256(TEMPLATE.encode()).hexdigest(),
    }
    assert "--tool-call-parser" in engine_args["argv"]
