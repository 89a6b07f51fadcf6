"""The inference worker: one vLLM engine, registered with the platform as a node.

    DMX_NODE_TOKEN=dmx-node-… python -m inference.worker --model DIR_OR_HUB_ID --name NAME \
        --version TAG --platform-url http://gateway:8000 [-- extra vLLM args]

The node token comes from DMX_NODE_TOKEN or from a file (--node-token-file, a mounted secret),
never from the command line, which every user of the host can read in `ps`.

Reads the node's GPUs (or CPU) and the model's shape, and starts vLLM with the engine arguments
recommended for them (inference/hardware/engine_args.py; the operator's own vLLM arguments win
flag by flag, and --no-recommend turns the recommendation off), and with what the platform's
registry says of the version (its kind, tool-call and reasoning parsers, chat template: fetched
before vLLM starts; the operator's arguments win over those too). Waits until vLLM is healthy,
uploads the tokenizer if the platform lacks it, registers with the recommendation and the
hardware view, then sends a heartbeat every few seconds with the engine's load and the
hardware's state. On SIGTERM or SIGINT it reports itself draining, lets in-flight requests
finish, stops the engine and reports itself down. Whatever way it ends, the engine's whole
process tree ends with it (inference.proctree).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from inference.engine import Engine, EngineConfig, EngineError
from inference.engine_metrics import EngineMonitor
from inference.hardware.detection import cpu_view, get_gpu_info
from inference.hardware.engine_args import (
    ModelShape,
    ModelShapeError,
    Recommendation,
    operator_flags,
    recommend,
)
from inference.hardware.nvml import NvmlBackend, open_backend
from inference.hardware.view import NodeView
from inference.kv_events import KvEventListener
from inference.platform_client import PlatformClient, PlatformError
from inference.tokenizer_export import export_tokenizer
from inference.wire import (
    EngineLoad,
    EngineSettings,
    Heartbeat,
    Registration,
    RegistrationAccepted,
    TokenizerUpload,
    tokenizer_digest,
)

logger = logging.getLogger("dmx.worker")

# Registration (and the fetch of the engine settings) is retried this often while the platform
# is unreachable, seconds.
RETRY_SECONDS = 2.0
# While draining, the engine's load is polled this often, seconds.
DRAIN_POLL_SECONDS = 0.2
# A draining node keeps serving at least this long: twice a gateway's state refresh interval.
DRAIN_MIN_SECONDS = 1.0


def _nice(value: str) -> int:
    """A niceness increment vLLM can take without privileges: 0 to 19."""
    try:
        nice = int(value)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 19, not {value!r}")
    return nice


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m inference.worker",
        description="Run a vLLM engine as a DMX platform node.",
        epilog="Arguments after `--` go to vLLM unchanged.",
    )
    parser.add_argument(
        "--model",
        default=_env("DMX_WORKER_MODEL"),
        required=not _env("DMX_WORKER_MODEL"),
        help="model directory or hub id",
    )
    parser.add_argument(
        "--name",
        default=_env("DMX_WORKER_MODEL_NAME"),
        help="the model's public name on the platform (default: --model)",
    )
    parser.add_argument(
        "--version",
        default=_env("DMX_WORKER_MODEL_VERSION", "v1"),
        help="the model version tag registered on the platform",
    )
    parser.add_argument("--host", default=_env("DMX_WORKER_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(_env("DMX_WORKER_PORT", "8100")))
    parser.add_argument(
        "--advertise-url",
        default=_env("DMX_WORKER_ADVERTISE_URL"),
        help="URL gateways reach this node at (default: http://HOST:PORT)",
    )
    parser.add_argument(
        "--attach",
        default=_env("DMX_WORKER_ATTACH_URL"),
        help="register an OpenAI-compatible server already running at this URL instead of "
        "starting vLLM (--model then only names the tokenizer)",
    )
    parser.add_argument(
        "--node-name",
        default=_env("DMX_WORKER_NODE_NAME"),
        help="node name on the platform (default: HOSTNAME-PORT)",
    )
    parser.add_argument("--platform-url", default=_env("DMX_PLATFORM_URL", "http://127.0.0.1:8000"))
    parser.add_argument(
        "--node-token-file",
        type=Path,
        default=_env("DMX_NODE_TOKEN_FILE"),
        help="read the node token from this file (default: the DMX_NODE_TOKEN variable)",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="vLLM's sockets, caches and temp files (default: .run/worker-PORT)",
    )
    parser.add_argument(
        "--start-timeout", type=float, default=float(_env("DMX_ENGINE_START_TIMEOUT", "600"))
    )
    parser.add_argument(
        "--drain-timeout", type=float, default=float(_env("DMX_DRAIN_TIMEOUT", "30"))
    )
    parser.add_argument(
        "--engine-nice",
        type=_nice,  # argparse applies it to the environment's default (a string) too
        metavar="0-19",
        default=_env("DMX_ENGINE_NICE", "0"),
        help="lower vLLM's CPU priority by this much (a CPU node: 10, so that vLLM's threads "
        "do not starve the worker's heartbeats; default 0)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=_env("DMX_OTLP_ENDPOINT"),
        help="an OTLP/HTTP collector's base URL: vLLM exports its request spans there, joining "
        "the gateway's traces (default: none, no tracing)",
    )
    parser.add_argument(
        "--no-recommend",
        action="store_true",
        help="start vLLM with the arguments after `--` only, without the recommended ones",
    )
    own, _, extra = _split_extra(argv)
    args = parser.parse_args(own)
    args.extra = extra
    args.node_token = _node_token(parser, args.node_token_file)
    args.name = args.name or args.model
    args.node_name = args.node_name or f"{socket.gethostname()}-{args.port}"
    args.advertise_url = args.advertise_url or args.attach or f"http://{args.host}:{args.port}"
    args.run_dir = args.run_dir or Path(".run") / f"worker-{args.port}"
    return args


def _node_token(parser: argparse.ArgumentParser, path: Path | None) -> str:
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            parser.error(f"cannot read the node token file: {exc}")
    else:
        token = (_env("DMX_NODE_TOKEN") or "").strip()
    if not token:
        parser.error("a node token is required: set DMX_NODE_TOKEN or pass --node-token-file")
    return token


def _split_extra(argv: list[str]) -> tuple[list[str], str, list[str]]:
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], "--", argv[index + 1 :]
    return argv, "", []


def _model_shape(model: str) -> ModelShape | None:
    try:
        return ModelShape.from_pretrained(model)
    except (ModelShapeError, OSError, ValueError) as exc:
        logger.warning(
            "cannot read the shape of %s (%s): recommending GPU settings only", model, exc
        )
        return None


def _visible_devices(view: NodeView, devices: list[int]) -> str:
    """Return CUDA_VISIBLE_DEVICES naming these GPUs by UUID, which CUDA and NVML order alike."""
    by_index = {gpu.index: gpu for gpu in view.gpus}
    uuids = [by_index[index].uuid for index in devices]
    return ",".join(uuids) if all(uuids) else ",".join(map(str, devices))


def _settings_summary(settings: EngineSettings) -> str:
    template = (
        f"{len(settings.chat_template)} characters" if settings.chat_template else "the tokenizer's"
    )
    return (
        f"kind {settings.kind}, tool-call parser {settings.tool_call_parser or 'none'}, "
        f"reasoning parser {settings.reasoning_parser or 'none'}, chat template {template}"
    )


def _settings_record(settings: EngineSettings | None) -> dict | None:
    """The settings for the node's record: the chat template by its hash, not its text."""
    if settings is None:
        return None
    template = settings.chat_template
    return {
        "kind": settings.kind,
        "tool_call_parser": settings.tool_call_parser,
        "reasoning_parser": settings.reasoning_parser,
        "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest() if template else None,
    }


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.nvml: NvmlBackend | None = open_backend()
        # The GPUs this worker may use: the operator's CUDA_VISIBLE_DEVICES, then the
        # recommendation's choice among them.
        self.visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.recommendation: Recommendation | None = None
        vllm_args, vllm_env = args.extra, {}
        if not args.attach and not args.no_recommend:
            view = self.hardware()
            self.recommendation = recommend(
                model=_model_shape(args.model), node=view, operator_argv=args.extra
            )
            vllm_args = self.recommendation.argv(args.extra)
            devices = self.recommendation.devices
            if view.kind == "gpu" and devices and len(devices) < len(view.gpus):
                self.visible = vllm_env["CUDA_VISIBLE_DEVICES"] = _visible_devices(view, devices)
        # The engine's KV-cache events tell gateways which prompt prefixes it holds, whoever
        # sent them; an operator's own --kv-events-config (or a server we do not start) wins.
        self.kv_events: KvEventListener | None = None
        if not args.attach and "--kv-events-config" not in vllm_args:
            self.kv_events = KvEventListener()
        self.engine = Engine(
            EngineConfig(
                model=args.model,
                served_model_name=args.name,
                host=args.host,
                port=args.port,
                run_dir=args.run_dir.resolve(),
                extra_args=vllm_args,
                env=vllm_env,
                attach_url=args.attach,
                otlp_endpoint=args.otlp_endpoint,
                nice=args.engine_nice,
                kv_events_endpoint=self.kv_events.endpoint if self.kv_events else None,
            )
        )
        self.platform = PlatformClient(args.platform_url, args.node_token)
        self.stopping = threading.Event()
        self.accepted: RegistrationAccepted | None = None
        self.registration: Registration | None = None
        self.tokenizer: TokenizerUpload | None = None
        self.monitor = EngineMonitor()
        self.last_load = EngineLoad()
        # An operator's drain, as the last heartbeat's answer told it: gateways send no new
        # requests while it holds, and the engine keeps serving those in flight.
        self.drained = False

    def hardware(self) -> NodeView:
        """Return the GPUs this worker uses, as NVML sees them now, or the CPU."""
        if self.nvml is None:
            return cpu_view()
        return get_gpu_info(backend=self.nvml, visible=self.visible)

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()
            self.nvml = None

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.kv_events is not None:
            self.kv_events.start()
        try:
            return self._serve()
        finally:
            # Every way out, an exception's included: nothing of vLLM may outlive the worker.
            self.engine.stop()
            if self.kv_events is not None:
                self.kv_events.stop()

    def _serve(self) -> int:
        if self.recommendation is not None:
            logger.info("engine: %s", self.recommendation.summary)
            if not self.recommendation.fits:
                logger.error(
                    "%s; pass --no-recommend to start vLLM anyway", self.recommendation.summary
                )
                return 1
        if not self.args.attach:
            settings = self._engine_settings()
            if settings is None:
                return 0  # stopped while the platform was unreachable
            self.engine.config.settings = settings
            logger.info(
                "engine settings of %s@%s: %s; vLLM flags from them: %s",
                self.args.name,
                self.args.version,
                _settings_summary(settings),
                " ".join(self.engine.config.settings_args()) or "none",
            )
        try:
            self.engine.start()
            self.engine.wait_healthy(self.args.start_timeout, cancelled=self.stopping)
        except EngineError as exc:
            logger.error("%s", exc)
            return 1
        logger.info("vLLM healthy at %s", self.engine.config.url)
        if self.stopping.is_set():
            return 0
        registration = self._registration()
        while not self.stopping.is_set() and not self._register(registration):
            self.stopping.wait(RETRY_SECONDS)
        while not self.stopping.is_set():
            if not self.engine.alive():
                logger.error("vLLM exited with code %s", self.engine.process.returncode)
                self._report("down", EngineLoad())
                return 1
            self._report("up", self._load())
            self.stopping.wait(self.accepted.heartbeat_seconds if self.accepted else RETRY_SECONDS)
        return self._drain()

    def _engine_settings(self) -> EngineSettings | None:
        """The registry's settings of this version, asked until the platform answers; vLLM's
        defaults when the version is not registered (registration then says so); None when
        stopped first."""
        while not self.stopping.is_set():
            try:
                return self.platform.engine_settings(self.args.name, self.args.version)
            except PlatformError as exc:
                if exc.status == 404:
                    logger.warning(
                        "the platform has no settings for %s@%s: vLLM's defaults apply",
                        self.args.name,
                        self.args.version,
                    )
                    return EngineSettings()
                logger.warning("fetching the engine settings failed: %s", exc)
            self.stopping.wait(RETRY_SECONDS)
        return None

    def _on_signal(self, signum: int, frame) -> None:
        logger.info("signal %s: draining", signal.Signals(signum).name)
        self.stopping.set()

    def _registration(self) -> Registration:
        upload = self.tokenizer = export_tokenizer(self.args.model)
        # The engine's flags as it runs: the recommendation's and the operator's (for an attached
        # server, what the operator declares after `--`).
        flags = operator_flags(self.engine.config.extra_args)
        max_num_seqs = flags.get("--max-num-seqs")
        return Registration(
            name=self.args.node_name,
            url=self.args.advertise_url,
            model=self.args.name,
            version=self.args.version,
            served_model_name=self.args.name,
            max_model_len=self.engine.max_model_len(),
            tokenizer_sha256=tokenizer_digest(upload) if upload else None,
            resources=self.hardware().to_dict(),
            engine_args={
                "argv": self.engine.config.command()[3:],
                "recommendation": self.recommendation.to_dict() if self.recommendation else None,
                # Gateways send request priorities only to engines that schedule by them.
                "scheduling_policy": flags.get("--scheduling-policy") or "fcfs",
                # Gateways count a node saturated by what waits beyond its batch.
                "max_num_seqs": int(max_num_seqs) if max_num_seqs else None,
                # The registry's settings it started with (None: attached, or none fetched).
                "settings": _settings_record(self.engine.config.settings),
            },
        )

    def _register(self, registration: Registration) -> bool:
        try:
            accepted = self.platform.register(registration)
            if accepted.tokenizer_wanted and self.tokenizer is not None:
                self.platform.upload_tokenizer(registration.tokenizer_sha256, self.tokenizer)
                accepted = self.platform.register(registration)
        except PlatformError as exc:
            logger.warning("registration failed: %s", exc)
            return False
        self.accepted = accepted
        self.registration = registration
        logger.info("registered as node %s (%s)", accepted.node_id, registration.name)
        return True

    def _load(self) -> EngineLoad:
        """The engine's load now; the last one read when vLLM is slow to answer.

        The read is bounded by the heartbeat period: a busy engine (on a CPU node its own threads
        can starve its API server) must not hold back the heartbeat that says the node is alive,
        nor be reported idle because its metrics came late.
        """
        period = self.accepted.heartbeat_seconds if self.accepted else RETRY_SECONDS
        try:
            text = self.engine.metrics_text(timeout=period)
        except OSError as exc:  # refused, reset, or timed out (TimeoutError is an OSError)
            logger.warning("could not read vLLM metrics: %s; reporting the last load", exc)
            return self.last_load
        self.last_load = self.monitor.observe(text, now=time.monotonic())
        if self.kv_events is not None:
            self.last_load.prefix_filter = self.kv_events.filter_text()
        return self.last_load

    def _report(self, status: str, load: EngineLoad) -> None:
        if self.accepted is None:
            return
        heartbeat = Heartbeat(status=status, engine=load, resources=self.hardware().to_dict())
        try:
            answer = self.platform.heartbeat(self.accepted.node_id, heartbeat)
        except PlatformError as exc:
            logger.warning("heartbeat failed: %s", exc)
            if exc.status == 404:  # the platform forgot us (a reset database): announce again
                self._register(self.registration)
            return
        self._drained_learn(answer.drained, load)

    def _drained_learn(self, drained: bool, load: EngineLoad) -> None:
        """Note an operator's drain or undrain, told by a heartbeat's answer, once per change."""
        if drained == self.drained:
            return
        self.drained = drained
        if drained:
            in_flight = load.num_requests_running + load.num_requests_waiting
            logger.info(
                "drained by an operator: no new requests will come; %d in flight", in_flight
            )
        else:
            logger.info("undrained by an operator: new requests will come again")

    def _drain(self) -> int:
        """Stop taking work, let in-flight requests finish, stop the engine, report down."""
        self._report("draining", self._load())
        start = time.monotonic()
        deadline = start + self.args.drain_timeout
        while self.engine.alive():
            # Gateways may route here until their next state refresh; wait that out first.
            settled = time.monotonic() - start >= DRAIN_MIN_SECONDS
            load = self._load()
            in_flight = load.num_requests_running + load.num_requests_waiting
            if settled and in_flight == 0:
                break
            if time.monotonic() >= deadline:
                # Said, because the clients of these requests get a broken connection.
                logger.warning(
                    "drain timeout (%.0f s) with %d requests in flight: stopping vLLM anyway",
                    self.args.drain_timeout,
                    in_flight,
                )
                break
            time.sleep(DRAIN_POLL_SECONDS)
        code = self.engine.stop()
        self._report("down", EngineLoad())
        logger.info("stopped (vLLM exit code %s)", code)
        return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = Worker(parse_args(sys.argv[1:] if argv is None else argv))
    try:
        return worker.run()
    finally:
        worker.close()


if __name__ == "__main__":
    sys.exit(main())
