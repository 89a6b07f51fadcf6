"""Static files in production mode: a gateway with DMX_DEBUG=0 serves the admin's and the
portal's stylesheets itself (ServeStatic, from what collectstatic wrote), compressed and cached
for good under their hashed names, and a real browser applies them. Under uvicorn nothing else
serves /static: the admin once rendered unstyled, its base.css a 404."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, VIEWPORT
from tests.stack import ROOT

# The admin's header colour (django/contrib/admin/static/admin/css/base.css, --header-bg),
# as a browser computes it: only there if base.css was fetched and applied.
ADMIN_HEADER_BACKGROUND = "rgb(65, 118, 144)"
# A year or more: what ServeStatic sends for a file whose name carries its hash.
FOREVER_SECONDS = 365 * 24 * 3600


@pytest.fixture(scope="module")
def production_gateway(platform, tmp_path_factory):
    static_root = tmp_path_factory.mktemp("static")
    production = {
        "DMX_DEBUG": "0",
        "DMX_STATIC_ROOT": str(static_root),
        # The suite's Redis is not append-only; production's must be (README).
        "DMX_REDIS_REQUIRE_AOF": "0",
    }
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=ROOT,
        env={**os.environ, **production},
        check=True,
    )
    gateway, url = platform.stack.spare_gateway("gateway-production", settings=production)
    try:
        yield url
    finally:
        gateway.stop()


def _get(url: str, **headers: str):
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.headers, response.read()  # case-insensitive


def test_the_admin_stylesheet_is_served_hashed_compressed_and_cached(production_gateway):
    _, _, page = _get(production_gateway + "/admin/login/")
    href = re.search(rb'href="(/static/admin/css/base\.[0-9a-f]{12}\.css)"', page)
    assert href, "the admin links its stylesheet by its hashed name"
    status, headers, body = _get(
        production_gateway + href.group(1).decode(), **{"Accept-Encoding": "gzip"}
    )
    assert status == 200 and headers.get("Content-Encoding") == "gzip"
    assert b"--header-bg" in gzip.decompress(body)
    max_age = int(re.search(r"max-age=(\d+)", headers["Cache-Control"]).group(1))
    assert max_age >= FOREVER_SECONDS and "immutable" in headers["Cache-Control"]


def test_a_browser_applies_the_admins_and_the_portals_stylesheets(production_gateway):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT, base_url=production_gateway)
            missing: list[str] = []
            page.on("response", lambda r: r.status >= 400 and missing.append(r.url))
            page.goto("/admin/login/")
            header = page.evaluate(
                "getComputedStyle(document.querySelector('#header')).backgroundColor"
            )
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "static-admin-login.png"), full_page=True)
            assert header == ADMIN_HEADER_BACKGROUND
            page.goto("/accounts/login/")
            portal_css = page.evaluate(
                "[...document.styleSheets].some(s => (s.href || '').includes('/static/portal/')"
                " && s.cssRules.length > 0)"
            )
            assert portal_css, "the portal's stylesheet loaded, with its rules"
            assert missing == [], missing
        finally:
            browser.close()
