"""The settings package: secrets fail fast outside development; the suite's own settings."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher, make_password

from tests.stack import PLATFORM_SETTINGS, ROOT

SETUP = "import django; django.setup(); from django.conf import settings; print(settings.{})"


def start(setting: str, **env: str) -> subprocess.CompletedProcess:
    """Load the platform's settings, as a process of it does, in `env` over the suite's."""
    return subprocess.run(
        [sys.executable, "-c", SETUP.format(setting)],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": PLATFORM_SETTINGS, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# Set but empty: an unset variable would be taken from a .env file.
@pytest.mark.parametrize("secret", ["DJANGO_SECRET_KEY", "DMX_KEY_PEPPER"])
def test_a_secret_is_required_when_debug_is_off(secret):
    started = start("DEBUG", DMX_DEBUG="0", **{secret: ""})
    assert started.returncode != 0
    assert f"ImproperlyConfigured: {secret} is required when DMX_DEBUG is off" in started.stderr


def test_debug_has_a_development_pepper_and_production_its_own():
    assert start("DMX_KEY_PEPPER", DMX_DEBUG="1", DMX_KEY_PEPPER="").stdout.strip() == (
        "dev-pepper-change-me"
    )
    production = start("DMX_KEY_PEPPER", DMX_DEBUG="0", DMX_KEY_PEPPER="production-pepper")
    assert production.stdout.strip() == "production-pepper", production.stderr


def test_the_suites_passwords_verify_with_the_platforms_hasher():
    """The e2e processes run production settings and must accept the staff passwords set here."""
    assert settings.SETTINGS_MODULE == "dmxplatform.settings.test"
    encoded = make_password("pw-long-enough-1")
    assert encoded.startswith("pbkdf2_sha256$1$")
    assert PBKDF2PasswordHasher().verify("pw-long-enough-1", encoded)
