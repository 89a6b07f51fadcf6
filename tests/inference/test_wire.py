import pytest

from inference.wire import EngineLoad, Heartbeat, Registration, WireError


def registration(**overrides) -> dict:
    data = {
        "name": "gpu-1",
        "url": "http://10.0.0.5:8000",
        "model": "llama",
        "version": "v1",
        "served_model_name": "llama",
        "max_model_len": 8192,
    }
    data.update(overrides)
    return data


def test_round_trip():
    parsed = Registration.from_dict(registration(resources={"kind": "cpu"}))
    assert Registration.from_dict(parsed.to_dict()) == parsed
    assert parsed.tokenizer_sha256 is None


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_model_len": "8192"}, "max_model_len"),
        ({"max_model_len": True}, "max_model_len"),  # bool is not an int on the wire
        ({"max_model_len": 0}, "max_model_len"),
        ({"url": "ftp://x"}, "url"),
        ({"model": ""}, "model"),
        ({"resources": []}, "resources"),
        ({"tokenizer_sha256": 5}, "tokenizer_sha256"),
    ],
)
def test_registration_rejects(overrides, field):
    with pytest.raises(WireError) as error:
        Registration.from_dict(registration(**overrides))
    assert error.value.field == field


def test_missing_field_is_named():
    data = registration()
    del data["served_model_name"]
    with pytest.raises(WireError, match="served_model_name: is required"):
        Registration.from_dict(data)


def test_unknown_fields_are_ignored_for_forward_compatibility():
    assert Registration.from_dict(registration(gpu_count=8)).name == "gpu-1"


def test_heartbeat_nested_errors_carry_their_path():
    with pytest.raises(WireError) as error:
        Heartbeat.from_dict({"status": "up", "engine": {"num_requests_running": "many"}})
    assert error.value.field == "engine.num_requests_running"
    with pytest.raises(WireError) as error:
        Heartbeat.from_dict({"status": "up", "engine": {"kv_cache_usage": 1.5}})
    assert error.value.field == "engine.kv_cache_usage"
    with pytest.raises(WireError) as error:
        Heartbeat.from_dict({"status": "sleeping"})
    assert error.value.field == "status"


def test_numbers_accept_ints_for_floats():
    heartbeat = Heartbeat.from_dict({"status": "up", "engine": {"kv_cache_usage": 1}})
    assert heartbeat.engine == EngineLoad(kv_cache_usage=1.0)


def test_body_must_be_an_object():
    with pytest.raises(WireError):
        Heartbeat.from_dict(["up"])
