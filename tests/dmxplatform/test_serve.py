"""The gateway's server command: the flags the platform needs, and a shutdown bound."""

from dmxplatform.serve import options


def test_the_gateways_shutdown_waits_longer_than_the_longest_request(settings):
    """uvicorn's default waits for ever; the bound follows the request timeout."""
    settings.DMX_REQUEST_TIMEOUT_SECONDS = 600
    settings.DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS = 30
    served = options(["--port", "9001", "--workers", "2"])
    assert served["timeout_graceful_shutdown"] == 630
    assert (served["port"], served["workers"], served["proxy_headers"]) == (9001, 2, False)
