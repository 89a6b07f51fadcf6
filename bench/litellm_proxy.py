"""LiteLLM's proxy as the benchmark's yardstick: the gateway the performance targets are a tenth of.

The targets (the README's Benchmarks section) were set against LiteLLM proxy 1.108 on "a machine
like ours"; this machine's speed moves by a factor of three between sessions, so the run measures
LiteLLM itself at every point, right after the direct and the DMX measurement, on the same core,
against the same fake upstream, with the same load generator. LiteLLM runs as its docs start it
for one worker (uvicorn, uvloop) with a master key and no database: its cheapest configuration,
since it then has no keys, budgets or spend logs to look up.

It lives in its own virtualenv, made by `bench/setup_litellm.sh`; the platform never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ROOT / ".venv-litellm" / "bin" / "python"
VERSION_FILE = ROOT / ".venv-litellm" / "litellm-version"
MASTER_KEY = "sk-bench-litellm-master-3c9e71f2a04b"


def available() -> bool:
    return PYTHON.exists()


def version() -> str:
    return VERSION_FILE.read_text().strip() if VERSION_FILE.exists() else "?"


def config(run_dir: Path, *, model: str, upstream_url: str) -> Path:
    """The proxy's config: one model, routed to the fake upstream as an OpenAI-compatible API."""
    path = run_dir / "litellm.yaml"
    path.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {upstream_url}/v1\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
    )
    return path


def argv(config_path: Path, port: int) -> list[str]:
    return [
        str(PYTHON.parent / "litellm"),
        "--config",
        str(config_path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]


def env() -> dict[str, str]:
    """The caller's environment without the platform's database and Redis: LiteLLM reads the same
    variable names and would start its own key database and caches from them."""
    base = {
        name: value
        for name, value in os.environ.items()
        if name != "DATABASE_URL" and not name.startswith("REDIS")
    }
    return dict(base, LITELLM_MASTER_KEY=MASTER_KEY, LITELLM_LOG="ERROR")
