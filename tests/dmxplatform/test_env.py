import pytest
from django.core.exceptions import ImproperlyConfigured

from dmxplatform import env


def test_readers(monkeypatch):
    monkeypatch.setenv("DMX_T_INT", "7")
    monkeypatch.setenv("DMX_T_FLOAT", "0.25")
    monkeypatch.setenv("DMX_T_BOOL", "yes")
    monkeypatch.setenv("DMX_T_LIST", "a, b,,c")
    assert env.env_int("DMX_T_INT", 1) == 7
    assert env.env_float("DMX_T_FLOAT", 1.0) == 0.25
    assert env.env_bool("DMX_T_BOOL", False) is True
    assert env.env_list("DMX_T_LIST", []) == ["a", "b", "c"]
    assert env.env_int("DMX_T_UNSET", 3) == 3
    assert env.env_optional("DMX_T_UNSET") is None


@pytest.mark.parametrize(
    ("reader", "value"),
    [
        (lambda: env.env_int("DMX_T", 1), "seven"),
        (lambda: env.env_int("DMX_T", 1, minimum=2), "1"),
        (lambda: env.env_float("DMX_T", 1.0), "fast"),
        (lambda: env.env_bool("DMX_T", False), "maybe"),
    ],
)
def test_bad_values_fail_fast(monkeypatch, reader, value):
    monkeypatch.setenv("DMX_T", value)
    with pytest.raises(ImproperlyConfigured, match="DMX_T"):
        reader()


def test_required_string(monkeypatch):
    monkeypatch.delenv("DMX_T_REQUIRED", raising=False)
    with pytest.raises(ImproperlyConfigured, match="DMX_T_REQUIRED"):
        env.env_str("DMX_T_REQUIRED")
