"""The gateway's server command: its flags, a shutdown bound, idle connections."""

from config.serve import options


def test_the_gateways_shutdown_waits_longer_than_the_longest_request(settings):
    """uvicorn's default waits for ever; the bound follows the request timeout."""
    settings.DMX_REQUEST_TIMEOUT_SECONDS = 600
    settings.DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS = 30
    served = options(["--port", "9001", "--workers", "2"])
    assert served["timeout_graceful_shutdown"] == 630
    assert (served["port"], served["workers"], served["proxy_headers"]) == (9001, 2, False)


def test_the_gateway_keeps_idle_connections_longer_than_the_pools_in_front_of_it(settings):
    """Load balancers keep idle connections 60 s, httpx 5 s: the gateway must outlast them, and
    its protocol must not reset a connection that has a request waiting (issue 38)."""
    from uvicorn.importer import import_from_string
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    settings.DMX_GATEWAY_KEEPALIVE_SECONDS = 75
    served = options([])
    assert served["timeout_keep_alive"] == 75
    assert issubclass(import_from_string(served["http"]), HttpToolsProtocol)
