"""The test suite's settings: the platform's, and what only pytest's own process needs.

pytest runs these (pyproject.toml); the gateways and Celery the tests start run
dmxplatform.settings, as production does (tests/stack.py). What every process of a test run must
agree on (secrets, databases, Redis prefix, cadences) is environment, set by scripts/test.sh.
"""

from django.contrib.auth.hashers import PBKDF2PasswordHasher

from dmxplatform.settings import *  # noqa: F403


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's PBKDF2 at one iteration: hashes the platform's processes still verify."""

    # A test's password needs no strength, and Django's 1,000,000 iterations cost 0.3 s per
    # user created or signed in. Not MD5: the e2e stack's gateways run production settings and
    # must accept the staff passwords the tests set (the browser tests sign in through them);
    # a PBKDF2 hash names its iterations, so they verify it (and rehash it, as for any old hash).
    iterations = 1


PASSWORD_HASHERS = ["dmxplatform.settings.test.FastPBKDF2PasswordHasher"]
