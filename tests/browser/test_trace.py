"""The issue's proof of the request trace, in a real browser: a real streamed chat completion
through the running gateway and vLLM worker, its X-Request-Id pasted into the console's search
as a viewer would, and the trace shows the request's real stages, end to end, in pipeline order,
with the routing decision that sent it to its node."""

from __future__ import annotations

import itertools
import re
import shutil
from collections.abc import Iterator

import openai
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import SCREENSHOTS, admin_page, staff_username
from tests.stack import ROOT, wait_for

MODEL = "dmx-tiny"
# The usage record and the decision reach the database with the next flushes (every 0.5 s in
# tests); a busy machine may take a few seconds more.
RECORD_TIMEOUT = 30
# The stages of a streamed request that went through, as the pipeline runs them.
STREAMED_STAGES = [
    "auth",
    "parse",
    "intent",
    "screen",
    "context",
    "limits",
    "route",
    "connect",
    "ttft",
    "decode",
    "settle",
]
README_SCREENSHOT = ROOT / "docs" / "screenshots" / "request-trace.png"


@pytest.fixture(scope="module")
def viewer(platform, django_db_blocker) -> str:
    return staff_username(django_db_blocker, "viewer")


@pytest.fixture(scope="module")
def console(platform, viewer: str, browser: Browser) -> Iterator[Page]:
    """The viewer, signed in to the admin through its login page."""
    with admin_page(browser, platform, viewer, "/admin/platform/traces/") as page:
        expect(page.locator("#trace-search")).to_be_visible()
        yield page


def stream_a_completion(platform) -> str:
    """A real streamed chat completion through the gateway; return its X-Request-Id."""
    client = openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about the sea."}],
        max_tokens=16,
        stream=True,
    )
    chunks = list(raw.parse())
    assert chunks, "the stream sent nothing"
    return raw.headers["x-request-id"]


def test_from_a_request_id_to_the_layer_that_was_slow(platform, console: Page, shoot):
    page = console
    request_id = stream_a_completion(platform)
    assert request_id.startswith("req_")

    # Search by the id the client got back; the search goes straight to its trace once the
    # request's usage record (and its sampled routing decision) has reached the database.
    def traced() -> bool:
        page.goto("/admin/platform/traces/")
        page.fill("#id_request_id", request_id)
        page.locator("#trace-search").get_by_role("button", name="Search").click()
        return page.locator("#waterfall").count() == 1 and (
            page.locator("#trace-decision .trace-not-sampled").count() == 0
        )

    wait_for(traced, timeout=RECORD_TIMEOUT, interval=0.5, what=f"the trace of {request_id}")
    expect(page).to_have_url(re.compile(f"/admin/platform/traces/{request_id}/$"))

    rows = page.locator("#waterfall tbody tr.wf-row")
    stages = rows.evaluate_all("rows => rows.map(row => row.dataset.stage)")
    assert [s for s in stages if s != "unaccounted"] == STREAMED_STAGES
    layers = dict(
        rows.evaluate_all("rows => rows.map(row => [row.dataset.stage, row.dataset.layer])")
    )
    assert layers["limits"] == "gateway" and layers["route"] == "routing"
    assert layers["ttft"] == layers["decode"] == "inference"
    figures = dict(
        rows.evaluate_all("rows => rows.map(row => [row.dataset.stage, +row.dataset.ms])")
    )
    assert all(ms >= 0 for ms in figures.values()) and figures["decode"] > 0
    # Exactly one stage is the slowest, and it is the longest.
    slowest = page.locator("#waterfall tr.wf-slowest")
    expect(slowest).to_have_count(1)
    slowest_stage = slowest.get_attribute("data-stage")
    assert figures[slowest_stage] == max(
        ms for stage, ms in figures.items() if stage != "unaccounted"
    )
    # The bars lie end to end: each starts (in the browser's layout) where the one before ends.
    boxes = [bar.bounding_box() for bar in page.locator("#waterfall tbody .wf-bar").all()]
    for before, after in itertools.pairwise(boxes):
        assert after["x"] >= before["x"] + before["width"] - 2.5  # a 2 px bar's minimum

    # The routing decision: the node of dmx-tiny it went to, among the candidates.
    nodes = platform.workers["dmx-tiny"].node_name, platform.workers["dmx-tiny-v2"].node_name
    decision = page.locator("#trace-decision")
    chosen = decision.locator("p strong").first.inner_text()
    assert chosen in nodes
    expect(decision.locator("table tbody tr", has_text=chosen)).to_contain_text("eligible")
    expect(page.locator("#trace-record")).to_contain_text(request_id)
    expect(page.locator("#trace-summary")).to_contain_text(chosen)

    path = shoot(page, "request-trace")
    shutil.copyfile(path, SCREENSHOTS / "request-trace.png")
    shutil.copyfile(path, README_SCREENSHOT)

    # Back in the search, by the key's prefix: the request, with its duration and slowest stage.
    page.locator(".breadcrumbs").get_by_role("link", name="Request traces").click()
    prefix = platform.api_key.partition("_")[0]
    page.fill("#id_key_prefix", prefix)
    page.locator("#trace-search").get_by_role("button", name="Search").click()
    row = page.locator(f'#trace-results tr[data-request-id="{request_id}"]')
    expect(row).to_contain_text(slowest_stage)
    shoot(page, "search")
