"""LocalProcessScaler's bookkeeping of worker processes, with a stand-in for the worker.

The stand-in is an executable put where the worker virtualenv's interpreter would be: it keeps
the command line it was given and, like the worker, exits on SIGTERM (or, told to, ignores it).
It starts in milliseconds; tests/routing/scaling/test_local_scaler.py runs the real worker.
"""

import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from apps.routing.choices import ScalerBackend
from apps.routing.scaling.errors import ScalingError
from apps.routing.scaling.local import LocalProcessScaler
from apps.routing.scaling.scalers import scaler_for
from tests.routing.scaling.factories import make_policy
from tests.stack import wait_for

MODEL = "org/unit-local:8b"  # a name with characters a file name must not hold
VLLM_ARGS = ["--", "--enforce-eager", "--dtype", "float32"]
IGNORE_SIGTERM = "--stand-in-ignores-sigterm"
STAND_IN = textwrap.dedent(
    f"""\
    #!{sys.executable}
    import json, signal, sys, time
    from pathlib import Path

    args = sys.argv[1:]
    run_dir = Path(args[args.index("--run-dir") + 1])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "argv.json").write_text(json.dumps(args))
    if "{IGNORE_SIGTERM}" in args:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(0.05)
    """
)


@pytest.fixture
def stand_in(tmp_path) -> Path:
    path = tmp_path / "worker-python"
    path.write_text(STAND_IN)
    path.chmod(0o755)
    return path


@pytest.fixture
def make_scaler(tmp_path, stand_in):
    made: list[LocalProcessScaler] = []

    def make(*, extra: list[str] = (), stop_grace: float = 60.0) -> LocalProcessScaler:
        scaler = LocalProcessScaler(
            model=MODEL,
            worker_arguments=[
                "--model",
                "/models/unit",
                "--drain-timeout",
                "5",
                *VLLM_ARGS,
                *extra,
            ],
            state_dir=tmp_path / "scaled",
            python=stand_in,
            environment={"DMX_NODE_TOKEN": "dmx-node-unit"},
            stop_grace=stop_grace,
        )
        made.append(scaler)
        return scaler

    yield make
    for scaler in made:
        for replica in scaler.replicas():
            os.kill(replica.pid, signal.SIGKILL)
        wait_for(lambda s=scaler: not s.replicas(), timeout=30, what="stand-ins to exit")


def argv_of(replica) -> list[str]:
    path = Path(replica.run_dir) / "argv.json"
    wait_for(path.exists, timeout=30, what=f"{path}")
    return json.loads(path.read_text())


def test_each_replica_gets_its_own_port_node_name_and_run_dir(make_scaler):
    scaler = make_scaler()

    scaler.scale_to(2)

    replicas = scaler.replicas()
    assert scaler.current_replicas() == len(replicas) == 2
    assert len({r.port for r in replicas}) == len({r.node_name for r in replicas}) == 2
    for replica in replicas:
        argv = argv_of(replica)
        own, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
        assert own[:2] == ["-m", "inference.worker"]
        assert own[own.index("--port") + 1] == str(replica.port)
        assert own[own.index("--node-name") + 1] == replica.node_name
        assert own[own.index("--name") + 1] == MODEL
        assert extra == VLLM_ARGS[1:]


def test_scaling_in_stops_the_newest_and_counts_it_no_more(make_scaler):
    scaler = make_scaler()
    scaler.scale_to(3)
    oldest_first = scaler.replicas()

    scaler.scale_to(1)

    assert scaler.current_replicas() == 1
    wait_for(lambda: len(scaler.replicas()) == 1, timeout=30, what="two stand-ins to exit")
    assert [r.pid for r in scaler.replicas()] == [oldest_first[0].pid]
    assert sorted(p.name for p in scaler.state_dir.glob("*.json")) == [
        f"{oldest_first[0].port}.json"
    ]


def test_another_process_counts_and_stops_the_replicas_by_their_records(make_scaler, monkeypatch):
    scaler = make_scaler()
    scaler.scale_to(2)
    # What a different Celery process has: no child processes, only the records.
    monkeypatch.setattr("apps.routing.scaling.local._children", {})
    other = make_scaler()

    assert other.current_replicas() == 2
    other.scale_to(0)
    assert other.current_replicas() == 0
    wait_for(lambda: not other.replicas(), timeout=30, what="the stand-ins to exit")


def test_dead_replicas_and_reused_pids_are_not_counted(make_scaler):
    scaler = make_scaler()
    scaler.scale_to(2)
    crashed, alive = scaler.replicas()
    os.kill(crashed.pid, signal.SIGKILL)
    # A record whose pid now belongs to another process (this one) that started at another time.
    impostor = json.loads((scaler.state_dir / f"{alive.port}.json").read_text())
    impostor.update(pid=os.getpid(), port=1, process_start="1", run_dir=str(scaler.state_dir / "1"))
    (scaler.state_dir / "1.json").write_text(json.dumps(impostor))

    wait_for(lambda: scaler.current_replicas() == 1, timeout=30, what="the crash to be noticed")

    assert [r.pid for r in scaler.replicas()] == [alive.pid]
    assert not (scaler.state_dir / "1.json").exists()
    assert not (scaler.state_dir / f"{crashed.port}.json").exists()


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(make_scaler):
    scaler = make_scaler(extra=[IGNORE_SIGTERM], stop_grace=0.5)
    scaler.scale_to(1)
    (replica,) = scaler.replicas()
    argv_of(replica)  # its SIGTERM handler is in place

    scaler.scale_to(0)

    wait_for(lambda: not scaler.replicas(), timeout=30, what="the stubborn stand-in to be killed")
    with pytest.raises(ProcessLookupError):
        os.kill(replica.pid, 0)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "arguments",
    [
        ["--model", "/m", "--port", "9000"],
        ["--model", "/m", "--node-name=x"],
        ["--name", "unit-local"],
        ["--model", "/m", "--name", "another-model"],
        "--model /m",
    ],
)
def test_worker_arguments_that_would_clash_are_refused(arguments):
    policy = make_policy("unit-local", backend=ScalerBackend.LOCAL, worker_arguments=arguments)

    with pytest.raises(ScalingError) as raised:
        scaler_for(policy)
    assert raised.value.param == "worker_arguments"
