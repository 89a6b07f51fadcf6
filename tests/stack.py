"""Real processes for end-to-end tests: the gateway, Celery, and vLLM inference workers.

Each process runs in its own session and writes to a log under .run/test-logs, which a failing
test prints. Everything is stopped by process group, so no child outlives the test run.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each test run its own (scripts/test.sh): runs on other databases go side by side.
LOG_DIR = Path(os.environ.get("DMX_TEST_LOG_DIR") or ROOT / ".run" / "test-logs")
LOCKS = ROOT / ".run" / "locks"
PLATFORM_PYTHON = ROOT / ".venv" / "bin" / "python"
WORKER_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TINY_MODEL_DIR = ROOT / ".cache" / "models" / "dmx-tiny"
# The workers' engines' batch (--max-num-seqs): small, as two cores decode slowly.
MAX_NUM_SEQS = 16
# Eager mode starts in seconds; float32 keeps vLLM off its AMX path (see inference/tiny_model.py).
TINY_MODEL_VLLM_ARGS = (
    "--enforce-eager",
    "--dtype",
    "float32",
    "--max-num-seqs",
    str(MAX_NUM_SEQS),
)
# Structured outputs (json_schema, strict tool calls) by xgrammar, with no whitespace between JSON
# tokens: constrained decoding of random weights otherwise picks whitespace, which JSON allows
# anywhere, until max_tokens runs out (seen: 60 tokens of tabs and newlines, no closing brace).
TINY_STRUCTURED_OUTPUTS = '{"backend":"xgrammar","disable_any_whitespace":true}'
# vLLM with the tiny model starts in 16-40 s on two idle cores; the session's three engines
# starting together with one core taken by another process took 2.5 min (2026-12-07). A bound
# for a start that is broken, not slow: each wait returns as soon as its node registers.
WORKER_START_TIMEOUT = 420
# The processes run production's settings, not the suite's (dmxplatform/settings/test.py, which
# pytest-django puts in the environment they inherit): they are what the e2e tests test.
PLATFORM_SETTINGS = "dmxplatform.settings"


def gateway_argv(port: int) -> list[str]:
    """The gateway's command line: one process, as production runs it (config.serve)."""
    return [str(PLATFORM_PYTHON), "-m", "config.serve", "--port", str(port)]


def _celery_worker(queues: str, *extra: str) -> list[str]:
    """A Celery worker process on `queues`, without the broadcast steps production runs
    without (deploy/kubernetes/base/celery-worker.yaml)."""
    return [
        str(ROOT / ".venv" / "bin" / "celery"), "-A", "config", "worker",
        "--queues", queues, "--concurrency", "1", "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat", *extra,
    ]  # fmt: skip


def celery_argv(schedule: Path) -> list[str]:
    """Celery's command line: one worker process with beat, on every queue but batches'."""
    return _celery_worker("default,ledger,fleet", "--beat", "--schedule", str(schedule))


def batch_worker_argv() -> list[str]:
    """A batch worker's command line: the `batches` queue only, as production runs it
    (deploy/kubernetes/base/batch-worker.yaml); beat stays with the main worker."""
    return _celery_worker("batches", "--hostname", f"batches-{os.getpid()}@%h")


def machine_lock(name: str):
    """Hold a lock shared by every test run on this machine until the returned file closes."""
    LOCKS.mkdir(parents=True, exist_ok=True)
    handle = (LOCKS / f"{name}.lock").open("w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# How long a test waits for a Celery drain (every 0.5 s in tests) to have moved an entry into
# PostgreSQL. Generous: a loaded CI machine once held one past 15 s, and such a failure now
# reports the platform's state (tests/diagnostics.py).
DRAIN_TIMEOUT = 30


def wait_for(predicate, *, timeout: float, interval: float = 0.2, what: str = "condition"):
    """Poll until predicate() is truthy; return its value or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), sig)


class Service:
    """One long-running process with its own process group and log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = LOG_DIR / f"{name}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Service:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM the group, then SIGKILL what is left after `timeout`."""
        if self.process is None:
            return
        if self.process.poll() is None:
            _kill_group(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        _kill_group(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


class Worker(Service):
    """An inference worker; its vLLM server runs in a session of its own (see vllm.pid)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], run_dir: Path) -> None:
        super().__init__(name, argv, env)
        self.run_dir = run_dir

    def engine_pid(self) -> int | None:
        try:
            return int((self.run_dir / "vllm.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill_hard(self) -> None:
        """Kill the worker and its engine at once, as a crashed host would."""
        for pid in (self.engine_pid(), self.process.pid if self.process else None):
            if pid:
                _kill_group(pid, signal.SIGKILL)
        if self.process:
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 40) -> None:
        super().stop(timeout)
        pid = self.engine_pid()
        if pid:
            _kill_group(pid, signal.SIGKILL)


class Stack:
    """The platform's processes for one test session (or, `name`d, a test's private stack:
    its logs and Celery's schedule apart from the session's)."""

    def __init__(self, *, env: dict[str, str], name: str = "") -> None:
        self.env = {**env, "DJANGO_SETTINGS_MODULE": PLATFORM_SETTINGS}
        self.prefix = f"{name}-" if name else ""
        self.gateways: list[str] = []
        self.services: list[Service] = []

    @property
    def url(self) -> str:
        """The first gateway: workers register through it."""
        return self.gateways[0]

    def _add(self, service: Service) -> Service:
        self.services.append(service.start())
        return service

    def start_gateway(self) -> Service:
        """Start one more gateway replica; every replica shares the same Redis and database."""
        gateway, url = self.spare_gateway(f"{self.prefix}gateway-{len(self.gateways) + 1}")
        self.services.append(gateway)
        self.gateways.append(url)
        return gateway

    def spare_gateway(
        self, name: str, *, settings: dict[str, str] | None = None
    ) -> tuple[Service, str]:
        """A gateway process the stack does not count as a replica (a test may kill it), with
        `settings` over the stack's environment; the caller stops it."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gateway = Service(name, gateway_argv(port), {**self.env, **(settings or {})}).start()
        try:
            wait_for(lambda: _http_ok(url + "/health"), timeout=30, what=f"{name} /health")
        except TimeoutError:
            gateway.stop()
            raise
        return gateway, url

    def start_celery(self) -> Service:
        schedule = LOG_DIR / f"{self.prefix}celerybeat-schedule"
        return self._add(Service(f"{self.prefix}celery", celery_argv(schedule), self.env))

    def start_batch_worker(self) -> Service:
        """A batch worker the caller stops (a test may kill it mid-batch)."""
        return Service(f"{self.prefix}batch-worker", batch_worker_argv(), self.env).start()

    def start_worker(
        self,
        *,
        model_name: str,
        node_token: str,
        version: str = "v1",
        port: int | None = None,
        attach: str | None = None,
        advertise: str | None = None,
        drain_timeout: float = 10,
    ) -> Worker:
        """Start an inference worker; on `port` again (same node, same run directory) to
        restart one, or attached to the OpenAI-compatible server at `attach`; gateways reach it
        at `advertise` when given (a fault proxy in front of it). On SIGTERM it
        waits up to `drain_timeout` seconds for requests in flight (short: the session's stack
        stops in seconds)."""
        port = port or free_port()
        run_dir = ROOT / ".run" / "test-workers" / f"{model_name}-{version}-{port}"
        argv = [
            str(WORKER_PYTHON),
            "-m",
            "inference.worker",
            "--model",
            str(TINY_MODEL_DIR),
            "--name",
            model_name,
            "--version",
            version,
            "--port",
            str(port),
            "--node-name",
            f"test-{model_name}-{port}",
            "--platform-url",
            self.url,
            "--run-dir",
            str(run_dir),
            "--drain-timeout",
            str(drain_timeout),
            *(("--attach", attach) if attach else ()),
            *(("--advertise-url", advertise) if advertise else ()),
            "--",
            "--enforce-eager",
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            # JSON without optional whitespace: the tiny model's random weights would otherwise
            # fill a structured output's whitespace until max_tokens (TINY_STRUCTURED_OUTPUTS).
            "--structured-outputs-config",
            TINY_STRUCTURED_OUTPUTS,
        ]
        env = dict(
            self.env,
            DMX_NODE_TOKEN=node_token,
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            OMP_NUM_THREADS="1",
            # The engines share two cores with the gateways, Redis and PostgreSQL: below them,
            # a long generation cannot stall the platform (a full run once saw every Redis
            # read of both gateways time out for 20 s while one engine decoded twelve).
            DMX_ENGINE_NICE="10",
        )
        worker = Worker(f"{self.prefix}worker-{model_name}-{port}", argv, env, run_dir)
        self._add(worker)
        worker.port = port
        worker.node_name = f"test-{model_name}-{port}"
        return worker

    def stop(self) -> None:
        # Workers first, so that they can report themselves down to a live gateway.
        for service in reversed(self.services):
            service.stop()


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@functools.cache
def tiny_prompt_counter():
    """The tiny model's tokenizer and chat template, as the gateway counts with them."""
    from apps.models.tokenizers import PromptCounter

    directory = build_tiny_model()
    config = json.loads((directory / "tokenizer_config.json").read_text())
    return PromptCounter(
        tokenizer_json=(directory / "tokenizer.json").read_text(),
        chat_template=config["chat_template"],
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
    )


def _tiny_model_current() -> bool:
    """The tiny model is built, with the chat template the builder writes now."""
    from inference.tiny_model import CHAT_TEMPLATE

    try:
        config = json.loads((TINY_MODEL_DIR / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return (TINY_MODEL_DIR / "config.json").exists() and config.get(
        "chat_template"
    ) == CHAT_TEMPLATE


def build_tiny_model() -> Path:
    """Build the tiny model once, again when its chat template changed; later runs reuse it."""
    if _tiny_model_current():
        return TINY_MODEL_DIR
    with machine_lock("tiny-model"):  # a test run beside this one may be building it too
        if not _tiny_model_current():
            (TINY_MODEL_DIR / ".dmx-builder").unlink(missing_ok=True)
            subprocess.run(
                [str(WORKER_PYTHON), "-m", "inference.tiny_model", str(TINY_MODEL_DIR)],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
    return TINY_MODEL_DIR
