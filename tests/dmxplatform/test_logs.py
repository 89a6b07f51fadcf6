"""Log lines carry the request they belong to: the filter, the formatters of settings.LOGGING,
the usage log fallback read back from JSON lines, and a real gateway's stderr."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import urllib.request

from django.conf import settings
from django.utils.module_loading import import_string

from apps.billing import ledger
from apps.billing.models import UsageRecord
from apps.billing.services import usage_replay
from dmxplatform.logs import bind_request
from dmxplatform.redis_client import sync_redis
from tests.faults import TcpProxy
from tests.stack import wait_for


def _configured(name: str, section: str):
    """An object as settings.LOGGING configures it (a `()` factory and its arguments)."""
    spec = dict(settings.LOGGING[section][name])
    return import_string(spec.pop("()"))(**spec)


def _logger(formatter: str) -> tuple[logging.Logger, io.StringIO]:
    """A logger writing through the settings' filter and `formatter` into a buffer."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(_configured(formatter, "formatters"))
    handler.addFilter(_configured("request", "filters"))
    log = logging.getLogger(f"tests.logs.{formatter}")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log, out


def test_a_json_line_carries_the_ids_of_its_request_and_no_other_line_does():
    log, out = _logger("json")

    def request() -> None:
        bind_request("req_abc", client_request_id="client-7", trace_id="0af7" * 8)
        logging.getLogger("tests.logs.json").warning("upstream %s failed", "n1")

    log.info("no request here")
    contextvars.copy_context().run(request)
    log.info("after it")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["message"] for line in lines] == [
        "no request here",
        "upstream n1 failed",
        "after it",
    ]
    assert lines[1]["request_id"] == "req_abc"
    assert lines[1]["client_request_id"] == "client-7"
    assert lines[1]["trace_id"] == "0af7" * 8
    assert lines[1]["levelname"] == "WARNING" and lines[1]["name"] == "tests.logs.json"
    assert "timestamp" in lines[1]
    for line in (lines[0], lines[2]):
        assert not {"request_id", "client_request_id", "trace_id"} & line.keys()


def test_concurrent_requests_each_log_their_own_id_in_the_tasks_they_start():
    log, out = _logger("json")

    async def request(request_id: str) -> None:
        bind_request(request_id)
        await asyncio.sleep(0)  # the other request binds its id meanwhile
        log.info("in the request")
        await asyncio.ensure_future(_child(log))

    async def both() -> None:
        await asyncio.gather(request("req_one"), request("req_two"))

    asyncio.run(both())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    seen = sorted((line["request_id"], line["message"]) for line in lines)
    assert seen == [
        ("req_one", "in a task it started"),
        ("req_one", "in the request"),
        ("req_two", "in a task it started"),
        ("req_two", "in the request"),
    ]
    assert not any("client_request_id" in line for line in lines)  # none was given


async def _child(log: logging.Logger) -> None:
    log.info("in a task it started")


def test_a_plain_line_names_its_request_or_none():
    log, out = _logger("plain")
    log.info("idle")
    contextvars.copy_context().run(lambda: (bind_request("req_p"), log.info("busy")))
    idle, busy = out.getvalue().splitlines()
    assert idle.endswith(" INFO tests.logs.plain - idle")
    assert busy.endswith(" INFO tests.logs.plain req_p busy")


def test_the_log_format_defaults_to_plain_in_development():
    # The suite runs with DMX_DEBUG=1 (scripts/test.sh); production's default is json.
    assert settings.DMX_LOG_FORMAT == "plain"
    assert settings.LOGGING["handlers"]["stderr"]["formatter"] == "plain"


def test_usage_replay_reads_the_usage_a_gateway_logged_as_json(private_redis):
    """The last resort of a usage record (a gateway that neither Redis nor its disk took it
    from) is its log line; replaying it must read JSON lines too."""
    log, out = _logger("json")
    event = ledger.UsageEvent(
        request_id="req_logged",
        api_key_id=1,
        tenant_id=1,
        created_at=1_700_000_000.0,
        endpoint="chat.completions",
        model="m",
        status="ok",
        http_status=200,
        prompt_tokens=3,
        completion_tokens=4,
    )
    contextvars.copy_context().run(
        lambda: (
            bind_request("req_logged"),
            log.error("%s %s", ledger.UNRECORDED, event.encode().decode()),
        )
    )
    line = out.getvalue()
    # As written, and as journalctl hands it over (`journalctl -u dmx-gateway | usage_replay -`).
    journal = f"Dec 01 18:02:11 host dmx-gateway[4242]: {line}"
    assert usage_replay([line]) == (1, 0)
    assert usage_replay([journal]) == (1, 0)
    entries = sync_redis().xrange(ledger.USAGE_STREAM.shard(0).key())
    assert len(entries) == 2
    for _, fields in entries:
        replayed = ledger.UsageEvent.decode(next(iter(fields.values())))
        assert replayed.request_id == "req_logged" and replayed.completion_tokens == 4


def test_a_gateways_json_lines_for_a_request_carry_its_ids(platform, committed):
    """A real gateway, logging JSON, whose Redis goes away mid-stream: the line the request
    causes (its usage record spooled) carries the request's ids as fields; the lines of the
    gateway's background work (its state refresh failing) carry none."""
    host, port = "127.0.0.1", int(settings.REDIS_URL.rsplit(":", 1)[1].split("/")[0])
    database = settings.REDIS_URL.rsplit("/", 1)[1]
    redis = TcpProxy((host, port))
    gateway, url = platform.stack.spare_gateway(
        "gateway-json-logs",
        settings={
            "DMX_LOG_FORMAT": "json",
            "REDIS_URL": f"redis://{host}:{redis.port}/{database}",
        },
    )
    try:
        request = urllib.request.Request(
            url + "/v1/chat/completions",
            data=json.dumps(
                {
                    "model": "dmx-tiny",
                    "messages": [{"role": "user", "content": "Tell me a long story"}],
                    "max_tokens": 300,
                    "ignore_eos": True,  # vLLM: all 300, so the stream outlasts the cut
                    "stream": True,
                }
            ).encode(),
            headers={
                "Authorization": f"Bearer {platform.api_key}",
                "Content-Type": "application/json",
                "X-Client-Request-Id": "my-log-test-1",
            },
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            request_id = response.headers["x-request-id"]
            assert response.readline().startswith(b"data: ")
            redis.cut()  # admitted; the settle, at the stream's end, finds no Redis
            assert response.read().rstrip().endswith(b"data: [DONE]")
        redis.restore()

        def lines() -> list[dict]:
            text = gateway.log_path.read_text(errors="replace")
            return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

        spooled = wait_for(
            lambda: [line for line in lines() if "spooled" in line["message"]],
            timeout=10,
            what="the spooled usage record's warning",
        )
        assert spooled[0]["request_id"] == request_id
        assert spooled[0]["client_request_id"] == "my-log-test-1"
        assert spooled[0]["levelname"] == "WARNING"
        every = lines()
        assert all(
            line.get("request_id") == request_id for line in every if request_id in str(line)
        )
        background = [line for line in every if "refresh failed" in line["message"]]
        assert background and not any("request_id" in line for line in background)
        # The spool is replayed once Redis is back: the record arrives, with the client's id.
        wait_for(
            lambda: UsageRecord.objects.filter(request_id=request_id).exists(),
            timeout=30,
            what="the usage record",
        )
        assert UsageRecord.objects.get(request_id=request_id).client_request_id == "my-log-test-1"
    finally:
        gateway.stop()
        redis.close()
