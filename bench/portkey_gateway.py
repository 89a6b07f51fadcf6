"""Portkey's open-source AI gateway as the benchmark's second yardstick: a gateway people pick
for speed (Node, Hono), measured at every point beside the gateway and LiteLLM, on the same core,
against the same fake upstream, with the same load generator.

It runs as its README starts it (`npx @portkey-ai/gateway`, here the installed package's
`start-server.js --headless`: no console UI) with no config: the upstream is named in each
request's headers, as an OpenAI-compatible provider at a custom host. Its cheapest way to work:
no keys, budgets, guardrails, cache or logs. Its guard against requests to private addresses
would refuse the fake upstream on 127.0.0.1, which TRUSTED_CUSTOM_HOSTS allows.

It lives in .run/bench/portkey, installed by `bench/setup_portkey.sh`; the platform never uses it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / ".run" / "bench" / "portkey"
PACKAGE = DIR / "node_modules" / "@portkey-ai" / "gateway"


def available() -> bool:
    return (PACKAGE / "build" / "start-server.js").exists()


def version() -> str:
    return json.loads((PACKAGE / "package.json").read_text())["version"] if available() else "?"


def argv(port: int) -> list[str]:
    return ["node", str(PACKAGE / "build" / "start-server.js"), f"--port={port}", "--headless"]


def env() -> dict[str, str]:
    return dict(os.environ, TRUSTED_CUSTOM_HOSTS="127.0.0.1", NODE_ENV="production")


def headers(upstream_url: str) -> dict[str, str]:
    """A request's headers that send it to the fake upstream, an OpenAI-compatible API."""
    return {"x-portkey-provider": "openai", "x-portkey-custom-host": upstream_url + "/v1"}
