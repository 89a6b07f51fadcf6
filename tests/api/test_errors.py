"""Every error under /api/v1/ has the platform's shape; the schema and its browsable docs."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import API, error_of
from tests.keys.factories import make_api_key

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("method", ["get", "post", "patch", "delete", "put"])
@pytest.mark.parametrize("path", ["", "nope", "keys/", "keys/SHOUTING", "keys/abc", "usage"])
def test_unknown_urls_are_a_404_in_the_error_shape(owner, method, path):
    response = getattr(owner.client, method)(f"{API}/{path}")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert error_of(response)["code"] == "not_found"


def test_unknown_urls_are_a_404_even_without_credentials():
    response = APIClient().get(f"{API}/no/such/thing")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"


def test_a_method_a_resource_does_not_have_is_a_405(owner):
    key, _ = make_api_key(owner.tenant)
    for response in (
        owner.client.delete(f"{API}/keys"),
        owner.client.put(f"{API}/keys/{key.key_id}", {}, format="json"),
        owner.client.get(f"{API}/keys/{key.key_id}/revoke"),
    ):
        assert response.status_code == 405
        error = error_of(response)
        assert (error["type"], error["code"]) == ("invalid_request_error", "method_not_allowed")


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b'{"name": ', "application/json", 400, "parse_error"),
        (b"[1, 2]", "application/json", 400, "invalid_request"),
        (b'"a string"', "application/json", 400, "invalid_request"),
        (b"name=x", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ],
)
def test_bodies_that_are_not_a_json_object_are_a_4xx(owner, body, content_type, status, code):
    response = owner.client.post(f"{API}/keys", body, content_type=content_type)
    assert response.status_code == status
    error = error_of(response)
    assert error["type"] == "invalid_request_error" and error["code"] == code


def test_the_schema_is_openapi_3_of_the_management_api_only():
    response = APIClient().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert all(path.startswith(f"{API}/") for path in schema["paths"])
    assert {f"{API}/keys", f"{API}/nodes/{{id}}/drain", f"{API}/usage/records"} <= set(
        schema["paths"]
    )
    assert "Error" in schema["components"]["schemas"]
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert {"401", "404"} <= codes, (method, path)
            for code in codes - {"200", "201", "204"}:
                content = operation["responses"][code]["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (path, code)


def test_the_docs_serve_swagger_ui_from_the_sidecar():
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "/api/schema/" in page
