"""A version's engine settings in the registry: vLLM's parser names and a chat template that
compiles, checked before they are stored; the gateway counts with the template."""

from __future__ import annotations

import io
import json

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command

from apps.models.engine_settings import REASONING_PARSERS, TOOL_CALL_PARSERS
from apps.models.models import ModelVersion, Tokenizer
from apps.models.selectors import catalog_load, model_version_engine_settings
from apps.models.services import model_version_create, model_version_ensure, model_version_save
from dmxplatform.errors import NotFoundError
from inference.wire import EngineSettings
from tests.models.factories import make_model
from tests.stack import build_tiny_model

pytestmark = pytest.mark.django_db


def test_vllms_parsers_are_known():
    assert {"hermes", "llama3_json", "mistral", "qwen3_xml"} <= set(TOOL_CALL_PARSERS)
    assert {"qwen3", "deepseek_r1"} <= set(REASONING_PARSERS)


def test_a_version_takes_vllms_parsers_and_a_template_that_compiles():
    model, _ = make_model("settings-model")
    version = model_version_create(
        model=model,
        tag="v2",
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
        chat_template="{% for m in messages %}{{ m.content | tojson }}{% endfor %}",
    )
    version.refresh_from_db()
    assert (version.tool_call_parser, version.reasoning_parser) == ("hermes", "qwen3")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tool_call_parser", "hermes2", "no --tool-call-parser named 'hermes2'"),
        ("tool_call_parser", "qwen3", "no --tool-call-parser named 'qwen3'"),  # a reasoning one
        ("reasoning_parser", "hermes", "no --reasoning-parser named 'hermes'"),
        ("chat_template", "{% for m in messages %}{{ m }}", "does not compile"),
        ("chat_template", "{{ messages | no_such_filter }}", "does not compile"),
    ],
)
def test_what_vllm_would_refuse_is_refused_before_it_is_stored(field, value, message):
    _, version = make_model("settings-model")
    setattr(version, field, value)
    with pytest.raises(ValidationError) as refused:
        version.full_clean()
    assert list(refused.value.message_dict) == [field]
    assert message in refused.value.message_dict[field][0]
    with pytest.raises(ValidationError):
        model_version_save(version=version)
    assert getattr(ModelVersion.objects.get(id=version.id), field) == ""


def test_every_setting_in_error_is_named_at_once():
    _, version = make_model("settings-model")
    version.tool_call_parser = "nope"
    version.reasoning_parser = "nope"
    version.chat_template = "{{"
    with pytest.raises(ValidationError) as refused:
        version.full_clean()
    assert set(refused.value.message_dict) == {
        "tool_call_parser",
        "reasoning_parser",
        "chat_template",
    }


def test_the_engine_settings_of_a_version():
    make_model("embedder", kind="embed")
    make_model("tooled", tool_call_parser="llama3_json", chat_template="{{ messages }}")
    assert model_version_engine_settings(model_name="embedder", tag="v1") == EngineSettings(
        kind="embed"
    )
    assert model_version_engine_settings(model_name="tooled", tag="v1") == EngineSettings(
        kind="generate", tool_call_parser="llama3_json", chat_template="{{ messages }}"
    )
    with pytest.raises(NotFoundError):
        model_version_engine_settings(model_name="tooled", tag="v9")
    _, retired = make_model("tooled", version="v0")
    retired.is_active = False
    model_version_save(version=retired)
    with pytest.raises(NotFoundError):  # as registration answers for it
        model_version_engine_settings(model_name="tooled", tag="v0")


def test_ensuring_a_model_creates_what_is_missing_and_keeps_an_operators_parser():
    version = model_version_ensure(
        name="ensured", tag="v1", kind="embed", max_context_tokens=512, source="/m"
    )
    assert (version.model.kind, version.source, version.tool_call_parser) == ("embed", "/m", "")
    again = model_version_ensure(name="ensured", tag="v1", max_context_tokens=512)
    assert again.id == version.id and again.model.kind == "embed"
    assert (
        model_version_ensure(
            name="ensured", tag="v1", max_context_tokens=512, tool_call_parser="hermes"
        ).tool_call_parser
        == "hermes"
    )
    kept = model_version_ensure(
        name="ensured", tag="v1", max_context_tokens=512, tool_call_parser="mistral"
    )
    assert kept.tool_call_parser == "hermes"


def _tiny_tokenizer() -> Tokenizer:
    directory = build_tiny_model()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    return Tokenizer.objects.create(
        sha256="a" * 64,
        tokenizer_json=(directory / "tokenizer.json").read_text(),
        chat_template=config["chat_template"],
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
    )


OVERRIDE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def test_the_gateway_counts_with_the_newest_versions_template():
    tokenizer = _tiny_tokenizer()
    hello = [{"role": "user", "content": "hello"}]
    _, v1 = make_model("counted")
    make_model("plain")  # the same tokenizer, the tokenizer's template
    for version in (v1, ModelVersion.objects.get(model__name="plain")):
        version.tokenizer = tokenizer
        model_version_save(version=version)

    catalog = catalog_load(version=1)
    assert catalog.get("counted").counter.render_chat(hello).startswith("<|begin_of_text|>")
    assert catalog.get("counted").counter is catalog.get("plain").counter  # loaded once

    _, v2 = make_model("counted", version="v2", chat_template=OVERRIDE)
    v2.tokenizer = tokenizer
    model_version_save(version=v2)
    reloaded = catalog_load(version=2, previous=catalog)
    assert reloaded.get("counted").counter.render_chat(hello) == "[user] hello\n"
    assert reloaded.get("plain").counter is catalog.get("plain").counter  # kept from before
    assert len(reloaded.counters) == 2

    # Its template changed: counted with the new one, not the one loaded before.
    v2.chat_template = OVERRIDE.replace("[{{", "<{{")
    model_version_save(version=v2)
    changed = catalog_load(version=3, previous=reloaded)
    assert changed.get("counted").counter.render_chat(hello) == "<user] hello\n"
    # Retired, the version before it counts again, with the tokenizer's template.
    v2.is_active = False
    model_version_save(version=v2)
    retired = catalog_load(version=4, previous=changed)
    assert retired.get("counted").counter is catalog.get("plain").counter


def _change_form(admin_client, version: ModelVersion) -> tuple[str, dict]:
    url = f"/admin/models/modelversion/{version.id}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200
    form = page.context["adminform"].form
    data = {}
    for name in form.fields:
        value = form[name].value()
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                data[name] = "on"
            continue
        data[name] = json.dumps(value) if isinstance(value, list | dict) else value
    return url, data


def test_the_admin_edits_the_settings_through_the_service(admin_client):
    _, version = make_model("admin-model")
    url, data = _change_form(admin_client, version)
    page = admin_client.get(url).content.decode()
    assert '<option value="hermes">hermes</option>' in page
    assert '<option value="deepseek_r1">deepseek_r1</option>' in page

    refused = admin_client.post(url, {**data, "chat_template": "{% if %}"})
    assert refused.status_code == 200  # the form again, with the error
    assert "The template does not compile" in refused.content.decode()
    refused = admin_client.post(url, {**data, "tool_call_parser": "made-up"})
    assert "no --tool-call-parser named" in refused.content.decode()
    assert ModelVersion.objects.get(id=version.id).tool_call_parser == ""

    saved = admin_client.post(
        url,
        {
            **data,
            "tool_call_parser": "hermes",
            "reasoning_parser": "qwen3",
            "chat_template": "{{ x }}",
        },
    )
    assert saved.status_code == 302
    version.refresh_from_db()
    assert (version.tool_call_parser, version.reasoning_parser, version.chat_template) == (
        "hermes",
        "qwen3",
        "{{ x }}",
    )
    # The model's page lists its versions with their parsers.
    model_page = admin_client.get(f"/admin/models/llmmodel/{version.model_id}/change/")
    assert '<option value="hermes" selected>hermes</option>' in model_page.content.decode()


def test_the_command_that_seeds_a_local_setup():
    out = io.StringIO()
    call_command("model_ensure", "dev-embed", "--kind", "embed", "--source", "/m", stdout=out)
    assert out.getvalue().strip() == "dev-embed@v1 (embed)"
    call_command("model_ensure", "dev-embed", "--tool-call-parser", "hermes", stdout=out)
    assert ModelVersion.objects.get(model__name="dev-embed").tool_call_parser == "hermes"
    with pytest.raises(CommandError, match="no --tool-call-parser named 'nope'"):
        call_command(
            "model_ensure", "dev-other", "--model-version", "v2", "--tool-call-parser", "nope"
        )
