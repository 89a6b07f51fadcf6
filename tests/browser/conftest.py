"""Real headless Chromium (Debian's, driven by Playwright) against the running platform's first
gateway, as a developer's browser: one signed-up developer per test module, and a screenshot of
every step under .run/screenshots/.

No ORM call is made while a browser is open: Playwright's sync API keeps an event loop in the
test's thread, and Django refuses sync database access next to one."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.stack import ROOT, Service, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SCREENSHOTS = ROOT / ".run" / "screenshots"
VIEWPORT = {"width": 1280, "height": 860}
PASSWORD = "correct-horse-battery-42"
# Allauth sends the verification mail within the sign-up request; the console backend writes it
# to the gateway's log at once, so a few seconds covers a busy machine.
MAIL_TIMEOUT = 10


@dataclass
class Developer:
    email: str
    page: Page
    errors: list[str] = field(default_factory=list)  # the page's JavaScript errors


def gateway_service(platform) -> Service:
    """The process behind platform.url (gateway replica 1): its log holds the mail it sent."""
    port = platform.url.rsplit(":", 1)[1]
    return next(
        s
        for s in platform.stack.services
        if s.argv[-2:] == ["--port", port] and "config.serve" in s.argv
    )


def confirmation_link(log_path: Path, email: str) -> str | None:
    """The verification link in the last mail the console backend wrote to `email`."""
    text = log_path.read_text(errors="replace")
    start = text.rfind(f"To: {email}")
    if start < 0:
        return None
    match = re.search(r"https?://\S+/accounts/confirm-email/\S+", text[start:])
    return match.group(0) if match else None


@pytest.fixture(scope="module")
def browser(platform) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def shoot(request) -> Callable[[Page, str], Path]:
    """Save a full-page screenshot, numbered in the order the module takes them."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    taken = 0

    def screenshot(page: Page, step: str) -> Path:
        nonlocal taken
        taken += 1
        path = SCREENSHOTS / f"{module}-{taken:02d}-{step}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return screenshot


@pytest.fixture(scope="module")
def developer(platform, browser, shoot) -> Iterator[Developer]:
    """A developer who signed up in the portal and verified their address from the mail."""
    context = browser.new_context(viewport=VIEWPORT, base_url=platform.url)
    page = context.new_page()
    person = Developer(email=f"dev-{uuid.uuid4().hex[:8]}@example.com", page=page)
    page.on("pageerror", lambda error: person.errors.append(str(error)))

    page.goto("/accounts/signup/")
    page.fill("#id_email", person.email)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    shoot(page, "signup")
    page.locator("main form").get_by_role("button").click()
    expect(page.locator("main h1")).to_contain_text("Verify")
    shoot(page, "verification-sent")

    log = gateway_service(platform).log_path
    link = wait_for(
        lambda: confirmation_link(log, person.email),
        timeout=MAIL_TIMEOUT,
        what=f"the verification mail to {person.email} in {log}",
    )
    page.goto(link)
    shoot(page, "confirm-email")
    page.locator("main form").get_by_role("button", name="Confirm").click()
    # Confirmed and signed in (the same browser signed up), on the portal's first page.
    expect(page).to_have_url(re.compile(r"/keys/$"))
    expect(page.locator("#tenant-name")).to_be_visible()
    yield person
    context.close()


def staff_username(django_db_blocker, role: str) -> str:
    """A staff user of the console's `role` (viewer, operator): made before a browser opens,
    since no ORM call may run next to Playwright's loop."""
    from tests.keys.factories import make_staff

    with django_db_blocker.unblock():
        return make_staff(role).username


def admin_sign_in(page: Page, username: str, path: str) -> None:
    """Open an admin page as `username`, through the admin's login form it redirects to."""
    from tests.keys.factories import STAFF_PASSWORD

    page.goto(path)
    expect(page).to_have_url(re.compile(rf"/admin/login/\?next={re.escape(path)}$"))
    page.fill("#id_username", username)
    page.fill("#id_password", STAFF_PASSWORD)
    page.locator("#login-form").get_by_role("button").click()
    expect(page).to_have_url(re.compile(rf"{re.escape(path)}$"))


@contextlib.contextmanager
def admin_page(
    browser: Browser, platform, username: str, path: str, *, viewport: dict = VIEWPORT
) -> Iterator[Page]:
    """A browser signed in to the admin as `username` on `path`; no JavaScript error on any
    page it showed, checked when the caller is done."""
    context = browser.new_context(viewport=viewport, base_url=platform.url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    admin_sign_in(page, username, path)
    yield page
    assert errors == [], f"JavaScript errors: {errors}"
    context.close()
