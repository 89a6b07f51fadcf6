"""Autoscaling: where scalers act (Kubernetes, worker processes on this host) and who may alert."""

from pathlib import Path

from dmxplatform.env import BASE_DIR, env_float, env_optional, env_str

# Bearer token Alertmanager presents to /internal/v1/alerts/alertmanager; unset: webhook off (503).
DMX_ALERTMANAGER_TOKEN = env_optional("DMX_ALERTMANAGER_TOKEN")

# Kubernetes backend. A kubeconfig path wins; without one the in-cluster service account is
# used. DMX_KUBERNETES_HOST replaces the API server's URL: alone, it means an unauthenticated
# endpoint such as `kubectl proxy` (or the tests' stand-in API server).
DMX_KUBECONFIG = env_optional("DMX_KUBECONFIG")
DMX_KUBERNETES_HOST = env_optional("DMX_KUBERNETES_HOST")
# One call to the API server (connect plus read) gives up after this, seconds.
DMX_KUBERNETES_TIMEOUT_SECONDS = env_float("DMX_KUBERNETES_TIMEOUT_SECONDS", 10.0, minimum=0.5)

# Local backend: worker processes on this host.
# Pid files of the workers it started, one folder per model, so any Celery process can stop them.
DMX_SCALING_STATE_DIR = BASE_DIR / Path(env_str("DMX_SCALING_STATE_DIR", ".run/scaled"))
# The interpreter of the worker's virtualenv (its vLLM build clashes with the platform's pins).
DMX_SCALING_WORKER_PYTHON = BASE_DIR / Path(
    env_str("DMX_SCALING_WORKER_PYTHON", ".venv-vllm/bin/python")
)
# Given to the workers it starts as DMX_PLATFORM_URL and DMX_NODE_TOKEN, so that the token is in
# neither the database nor a command line; unset: the workers inherit this process's values.
DMX_SCALING_PLATFORM_URL = env_optional("DMX_SCALING_PLATFORM_URL")
DMX_SCALING_NODE_TOKEN = env_optional("DMX_SCALING_NODE_TOKEN")
# A stopped worker still running after this is killed with its engine, seconds: the worker's
# drain (DMX_DRAIN_TIMEOUT, 30 s) plus vLLM's stop grace (15 s), doubled.
DMX_SCALING_STOP_GRACE_SECONDS = env_float("DMX_SCALING_STOP_GRACE_SECONDS", 90.0, minimum=1.0)
