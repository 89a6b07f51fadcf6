"""The issue's proof for the fleet dashboard, in a real browser: a viewer signs in to the admin,
opens the dashboard, and while the test sends traffic through the gateway to the vLLM workers
the nodes' rows and the model's charts change, with no reload of the page."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import openai
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import SCREENSHOTS, VIEWPORT, admin_page, staff_username
from tests.stack import wait_for

MODEL = "dmx-tiny"
INTENT = "creative"
# Long answers, so that a heartbeat (every 0.5 s in tests) finds requests running on the engine:
# greedy decoding of the tiny model's random weights runs to max_tokens.
MAX_TOKENS = 200
SENDERS = 3
# Ledger flush (0.5 s) + the consumer's refresh (5 s) + a busy machine.
CHART_TIMEOUT = 30


@pytest.fixture(scope="module")
def viewer(platform, django_db_blocker) -> str:
    return staff_username(django_db_blocker, "viewer")


@pytest.fixture
def dashboard(platform, viewer, browser: Browser) -> Iterator[Page]:
    wide = {**VIEWPORT, "width": 1440}
    with admin_page(browser, platform, viewer, "/admin/platform/fleet/", viewport=wide) as page:
        expect(page.locator("#fleet-connection")).to_have_text("live")
        yield page


def node_cells(page: Page, node_name: str) -> dict[str, str]:
    """A node's row as the page shows it now: {field: text}."""
    return page.evaluate(
        """(name) => {
            const row = [...document.querySelectorAll("#fleet-nodes tr[data-node-id]")]
                .find((tr) => tr.querySelector('[data-field="name"]').textContent === name);
            return row ? Object.fromEntries([...row.children]
                .map((cell) => [cell.dataset.field, cell.textContent])) : null;
        }""",
        node_name,
    )


def intent_cells(page: Page, intent: str) -> list[str] | None:
    """The intents table's row for `intent` as the page shows it now: its cells' text."""
    return page.evaluate(
        """(intent) => {
            const row = document.querySelector(`#fleet-intents tr[data-intent="${intent}"]`);
            return row ? [...row.children].map((cell) => cell.textContent) : null;
        }""",
        intent,
    )


def model_figures(page: Page) -> dict:
    """What the charts show for MODEL: requests in the window, and each chart's points."""
    return page.evaluate(
        """(model) => ({
            requests: (dmxFleet.latest.models[model]?.requests ?? []).reduce((a, b) => a + b, 0),
            points: Object.fromEntries(Object.entries(dmxFleet.charts).map(([name, chart]) =>
                [name, chart.data.datasets.find((set) => set.label === model)?.data ?? []])),
        })""",
        MODEL,
    )


def test_the_dashboard_follows_traffic_live(platform, dashboard: Page, shoot):
    page = dashboard
    page.evaluate("window.notReloaded = true")
    nodes = [platform.workers[name].node_name for name in ("dmx-tiny", "dmx-tiny-v2")]
    for name in nodes:
        cells = wait_for(lambda name=name: node_cells(page, name), timeout=10, what=name)
        assert cells["model"].startswith(MODEL) and cells["status"] == "up"
        assert cells["heartbeat"].endswith("s ago") and cells["running"] == "0"  # idle
    before = model_figures(page)
    # The prompt below is a story: the classifier's `creative` (0.94).
    creative_before = int((intent_cells(page, INTENT) or ["", "0"])[1])
    shoot(page, "idle")

    client = openai.OpenAI(base_url=platform.api_url, api_key=platform.api_key, max_retries=0)
    stop = threading.Event()
    served: list[int] = []

    def send() -> None:
        while not stop.is_set():
            # Streamed, so that the time to first token is measured too.
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a long story."}],
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
            )
            usage = [chunk.usage for chunk in stream if chunk.usage]
            served.append(usage[-1].completion_tokens)

    senders = [threading.Thread(target=send, daemon=True) for _ in range(SENDERS)]
    for sender in senders:
        sender.start()
    try:

        def running() -> str | None:
            return next((n for n in nodes if int(node_cells(page, n)["running"]) > 0), None)

        # The rows: a heartbeat pushed through the channel layer shows the engine at work.
        what = "a dmx-tiny node's row to show running requests"
        wait_for(running, timeout=CHART_TIMEOUT, interval=0.1, what=what)
        # The charts: the consumer's refresh brings the requests the ledger stored meanwhile.
        wait_for(
            lambda: model_figures(page)["requests"] >= before["requests"] + 2,
            timeout=CHART_TIMEOUT,
            interval=0.25,
            what="the dashboard's charts to count the requests sent",
        )

        # The intents table, refreshed with the charts: the stories, the share the classifier
        # was unsure of and their P95s (streamed: both).
        def stories_counted() -> list[str] | None:
            row = intent_cells(page, INTENT)
            return row if row and int(row[1]) >= creative_before + 2 else None

        cells = wait_for(
            stories_counted,
            timeout=CHART_TIMEOUT,
            interval=0.25,
            what="the intents table to count the stories sent",
        )
        assert cells[2].endswith(" %") and cells[3].endswith(" ms") and cells[4].endswith(" ms")
        wait_for(running, timeout=CHART_TIMEOUT, interval=0.1, what=what)  # for the picture
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "fleet-dashboard.png"), full_page=True)
        shoot(page, "busy")
    finally:
        stop.set()
        for sender in senders:
            sender.join(timeout=60)

    after = model_figures(page)
    assert served and all(tokens == MAX_TOKENS for tokens in served)
    assert after["points"]["requests"] != before["points"]["requests"]
    # The last two minutes: the traffic may have crossed into a new one.
    recent = {chart: points[-2:] for chart, points in after["points"].items()}
    assert max(recent["requests"]) > 0 and max(recent["tokens"]) > 0
    for chart in ("ttft", "e2e", "errors"):
        assert any(point is not None for point in recent[chart]), f"nothing on the {chart} chart"
    assert page.evaluate("window.notReloaded") is True  # all of it without a reload
