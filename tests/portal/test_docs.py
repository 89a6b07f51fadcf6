"""The docs page: the base URL, the models with their context, examples with the key's prefix."""

from __future__ import annotations

from django.urls import reverse

from apps.models.choices import ModelKind
from apps.models.models import LlmModel
from tests.keys.factories import make_api_key
from tests.models.factories import make_model
from tests.portal.conftest import table


def test_the_docs_name_the_base_url_models_and_key(owner, settings):
    settings.DMX_PUBLIC_API_URL = ""
    make_model("docs-model-a", max_context_tokens=4096)
    make_model("docs-model-b", max_context_tokens=1024)
    retired, _ = make_model("docs-model-old")
    LlmModel.objects.filter(id=retired.id).update(is_active=False)
    key, secret = make_api_key(owner.tenant, allowed_models=["docs-model-b"])

    html = owner.client.get(reverse("portal:docs")).content.decode()

    assert '<code id="base-url">http://testserver/v1</code>' in html
    models = table(html, "models-table")
    assert '<code>docs-model-a</code></td><td class="num">4,096' in models
    assert '<code>docs-model-b</code></td><td class="num">1,024' in models
    assert "docs-model-old" not in models
    hint = f"sk-dmx-{key.key_id}_..."
    curl = html[html.index('id="example-curl"') :]
    assert f'DMX_API_KEY="{hint}"' in curl and "http://testserver/v1/chat/completions" in curl
    python = html[html.index('id="example-python"') :]
    assert f'api_key="{hint}"' in python and 'base_url="http://testserver/v1"' in python
    # The example names a model the key may use.
    assert 'model="docs-model-b"' in python
    assert secret.partition("_")[2] not in html
    # Anthropic's client takes the base URL without /v1 (it adds /v1/messages itself).
    anthropic = html[html.index('id="example-anthropic"') :]
    assert 'base_url="http://testserver"' in anthropic and 'model="docs-model-b"' in anthropic
    endpoints = table(html, "endpoints-table")
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"):
        assert f"<code>POST {path}</code>" in endpoints


def test_examples_name_a_model_of_the_right_kind(owner):
    """An embedding model is never the chat example, and gets an embeddings example of its own."""
    make_model("docs-embed", kind=ModelKind.EMBED)
    make_model("docs-chat")
    make_api_key(owner.tenant)

    html = owner.client.get(reverse("portal:docs")).content.decode()

    models = table(html, "models-table")
    assert "<code>docs-embed</code>" in models and "<td>embeddings</td>" in models
    curl = html[
        html.index('id="example-curl"') : html.index("</pre>", html.index('id="example-curl"'))
    ]
    assert '"model": "docs-chat", "messages"' in curl
    assert '"model": "docs-embed", "input"' in curl


def test_the_public_url_operators_set_wins(owner, settings):
    settings.DMX_PUBLIC_API_URL = "https://api.example.com/"
    html = owner.client.get(reverse("portal:docs")).content.decode()
    assert '<code id="base-url">https://api.example.com/v1</code>' in html
    settings.DMX_PUBLIC_API_URL = "https://api.example.com/v1"
    html = owner.client.get(reverse("portal:docs")).content.decode()
    assert '<code id="base-url">https://api.example.com/v1</code>' in html


def test_without_a_key_the_examples_say_where_one_goes(owner):
    html = owner.client.get(reverse("portal:docs")).content.decode()
    assert 'api_key="sk-dmx-..."' in html and reverse("portal:keys") in html
