"""Batches in /metrics, read from the database at scrape time; a scrape still answers, with the
families empty, when the database does not."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.batches.metrics import BatchCollector
from tests.batches.factories import finished_batch, request_line, validated_batch
from tests.keys.factories import make_api_key


def samples() -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in BatchCollector().collect()
        for sample in family.samples
    }


@pytest.mark.django_db
def test_open_batches_their_backlog_and_answered_lines_are_counted():
    key, _ = make_api_key()
    validated_batch([request_line("a"), request_line("b"), request_line("c")], key)
    finished_batch(key)

    got = samples()

    assert got[("dmx_batches_open", (("status", "in_progress"),))] == 1
    assert got[("dmx_batches_open", (("status", "validating"),))] == 0
    assert got[("dmx_batch_lines_backlog", ())] == 3
    assert got[("dmx_batch_lines_total", (("outcome", "answered"),))] == 1
    assert got[("dmx_batch_lines_total", (("outcome", "failed"),))] == 0


@pytest.mark.django_db(transaction=True)
def test_a_database_that_does_not_answer_empties_the_families_and_fails_no_scrape():
    connection.close()
    port = connection.settings_dict["PORT"]
    connection.settings_dict["PORT"] = "1"  # nothing listens there: the connect is refused
    try:
        families = list(BatchCollector().collect())
    finally:
        connection.settings_dict["PORT"] = port
        connection.close()

    assert [family.name for family in families] == [
        "dmx_batches_open",
        "dmx_batch_lines_backlog",
        "dmx_batch_lines",
    ]
    assert all(family.samples == [] for family in families)
