"""The platform's state an e2e test's timeout reports (tests/diagnostics.py)."""

from __future__ import annotations

import pytest
from django.db import connection

from dmxplatform import streams
from tests.diagnostics import platform_state


@pytest.mark.django_db
@pytest.mark.usefixtures("private_redis")
def test_the_report_names_every_stream_queue_and_advisory_lock():
    shard = streams.every_shard()[0]
    streams.request_redis().xadd(shard.key(), {streams.FIELD: b"x"})
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(424242)")
    try:
        report = platform_state()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(424242)")
    lines = report.splitlines()
    assert f"  {shard.label}: 1, no group, 0" in lines
    assert all(f"  {other.label}: " in report for other in streams.every_shard())
    assert any(line.startswith("celery queues: default ") for line in lines)
    locks = lines[lines.index("advisory locks:") + 1 : lines.index("busy sessions:")]
    assert any(", 424242, True," in line for line in locks)
