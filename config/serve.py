"""Run the gateway: uvicorn with the flags the platform needs, and a shutdown bound that follows
the longest request.

    python -m config.serve [--host H] [--port P] [--workers N] [--log-level L]

On SIGTERM uvicorn stops accepting connections and waits for the requests in flight; the wait is
bounded at DMX_REQUEST_TIMEOUT_SECONDS plus DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS, so a stream is
never cut by a shutdown that could have waited for it, and a stuck one cannot hold the process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import uvicorn

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dmxplatform.settings")


def options(argv: list[str] | None = None) -> dict:
    """uvicorn's settings for this command line and the platform's settings."""
    from django.conf import settings

    parser = argparse.ArgumentParser(prog="python -m config.serve")
    parser.add_argument("--host", default=os.environ.get("DMX_GATEWAY_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("DMX_GATEWAY_PORT", "8000")))
    parser.add_argument(
        "--workers", type=int, default=int(os.environ.get("DMX_GATEWAY_WORKERS", "1"))
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    return {
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "loop": "uvloop",
        # httptools, with idle connections closed only when no request waits in them.
        "http": "dmxplatform.http_protocol:GatewayHttpProtocol",
        "timeout_keep_alive": settings.DMX_GATEWAY_KEEPALIVE_SECONDS,
        "lifespan": "on",
        "access_log": False,
        # The gateway reads X-Forwarded-For itself, from DMX_TRUSTED_PROXIES only.
        "proxy_headers": False,
        "log_level": args.log_level,
        "timeout_graceful_shutdown": int(
            settings.DMX_REQUEST_TIMEOUT_SECONDS + settings.DMX_GATEWAY_SHUTDOWN_MARGIN_SECONDS
        ),
    }


def main(argv: list[str] | None = None) -> None:
    # Where the gateway processes write their metrics for /metrics to sum, set before any of
    # them imports prometheus_client: a directory of this run's (files of an earlier run would
    # add old counts), unless PROMETHEUS_MULTIPROC_DIR names one a process manager empties.
    created = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        created = os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="dmx-metrics-")
    try:
        uvicorn.run("config.asgi:application", **options(argv))
    finally:
        if created:
            shutil.rmtree(created, ignore_errors=True)


if __name__ == "__main__":
    main()
