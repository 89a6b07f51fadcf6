"""Billing: the currency, how far ahead prices are set, and the alerts' delivery."""

from dmxplatform.env import env_bool, env_int, env_str

# The one currency every price, cost, budget and balance is in (ISO 4217); amounts are stored
# with six decimal places (micro-units).
DMX_CURRENCY = env_str("DMX_CURRENCY", "USD")
# A new price takes effect at least this long after it is set, seconds: every gateway holds it
# (prices reload like the catalog, within DMX_STATE_REFRESH_SECONDS) before any request is
# priced by it, so no two gateways price one moment differently.
DMX_PRICE_LEAD_SECONDS = env_int("DMX_PRICE_LEAD_SECONDS", 60, minimum=0)
# Budget and balance alerts: a webhook's tries, and the first back-off, seconds (doubling).
DMX_WEBHOOK_ATTEMPTS = env_int("DMX_WEBHOOK_ATTEMPTS", 6, minimum=1)
DMX_WEBHOOK_BACKOFF_SECONDS = env_int("DMX_WEBHOOK_BACKOFF_SECONDS", 30, minimum=1)
# Share of a budget, in percent, past which its first alert goes out (the second is at 100).
DMX_BUDGET_ALERT_PERCENT = env_int("DMX_BUDGET_ALERT_PERCENT", 80, minimum=1)
# Webhooks go to public addresses only: a tenant's URL naming (or resolving to) a loopback,
# private, link-local or reserved address is refused, so that alerts cannot be turned into
# requests to the platform's own network. 1 lets them through (a closed, trusted deployment).
DMX_WEBHOOK_ALLOW_PRIVATE = env_bool("DMX_WEBHOOK_ALLOW_PRIVATE", False)
