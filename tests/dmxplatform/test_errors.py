from rest_framework import exceptions

from dmxplatform.errors import ServiceUnavailableError, drf_exception_handler


def test_validation_errors_name_the_field():
    response = drf_exception_handler(
        exceptions.ValidationError({"name": ["This field is required."]}), {}
    )
    assert response.status_code == 400
    assert response.data == {
        "error": {
            "message": "This field is required.",
            "type": "invalid_request_error",
            "param": "name",
            "code": "invalid_request",
        }
    }


def test_throttling_keeps_retry_after():
    response = drf_exception_handler(exceptions.Throttled(wait=7), {})
    assert response.status_code == 429
    assert response.headers["Retry-After"] == "7"
    assert response.data["error"]["code"] == "throttled"


def test_application_errors_keep_status_code_and_headers():
    error = ServiceUnavailableError("busy", code="no_capacity", headers={"Retry-After": "2"})
    response = drf_exception_handler(error, {})
    assert (response.status_code, response.headers["Retry-After"]) == (503, "2")
    assert response.data["error"]["code"] == "no_capacity"


def test_unexpected_errors_become_a_500_in_the_same_shape():
    response = drf_exception_handler(RuntimeError("boom"), {"view": None})
    assert response.status_code == 500
    assert response.data["error"]["type"] == "server_error"
    assert "boom" not in response.data["error"]["message"]
