"""A scaler that starts and stops inference workers (`python -m inference.worker`) on this host.

Each replica is a worker in a session of its own, on its own port, with its own node name and
run directory. Its record (pid, port, node name) is a JSON file in DMX_SCALING_STATE_DIR/<model>/,
so that any process (any Celery worker, the admin, a test) can count and stop the replicas,
whichever process started them. The policy's row lock (services.scaling_evaluate) keeps two
processes from changing one model's replicas at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import orjson
from django.conf import settings

from apps.routing.models import ScalingPolicy
from apps.routing.scaling.errors import ScalingError
from dmxplatform.env import BASE_DIR

logger = logging.getLogger(__name__)

# The scaler chooses these per replica; a policy that set them would start clashing workers.
RESERVED_FLAGS = ("--port", "--node-name", "--run-dir", "--advertise-url", "--attach")
# Node.name's length.
NODE_NAME_MAX = 128
# Tries at finding a port that no replica of ours holds; the kernel rarely repeats one twice.
PORT_ATTEMPTS = 20
PROC = Path("/proc")
# Without /proc (macOS) liveness falls back to signal 0, which cannot tell a reused pid.
PROC_AVAILABLE = (PROC / "self" / "stat").exists()
# /proc states of a process that has exited but not been reaped yet.
EXITED_STATES = frozenset({"Z", "X"})

# Workers this process started: polled, so that they are reaped instead of lingering as zombies.
_children: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True)
class Replica:
    pid: int
    port: int
    node_name: str
    run_dir: str
    started_at: float
    # The kernel's start time of `pid`, from /proc: tells our worker from a later process that
    # happens to get the same pid.
    process_start: str | None = None
    stopping_since: float | None = None

    @property
    def stopping(self) -> bool:
        return self.stopping_since is not None


def split_arguments(arguments: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split worker arguments into the worker's own and vLLM's (after `--`)."""
    arguments = list(arguments)
    if "--" in arguments:
        index = arguments.index("--")
        return arguments[:index], arguments[index + 1 :]
    return arguments, []


def flag_value(arguments: Sequence[str], flag: str) -> str | None:
    """Return the value of `flag` (as `--flag value` or `--flag=value`), or None."""
    for index, argument in enumerate(arguments):
        if argument == flag and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith(flag + "="):
            return argument.split("=", 1)[1]
    return None


def arguments_problem(arguments: object, *, model: str) -> str | None:
    """Say what is wrong with a policy's worker arguments for `model`, or return None."""
    if not isinstance(arguments, list) or not all(isinstance(a, str) for a in arguments):
        return 'A JSON list of strings, e.g. ["--model", "/models/x", "--", "--dtype", "auto"].'
    own, _ = split_arguments(arguments)
    clashing = [f for f in RESERVED_FLAGS if any(a == f or a.startswith(f + "=") for a in own)]
    if clashing:
        return f"Remove {', '.join(clashing)}: the scaler sets them for each replica."
    if flag_value(own, "--model") is None:
        return "Name the weights with --model."
    name = flag_value(own, "--name")
    if name is not None and name != model:
        return f"--name must be the policy's model, {model}, or left out."
    return None


class LocalProcessScaler:
    """Counts, starts and stops one model's worker processes on this host."""

    def __init__(
        self,
        *,
        model: str,
        worker_arguments: Sequence[str],
        state_dir: Path,
        python: Path,
        environment: Mapping[str, str],
        stop_grace: float,
    ) -> None:
        self.model = model
        self.worker_arguments = list(worker_arguments)
        self.state_dir = state_dir
        self.python = python
        self.environment = dict(environment)
        self.stop_grace = stop_grace

    @classmethod
    def from_policy(cls, policy: ScalingPolicy) -> LocalProcessScaler:
        environment = {}
        if settings.DMX_SCALING_PLATFORM_URL:
            environment["DMX_PLATFORM_URL"] = settings.DMX_SCALING_PLATFORM_URL
        if settings.DMX_SCALING_NODE_TOKEN:
            environment["DMX_NODE_TOKEN"] = settings.DMX_SCALING_NODE_TOKEN
        return cls(
            model=policy.model.name,
            worker_arguments=policy.worker_arguments,
            state_dir=Path(settings.DMX_SCALING_STATE_DIR) / quote(policy.model.name, safe=""),
            python=Path(settings.DMX_SCALING_WORKER_PYTHON),
            environment=environment,
            stop_grace=settings.DMX_SCALING_STOP_GRACE_SECONDS,
        )

    def __str__(self) -> str:
        return f"local workers of {self.model}"

    def replicas(self) -> list[Replica]:
        """Return the live replicas, oldest first, stopping ones included.

        Forgets replicas that have exited (killing an engine a crashed worker left behind) and
        kills those still running `stop_grace` seconds after they were told to stop.
        """
        live = []
        for replica in sorted(self._records(), key=lambda r: r.started_at):
            if not _alive(replica.pid, replica.process_start):
                self._forget(replica)
                continue
            if replica.stopping and time.time() - replica.stopping_since > self.stop_grace:
                logger.warning("%s: worker %s ignored SIGTERM; killing it", self, replica.pid)
                _kill_group(replica.pid)
                _kill_engine(replica)
            live.append(replica)
        return live

    def current_replicas(self) -> int:
        return sum(1 for replica in self.replicas() if not replica.stopping)

    def scale_to(self, replicas: int) -> None:
        live = self.replicas()
        active = [replica for replica in live if not replica.stopping]
        taken = {replica.port for replica in live}
        for _ in range(replicas - len(active)):
            taken.add(self._start(taken).port)
        # The newest goes first: it has the coldest caches and the fewest requests in flight.
        for replica in reversed(active[replicas:]):
            self._stop(replica)

    def _start(self, taken: set[int]) -> Replica:
        port = _free_port(taken)
        node_name = f"{socket.gethostname()}-{port}-{quote(self.model, safe='')}"[:NODE_NAME_MAX]
        run_dir = self.state_dir / str(port)
        run_dir.mkdir(parents=True, exist_ok=True)
        own, extra = split_arguments(self.worker_arguments)
        if flag_value(own, "--name") is None:
            own += ["--name", self.model]
        argv = [
            str(self.python), "-m", "inference.worker", *own,
            "--port", str(port), "--node-name", node_name, "--run-dir", str(run_dir),
            *(["--", *extra] if extra else []),
        ]  # fmt: skip
        try:
            with (self.state_dir / f"{port}.log").open("ab") as log:
                process = subprocess.Popen(
                    argv,
                    cwd=BASE_DIR,
                    env={**os.environ, **self.environment},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # outlives the Celery process that started it
                )
        except OSError as exc:
            raise ScalingError(f"Could not start a worker for {self.model}: {exc}") from exc
        _children[process.pid] = process
        replica = Replica(
            pid=process.pid,
            port=port,
            node_name=node_name,
            run_dir=str(run_dir),
            started_at=time.time(),
            process_start=_process_start(process.pid),
        )
        self._write(replica)
        logger.info("%s: started worker %s as node %s", self, process.pid, node_name)
        return replica

    def _stop(self, replica: Replica) -> None:
        """Send SIGTERM: the worker reports itself draining, finishes its requests, stops vLLM
        and reports itself down."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(replica.pid, signal.SIGTERM)
        self._write(dataclasses.replace(replica, stopping_since=time.time()))
        logger.info("%s: stopping worker %s (node %s)", self, replica.pid, replica.node_name)

    def _path(self, port: int) -> Path:
        return self.state_dir / f"{port}.json"

    def _records(self) -> list[Replica]:
        records = []
        for path in self.state_dir.glob("*.json"):
            try:
                records.append(Replica(**orjson.loads(path.read_bytes())))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("%s: ignoring unreadable replica record %s: %s", self, path, exc)
        return records

    def _write(self, replica: Replica) -> None:
        """Replace the record atomically: readers in other processes never see half of one."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self._path(replica.port)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(dataclasses.asdict(replica)))
        os.replace(temporary, path)

    def _forget(self, replica: Replica) -> None:
        _kill_engine(replica)
        self._path(replica.port).unlink(missing_ok=True)
        # vLLM's caches and sockets go; the worker's log stays for whoever wants to know why.
        shutil.rmtree(replica.run_dir, ignore_errors=True)


def _free_port(taken: set[int]) -> int:
    for _ in range(PORT_ATTEMPTS):
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port
    raise ScalingError("No free port for another worker.")


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """Return the state and start time of `pid` from /proc, or None when it does not exist."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; the rest follows the last ")".
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _process_start(pid: int) -> str | None:
    stat = _proc_stat(pid) if PROC_AVAILABLE else None
    return stat[1] if stat else None


def _alive(pid: int, process_start: str | None) -> bool:
    """Say whether our worker `pid` still runs: not exited, not a zombie, not a reused pid."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[pid]
        return False
    if not PROC_AVAILABLE:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    stat = _proc_stat(pid)
    if stat is None:
        return False
    if stat[0] in EXITED_STATES:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return process_start is None or stat[1] == process_start


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(pid), signal.SIGKILL)


def _kill_engine(replica: Replica) -> None:
    """Kill the vLLM server a worker left behind (it runs in a session of its own)."""
    try:
        pid = int((Path(replica.run_dir) / "vllm.pid").read_text())
    except (OSError, ValueError):
        return
    try:
        command = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return  # gone, or no /proc to tell it from a process that reused the pid
    # Our engine listens on the replica's port: no other vLLM server on this host does.
    if b"vllm" in command and f"\0--port\0{replica.port}\0".encode() in command:
        _kill_group(pid)
