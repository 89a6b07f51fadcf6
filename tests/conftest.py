"""Session-wide fixtures: a clean Redis database, and the real platform processes for e2e tests."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from django.conf import settings
from django.db import connection
from pytest_django.plugin import blocking_manager_key

from apps.hardware.nodestate import NodeSnapshot, fleet_key
from apps.models.choices import ModelKind
from dmxplatform.redis_client import sync_redis
from tests import diagnostics
from tests import stack as stack_module
from tests.faults import OwnRedisCluster, TcpProxy
from tests.hardware.factories import make_node_token
from tests.http import call
from tests.keys.factories import make_api_key
from tests.models.factories import make_model

# A test that uses any of these (itself or through another fixture) starts the platform's
# processes and vLLM engines: it is marked e2e, and the fast lane (-m "not e2e") leaves it out.
ENGINE_FIXTURES = frozenset({"platform"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    e2e = pytest.mark.e2e
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """An e2e test that timed out waiting on the platform reports the platform's state then
    (tests/diagnostics.py): a stalled drain, a held lock or a backed-up queue shows there."""
    report = yield
    if (
        report.when == "call"
        and report.failed
        and call.excinfo is not None
        and call.excinfo.errisinstance(TimeoutError)
        and ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    ):
        with item.config.stash[blocking_manager_key].unblock():
            state = diagnostics.platform_state()
        report.sections.append(("platform state at the failure", state))
    return report


@pytest.fixture(scope="session")
def django_db_setup(
    django_test_environment, django_db_modify_db_settings, django_db_blocker
) -> Iterator[None]:
    """Always create the test database: e2e tests use it without Django's db fixtures."""
    from django.test.utils import setup_databases, teardown_databases

    with django_db_blocker.unblock():
        config = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        teardown_databases(config, verbosity=0)


@pytest.fixture(scope="session", autouse=True)
def _clean_redis() -> None:
    """Start from an empty Redis database; the suite owns the one REDIS_URL names."""
    assert settings.REDIS_URL.rsplit("/", 1)[-1] not in ("", "0"), (
        "the suite flushes its Redis database; point REDIS_URL at a spare one (scripts/test.sh)"
    )
    sync_redis().flushdb()


# Models the e2e stack serves; the second exists to be killed.
SERVED_MODELS = ("dmx-tiny", "dmx-tiny-b")
# The workers, by name: (model, version). dmx-tiny has two nodes, of two stable versions, so
# routing has a choice to make (and canaries a version to split off).
WORKERS = {
    "dmx-tiny": ("dmx-tiny", "v1"),
    "dmx-tiny-v2": ("dmx-tiny", "v2"),
    "dmx-tiny-b": ("dmx-tiny-b", "v1"),
}
# The served models' tool-call parser: the tiny model's chat template speaks Hermes.
TOOL_CALL_PARSER = "hermes"
# An embedding model: the tiny model run as a pooling model, by a worker started on first use
# (the `embed_worker` fixture), not with the session's stack.
EMBED_MODEL = "dmx-tiny-embed"
# In the catalog, never served: requests for it must get 503.
UNSERVED_MODEL = "dmx-unserved"
# In the catalog; tests register dead nodes for it.
BROKEN_MODEL = "dmx-broken"
TINY_CONTEXT = 2048
# Two replicas, so that shared limits and cache invalidation are tested across processes.
GATEWAY_REPLICAS = 2


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory) -> Iterator[OwnRedisCluster]:
    """A Redis Cluster of three masters for a module's tests (tests/faults.py)."""
    cluster = OwnRedisCluster(tmp_path_factory.mktemp("redis-cluster"), masters=3)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def private_redis(settings) -> Iterator[str]:
    """Give a test its own Redis key prefix, apart from the e2e processes' state; clean it up."""
    prefix = settings.DMX_REDIS_PREFIX = f"dmxtest-{uuid.uuid4().hex[:10]}"
    yield prefix
    client = sync_redis()
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)


@dataclass
class Seed:
    node_token: str
    api_key: str


def e2e_seed() -> Seed:
    make_model(SERVED_MODELS[0], max_context_tokens=TINY_CONTEXT, tool_call_parser=TOOL_CALL_PARSER)
    make_model(
        SERVED_MODELS[0],
        max_context_tokens=TINY_CONTEXT,
        version="v2",
        tool_call_parser=TOOL_CALL_PARSER,
    )
    for name in (*SERVED_MODELS[1:], UNSERVED_MODEL, BROKEN_MODEL):
        make_model(name, max_context_tokens=TINY_CONTEXT)
    make_model(EMBED_MODEL, max_context_tokens=TINY_CONTEXT, kind=ModelKind.EMBED)
    _, node_token = make_node_token("e2e")
    _, api_key = make_api_key(name="e2e")
    return Seed(node_token=node_token, api_key=api_key)


@dataclass
class RunningPlatform:
    stack: stack_module.Stack
    node_token: str
    api_key: str
    workers: dict[str, stack_module.Worker]
    database: TcpProxy  # the platform's processes reach PostgreSQL only through this

    @property
    def url(self) -> str:
        return self.stack.gateways[0]

    @property
    def api_url(self) -> str:
        return self.url + "/v1"

    @property
    def api_urls(self) -> list[str]:
        """Every gateway replica's /v1."""
        return [url + "/v1" for url in self.stack.gateways]


def _database_url(port: int) -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@127.0.0.1:{port}/{db['NAME']}"


@pytest.fixture(scope="session")
def platform(django_db_setup, django_db_blocker) -> Iterator[RunningPlatform]:
    """The gateway, Celery (worker + beat) and one vLLM worker per e2e model, started once.

    One such stack at a time on the machine: test runs on other databases go side by side
    (scripts/test.sh), but three vLLM engines each are more than two cores start in time."""
    assert connection.vendor == "postgresql", "e2e tests run against PostgreSQL (scripts/test.sh)"
    lock = stack_module.machine_lock("e2e-stack")
    stack_module.build_tiny_model()
    with django_db_blocker.unblock():
        seed = e2e_seed()
    database = TcpProxy((connection.settings_dict["HOST"], int(connection.settings_dict["PORT"])))
    env = dict(os.environ, DATABASE_URL=_database_url(database.port))
    stack = stack_module.Stack(env=env)
    try:
        for _ in range(GATEWAY_REPLICAS):
            stack.start_gateway()
        stack.start_celery()
        workers = {
            name: stack.start_worker(model_name=model, version=version, node_token=seed.node_token)
            for name, (model, version) in WORKERS.items()
        }
        running = RunningPlatform(
            stack=stack,
            node_token=seed.node_token,
            api_key=seed.api_key,
            workers=workers,
            database=database,
        )
        for name, worker in workers.items():
            wait_until_served(running, WORKERS[name][0], worker)
        yield running
    finally:
        stack.stop()
        database.close()
        lock.close()


@pytest.fixture(scope="module")
def embed_worker(platform: RunningPlatform) -> Iterator[stack_module.Worker]:
    """A worker serving EMBED_MODEL, started by the first test of a module that needs it and
    stopped after that module: a fourth engine kept up on two cores slowed every later
    end-to-end test (a drain with a 10 s timeout ran out mid-generation)."""
    with serving_worker(platform, EMBED_MODEL) as worker:
        yield worker


@contextlib.contextmanager
def serving_worker(running: RunningPlatform, model: str) -> Iterator[stack_module.Worker]:
    """A worker of its own for `model`, serving until the block ends."""
    worker = running.stack.start_worker(model_name=model, node_token=running.node_token)
    try:
        wait_until_served(running, model, worker)
        yield worker
    finally:
        worker.stop()


def fleet_node(name: str) -> NodeSnapshot | None:
    """The node named `name` as gateways route on it (its last heartbeat), if it has one."""
    for raw in sync_redis().hvals(fleet_key()):
        node = NodeSnapshot.decode(raw)
        if node.name == name:
            return node
    return None


def wait_for_refresh(running: RunningPlatform, *, timeout: float = 30) -> None:
    """Return once every gateway replica has finished a refresh of the shared state (fleet,
    breakers, catalog, routing table) that began after this call: what a test waits for after
    changing that state, instead of sleeping for "two refreshes".

    A replica's /readyz gives the age of its last read; the read happened between (sent - age)
    and (answered - age) on this process's clock. A read known to start after the call, then a
    read known to start after that one: the refresh loop is sequential, so the first refresh
    has finished, its catalog and table reloads included."""

    def read_between(url: str) -> tuple[float, float] | None:
        sent = time.monotonic()
        age = call("GET", url + "/readyz", timeout=10).json().get("fleet_state_age_seconds")
        answered = time.monotonic()
        return None if age is None else (sent - age, answered - age)

    for url in running.stack.gateways:
        since = time.monotonic()
        for _ in range(2):

            def read_after(since: float = since, url: str = url) -> tuple[float, float] | None:
                read = read_between(url)
                return read if read is not None and read[0] > since else None

            _, since = stack_module.wait_for(
                read_after, timeout=timeout, interval=0.05, what=f"a state refresh of {url}"
            )


def wait_until_served(running: RunningPlatform, model: str, worker: stack_module.Worker) -> None:
    """Block until the worker's node is live, the gateway lists `model` and every replica has
    refreshed since; fail with the worker's log if it dies first."""

    def node_live() -> bool:
        node = fleet_node(worker.node_name)
        return node is not None and node.status == "up"

    def served() -> bool:
        if not worker.alive():
            pytest.fail(f"worker for {model} exited:\n{worker.log_tail()}")
        if not node_live():
            return False
        reply = call("GET", running.api_url + "/models", key=running.api_key)
        return reply.status == 200 and any(m["id"] == model for m in reply.json()["data"])

    stack_module.wait_for(
        served,
        timeout=stack_module.WORKER_START_TIMEOUT,
        interval=0.5,
        what=f"a node serving {model}",
    )
    # The first replica lists it; the others route on the node once they refreshed after it
    # came up (a test that sent to both at once got a 503 from the one that had not yet).
    wait_for_refresh(running)


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Run the tasks a task queues in this process, at once."""
    from config.celery import app

    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = previous


@pytest.fixture
def committed(django_db_setup, django_db_blocker) -> Iterator[None]:
    """ORM access in autocommit, for e2e tests: other processes see every write at once."""
    with django_db_blocker.unblock():
        yield
