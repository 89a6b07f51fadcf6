"""The database: PostgreSQL from DATABASE_URL; SQLite for a laptop without a server."""

import dj_database_url

from dmxplatform.env import BASE_DIR, env_int, env_optional

# Connections are reused for this many seconds; the admin and Celery gain, the hot path has no
# database connection at all.
DATABASE_CONN_MAX_AGE = env_int("DMX_DB_CONN_MAX_AGE", 60, minimum=0)

_url = env_optional("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
# Health checks: a reused connection the server dropped (a restart, a failover) is replaced
# instead of failing the next request.
DATABASES = {
    "default": dj_database_url.parse(
        _url, conn_max_age=DATABASE_CONN_MAX_AGE, conn_health_checks=True
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The test database gets its own name; pytest-django prefixes it with test_.
    DATABASES["default"].setdefault("TEST", {})
