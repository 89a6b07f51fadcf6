"""Developer accounts (django-allauth), the mail they get, and who may create keys."""

from dmxplatform.env import env_bool, env_int, env_optional, env_str

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",  # operators' usernames in the admin
    "allauth.account.auth_backends.AuthenticationBackend",  # developers' emails in the portal
]

# Developers sign in with their email address and must verify it before they get in.
ACCOUNT_LOGIN_METHODS = {"email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = "mandatory"
ACCOUNT_UNIQUE_EMAIL = True
ACCOUNT_LOGIN_ON_EMAIL_CONFIRMATION = True
ACCOUNT_LOGOUT_ON_PASSWORD_CHANGE = False
ACCOUNT_ADAPTER = "apps.portal.accounts.AccountAdapter"
ACCOUNT_EMAIL_SUBJECT_PREFIX = "[DMX] "
LOGIN_URL = "account_login"
LOGIN_REDIRECT_URL = "portal:home"
ACCOUNT_LOGOUT_REDIRECT_URL = "account_login"

# Mail: printed to the server's log unless an SMTP server is named (EMAIL_HOST and friends
# keep Django's names).
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if env_optional("EMAIL_HOST")
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "DMX <noreply@localhost>")

# New accounts wait for an operator's approval before they can create keys (the admin lists
# them under Tenants, "waiting for approval").
DMX_ACCOUNT_APPROVAL_REQUIRED = env_bool("DMX_ACCOUNT_APPROVAL_REQUIRED", False)
# The plan a new account's tenant is put on; created with modest limits if missing.
DMX_DEFAULT_PLAN = env_str("DMX_DEFAULT_PLAN", "default")
# The base URL developers call, shown in the portal's docs; empty: the portal's own address.
DMX_PUBLIC_API_URL = env_str("DMX_PUBLIC_API_URL", "")
