from pathlib import Path

import pytest

from inference.worker import parse_args


def test_defaults_and_vllm_passthrough(monkeypatch):
    monkeypatch.delenv("DMX_WORKER_MODEL", raising=False)
    monkeypatch.setenv("DMX_NODE_TOKEN", "dmx-node-abcdefgh_secret")
    args = parse_args(["--model", "/models/llama", "--port", "9001", "--", "--dtype", "float32"])
    assert args.name == "/models/llama"  # public name defaults to the model
    assert args.version == "v1"
    assert args.advertise_url == "http://127.0.0.1:9001"
    assert args.node_name.endswith("-9001")
    assert args.run_dir == Path(".run") / "worker-9001"
    assert args.extra == ["--dtype", "float32"]
    assert args.node_token == "dmx-node-abcdefgh_secret"


def test_environment_supplies_what_flags_do_not(monkeypatch):
    monkeypatch.setenv("DMX_WORKER_MODEL", "org/model")
    monkeypatch.setenv("DMX_WORKER_MODEL_NAME", "chat-large")
    monkeypatch.setenv("DMX_NODE_TOKEN", "t")
    monkeypatch.setenv("DMX_WORKER_ADVERTISE_URL", "http://node-7.internal:8000")
    args = parse_args(["--version", "v2"])
    assert (args.model, args.name, args.version) == ("org/model", "chat-large", "v2")
    assert args.advertise_url == "http://node-7.internal:8000"


def test_the_node_token_comes_from_a_file_before_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DMX_NODE_TOKEN", "from-the-environment")
    secret = tmp_path / "token"
    secret.write_text("dmx-node-abcdefgh_fromfile\n")
    args = parse_args(["--model", "m", "--node-token-file", str(secret)])
    assert args.node_token == "dmx-node-abcdefgh_fromfile"


def test_the_node_token_is_never_taken_from_the_command_line(monkeypatch, capsys):
    """A command line is visible to every user of the host (`ps`), so there is no flag for it."""
    monkeypatch.delenv("DMX_NODE_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", "--node-token", "dmx-node-abcdefgh_secret"])
    with pytest.raises(SystemExit):
        parse_args(["--model", "m"])
    assert "a node token is required" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-5", "20", "ten"])
def test_an_engine_niceness_vllm_could_not_take_is_refused_at_once(monkeypatch, capsys, value):
    """Negative needs privileges the worker lacks: vLLM's launcher would die on it."""
    monkeypatch.setenv("DMX_NODE_TOKEN", "t")
    monkeypatch.setenv("DMX_ENGINE_NICE", value)
    with pytest.raises(SystemExit):
        parse_args(["--model", "m"])
    assert "--engine-nice" in capsys.readouterr().err
    monkeypatch.setenv("DMX_ENGINE_NICE", "10")
    assert parse_args(["--model", "m"]).engine_nice == 10
