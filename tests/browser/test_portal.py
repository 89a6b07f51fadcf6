"""The issue's proof, in a real browser: a developer signs up, verifies their address, creates a
key, calls the API with it through the official `openai` client, sees the call in usage and its
charts, rotates the key (the old secret works through the grace period, then 401), revokes it
(401), and chats in the playground, the answer streaming in chunk by chunk."""

from __future__ import annotations

import re
import time

import openai
from playwright.sync_api import Page, expect

from tests.browser.conftest import Developer
from tests.stack import wait_for

MODEL = "dmx-tiny"
# The rotation's grace period as the owner types it: 6 seconds, long enough for a call with the
# old secret, short enough to wait out.
GRACE_MINUTES, GRACE_SECONDS = "0.1", 6
# How long a gateway may take to learn of a change to a key (its record is republished through
# Redis; tests/gateway/test_errors.py holds it to a second).
KEY_CHANGE_SECONDS = 1.0


def client(platform, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=platform.api_url, api_key=secret, max_retries=0)


def ask(platform, secret: str):
    """One short chat completion; returns the raw response (headers and parsed body)."""
    return client(platform, secret).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )


def refused(platform, secret: str) -> openai.AuthenticationError | None:
    """The 401 a call with `secret` gets now, or None if it was served."""
    try:
        ask(platform, secret)
    except openai.AuthenticationError as error:
        return error
    return None


def create_key(page: Page, name: str) -> str:
    """Create a key in the portal; return the secret it shows once (the page stays on it)."""
    page.goto("/keys/")
    page.click("#new-key")
    page.fill("#id_name", name)
    page.locator("#key-form").get_by_role("button", name="Create the key").click()
    expect(page.locator("#secret")).to_be_visible()
    return page.locator("#secret").inner_text().strip()


def key_row(page: Page, name: str):
    page.goto("/keys/")
    return page.locator("#keys-table tr", has_text=name)


def usage_row(page: Page, key_id: str, requests: int):
    """The usage page's row of a key once it counts `requests` (the ledger is flushed to the
    database every 0.5 s in tests, and the daily totals with it)."""
    row = page.locator(f'#usage-by-key tr[data-key-id="{key_id}"]')

    def counted() -> bool:
        page.goto("/usage/")
        return row.count() == 1 and row.locator("td").nth(2).inner_text() == str(requests)

    wait_for(counted, timeout=20, interval=0.5, what=f"{requests} request(s) of {key_id} in usage")
    return row


def test_a_key_from_sign_up_to_revocation(platform, developer: Developer, shoot):
    page = developer.page
    secret = create_key(page, "first key")
    shoot(page, "key-created")
    key_id = key_row(page, "first key").get_attribute("data-key-id")
    assert secret.startswith(f"sk-dmx-{key_id}_")

    # The official client against the running gateway, with the secret the page showed.
    raw = ask(platform, secret)
    completion = raw.parse()
    assert completion.usage.completion_tokens > 0

    # The call in the table by key and in both charts (today is the last day of each).
    row = usage_row(page, key_id, requests=1)
    total = completion.usage.total_tokens
    assert row.locator("td").nth(7).inner_text() == str(total)  # the "Total tokens" column
    charts = page.evaluate(
        """() => ({
            requests: Chart.getChart("requests-chart").data.datasets[0].data.at(-1),
            tokens: Object.fromEntries(Chart.getChart("tokens-chart").data.datasets
                .map((set) => [set.label, set.data.at(-1)])),
        })"""
    )
    assert charts == {"requests": 1, "tokens": {MODEL: total}}
    shoot(page, "usage")

    # Rotate with a grace period of 6 s: both secrets work, then only the new one.
    key_row(page, "first key").get_by_role("link", name="Rotate").click()
    page.fill("#id_grace_minutes", GRACE_MINUTES)
    rotated_at = time.monotonic()  # no later than the rotation itself
    page.locator("#rotate-form").get_by_role("button", name="Rotate the key").click()
    new_secret = page.locator("#secret").inner_text().strip()
    assert new_secret != secret and new_secret.startswith(f"sk-dmx-{key_id}_")
    expect(page.locator("#grace")).to_contain_text("keeps working until")
    shoot(page, "key-rotated")
    assert refused(platform, secret) is None, "the old secret must work in its grace period"
    assert time.monotonic() - rotated_at < GRACE_SECONDS  # so that call was inside it
    wait_for(
        lambda: refused(platform, new_secret) is None,
        timeout=KEY_CHANGE_SECONDS,
        interval=0.05,
        what="the new secret to reach the gateway",
    )
    expired = wait_for(
        lambda: refused(platform, secret),
        timeout=GRACE_SECONDS + 10,
        interval=0.5,
        what="the old secret's grace period to end",
    )
    assert expired.status_code == 401 and time.monotonic() - rotated_at >= GRACE_SECONDS
    assert refused(platform, new_secret) is None

    # Revoke: the next call with the current secret is refused.
    key_row(page, "first key").get_by_role("link", name="Revoke").click()
    page.locator("#confirm-form").get_by_role("button", name="Revoke the key").click()
    expect(page.locator("#keys-table tr", has_text="first key")).to_contain_text("revoked")
    shoot(page, "key-revoked")
    revoked = wait_for(
        lambda: refused(platform, new_secret),
        timeout=KEY_CHANGE_SECONDS,
        interval=0.05,
        what="the revocation to reach the gateway",
    )
    assert revoked.status_code == 401 and revoked.code == "api_key_revoked"
    assert developer.errors == []


def test_the_playground_streams_an_answer_chunk_by_chunk(platform, developer: Developer, shoot):
    page = developer.page
    create_key(page, "playground key")
    key_id = key_row(page, "playground key").get_attribute("data-key-id")
    page.goto("/playground/")
    expect(page.locator("#pg-connection")).to_have_attribute("data-state", "open")
    page.select_option("#pg-key", key_id)
    page.select_option("#pg-model", MODEL)
    page.fill("#pg-system", "You are a poet.")
    page.fill("#pg-max-tokens", "32")
    page.fill("#pg-message", "Write about the sea at night.")
    # Watch the answer's text as the page changes it, up to the moment it is marked done.
    page.evaluate(
        """() => {
            window.seen = [];
            const chat = document.getElementById("pg-chat");
            new MutationObserver(() => {
                const answer = chat.querySelector(".msg.assistant:last-of-type");
                if (answer) window.seen.push(
                    [answer.dataset.state, answer.querySelector(".text").textContent]);
            }).observe(chat, {subtree: true, childList: true, characterData: true,
                              attributes: true});
        }"""
    )
    page.click("#pg-send")
    answer = page.locator(".msg.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=60_000)

    seen = page.evaluate("window.seen")
    streaming = {text for state, text in seen if state == "streaming" and text}
    final = answer.locator(".text").inner_text()
    assert len(streaming) > 1, seen  # the text grew in several steps before done
    assert final.strip() and all(final.startswith(text) for text in streaming)
    assert int(answer.get_attribute("data-deltas")) > 1
    request_id = answer.locator(".request-id code").inner_text()
    assert request_id.startswith("req_")
    expect(answer.locator(".usage")).to_contain_text(re.compile(r"\d+ prompt \+ \d+ answer"))
    expect(answer.locator(".ttft")).to_contain_text(" ms")
    shoot(page, "playground")

    # Billed to the key picked, like an API call.
    usage_row(page, key_id, requests=1)
    assert developer.errors == []
