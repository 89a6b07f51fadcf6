"""The operator console in a real browser: an operator drains a serving node from the admin and
the gateway stops sending it requests at once, then undrains it; a viewer sees the same pages
and can change nothing, actions included."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from apps.hardware.models import Node
from apps.hardware.services import node_undrain
from tests.browser.conftest import admin_page, staff_username
from tests.conftest import SERVED_MODELS, WORKERS
from tests.http import call
from tests.stack import wait_for

# Served by one node only: drained, nothing serves it.
MODEL = SERVED_MODELS[1]
NODES = "/admin/hardware/node/"
# Gateways reread the fleet state every 0.25 s in tests; a busy machine may take longer.
REFRESH_BOUND = 3


def ask(platform) -> int:
    reply = call(
        "POST",
        platform.api_url + "/chat/completions",
        key=platform.api_key,
        json_body={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 2,
        },
    )
    return reply.status


@pytest.fixture(scope="module")
def serving_node(platform, django_db_blocker) -> Iterator[str]:
    """The one node serving MODEL, undrained again whatever the test did."""
    worker = platform.workers[next(n for n, (m, _) in WORKERS.items() if m == MODEL)]
    yield worker.node_name
    with django_db_blocker.unblock():
        for node in Node.objects.filter(name=worker.node_name, drained=True):
            node_undrain(node=node)


@pytest.fixture(scope="module")
def staff(platform, django_db_blocker) -> dict[str, str]:
    """Both roles' users at once, before the first test opens the browser."""
    return {role: staff_username(django_db_blocker, role) for role in ("operator", "viewer")}


@pytest.fixture(scope="module")
def operator(platform, staff, browser) -> Iterator[Page]:
    with admin_page(browser, platform, staff["operator"], NODES) as page:
        yield page


@pytest.fixture(scope="module")
def viewer(platform, staff, browser) -> Iterator[Page]:
    with admin_page(browser, platform, staff["viewer"], NODES) as page:
        yield page


def run_action(page: Page, node_name: str, action: str) -> None:
    row = page.locator("#result_list tbody tr", has_text=node_name)
    row.locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    page.locator("button[name=index]").click()
    expect(page.locator("ul.messagelist")).to_contain_text(f"{action.capitalize()}ed 1 node")


def test_an_operator_drains_a_node_and_the_gateway_stops_using_it(
    platform, serving_node: str, operator: Page, shoot
):
    assert ask(platform) == 200
    operator.goto(NODES)
    shoot(operator, "nodes")
    run_action(operator, serving_node, "drain")
    shoot(operator, "drained")
    row = operator.locator("#result_list tbody tr", has_text=serving_node)
    expect(row.locator("td.field-drained img")).to_have_attribute("alt", "True")
    # At once: the drain is on the snapshot gateways route on (read every
    # DMX_STATE_REFRESH_SECONDS), not waiting for the node's next heartbeat.
    wait_for(lambda: ask(platform) == 503, timeout=REFRESH_BOUND, what="no node for the model")

    run_action(operator, serving_node, "undrain")
    expect(row.locator("td.field-drained img")).to_have_attribute("alt", "False")
    wait_for(lambda: ask(platform) == 200, timeout=REFRESH_BOUND, what="the node serving again")


def test_a_viewer_sees_the_console_and_cannot_change_anything(
    platform, serving_node: str, viewer: Page, shoot
):
    viewer.goto(NODES)
    expect(viewer.locator("#result_list")).to_contain_text(serving_node)
    # No actions to choose, nothing to add.
    expect(viewer.locator("select[name=action]")).to_have_count(0)
    expect(viewer.locator("a.addlink")).to_have_count(0)
    shoot(viewer, "viewer-nodes")
    # A node's page is for reading: no save buttons, values as text.
    viewer.locator("#result_list tbody tr", has_text=serving_node).locator("th a").click()
    expect(viewer.locator("input[type=submit][name=_save]")).to_have_count(0)
    expect(viewer.locator("div.readonly").first).to_be_visible()
    shoot(viewer, "viewer-node")
    for page in ("/admin/keys/apikey/", "/admin/routing/canary/", "/admin/gateway/sensitiveterm/"):
        viewer.goto(page)
        expect(viewer.locator("#content h1")).to_be_visible()
        expect(viewer.locator("select[name=action]")).to_have_count(0)
        expect(viewer.locator("a.addlink")).to_have_count(0)
    # And the drain a viewer could post by hand, with the page's own CSRF token, is refused.
    viewer.goto(NODES)
    node_id = (
        viewer.locator("#result_list tbody tr", has_text=serving_node)
        .locator("th a")
        .get_attribute("href")
        .strip("/")
        .rsplit("/", 2)[-2]
    )
    status = viewer.evaluate(
        """async ([nodeId, url]) => {
            const token = document.querySelector('[name=csrfmiddlewaretoken]')
                || {value: document.cookie.match(/csrftoken=([^;]+)/)[1]};
            const body = new URLSearchParams({
                csrfmiddlewaretoken: token.value, action: 'drain', _selected_action: nodeId,
                index: '0',
            });
            const reply = await fetch(url, {method: 'POST', body, redirect: 'manual'});
            return reply.status;
        }""",
        [node_id, NODES],
    )
    assert status in (200, 302, 403)
    time.sleep(REFRESH_BOUND)  # a drain, had it happened, would show by now
    assert ask(platform) == 200
