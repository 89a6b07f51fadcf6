"""The test suite's settings: the platform's, and what only pytest's own process needs.

pytest runs these (pyproject.toml); the gateways and Celery the tests start run
dmxplatform.settings, as production does (tests/stack.py). What every process of a test run must
agree on (secrets, databases, Redis prefix, cadences) is environment, set by scripts/test.sh.
"""

import os

from django.contrib.auth.hashers import PBKDF2PasswordHasher

# Under pytest-xdist (the fast lane runs on every core, scripts/test.sh --fast), each worker
# flushes and fills a Redis database and a spool of its own: gw0 the suite's, gw1 the one
# below it, and so on. pytest-django names each worker's test database apart itself.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker != "gw0":
    _base, _, _db = os.environ["REDIS_URL"].rpartition("/")
    os.environ["REDIS_URL"] = f"{_base}/{int(_db) - int(_worker[2:])}"
    os.environ["DMX_SPOOL_DIR"] = f"{os.environ['DMX_SPOOL_DIR']}-{_worker}"

from dmxplatform.settings import *  # noqa: E402, F403


class FastPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    """Django's PBKDF2 at one iteration: hashes the platform's processes still verify."""

    # A test's password needs no strength, and Django's 1,000,000 iterations cost 0.3 s per
    # user created or signed in. Not MD5: the e2e stack's gateways run production settings and
    # must accept the staff passwords the tests set (the browser tests sign in through them);
    # a PBKDF2 hash names its iterations, so they verify it (and rehash it, as for any old hash).
    iterations = 1


PASSWORD_HASHERS = ["dmxplatform.settings.test.FastPBKDF2PasswordHasher"]
