"""Django core: apps, middleware, templates, static files, security."""

from django.core.exceptions import ImproperlyConfigured

from dmxplatform.env import BASE_DIR, env_bool, env_list, env_optional, env_str

DEBUG = env_bool("DMX_DEBUG", False)


def secret_from_env(name: str, development_value: str) -> str:
    """Return the secret in `name`; `development_value` stands in only when DEBUG is on."""
    value = env_optional(name) or (development_value if DEBUG else None)
    if value is None:
        raise ImproperlyConfigured(f"{name} is required when DMX_DEBUG is off")
    return value


# A development key only when DEBUG is on; production must set its own.
SECRET_KEY = secret_from_env(
    "DJANGO_SECRET_KEY", "dev-insecure-secret-key-do-not-use-in-production"
)

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "config.apps.PlatformAdminConfig",  # django.contrib.admin with our site
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "servestatic",  # its configuration checks
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "allauth",
    "allauth.account",
    "django_prometheus",
    "auditlog",
    "dmxplatform.audit",  # the audit log's admin and records, on auditlog
    "apps.keys",
    "apps.billing",
    "apps.models",
    "apps.hardware",
    "apps.routing",
    "apps.gateway",
    "apps.batches",
    "apps.portal",
    "apps.console",
    "config.apps.PlatformConfig",  # the composition root's commands (dmx_demo)
]

# The /v1 hot path never passes through this stack: config.asgi sends it to the gateway's
# own ASGI endpoints. These serve the admin, the portal, the management and internal node APIs,
# /health and /metrics.
MIDDLEWARE = [
    # First and last so that the histogram covers every other middleware.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files before everything that needs a session: a stylesheet costs no lookup.
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication: it names request.user as the actor of the changes the request
    # makes (the management API's tokens authenticate later, in DRF: see apps/keys/api/auth.py).
    # Sync only: it and what is under it run in the thread hop the sync views take anyway.
    "dmxplatform.audit.middleware.TrustedProxyAuditlogMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # The portal's pages without Redis: a 503 that asks for a retry, not a server error.
    "apps.portal.middleware.StoreUnavailableMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.portal.context_processors.portal",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Where collectstatic puts the files the platform serves itself (ServeStatic: compressed, with
# far-future cache headers for the hashed names); an image or a volume in production.
STATIC_ROOT = env_str("DMX_STATIC_ROOT", str(BASE_DIR / ".run" / "static"))
# Front-end libraries (Chart.js) come from the npm registry (package.json, installed by
# scripts/bootstrap.sh) and are served from here after collectstatic; nothing is copied by hand.
STATICFILES_DIRS = [
    ("vendor/chart.js", BASE_DIR / "node_modules" / "chart.js" / "dist"),
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed, compressed names in production; in development (and tests) the files are served
    # straight from their directories, no collectstatic needed.
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "servestatic.storage.CompressedManifestStaticFilesStorage"
    },
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
