"""The audit log (django-auditlog): which models and fields it keeps, see dmxplatform/audit/.

The log is for people's changes. Fields a machine rewrites all the time (a node's live state,
which the stale check copies from its heartbeats; a token's last use; a scaling policy's
counters) are left out, and secrets' hashes are masked whole: an entry says that a secret
changed, never what to.
"""

_SECRET = "dmxplatform.audit.entries.hide_secret"
# What heartbeats and the fleet sync write on a node, every few seconds.
_NODE_LIVE_FIELDS = [
    "status",
    "registered_at",
    "last_heartbeat_at",
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage",
    "resources",
]

AUDITLOG_INCLUDE_TRACKING_MODELS = (
    # keys
    "keys.Tenant",
    "keys.Plan",
    "keys.PlanQuota",
    "keys.Membership",
    {
        "model": "keys.ApiKey",
        "mask_fields": ["secret_hash", "previous_secret_hash", "signing_secret_encrypted"],
        "mask_callable": _SECRET,
    },
    {"model": "keys.Invitation", "mask_fields": ["token_hash"], "mask_callable": _SECRET},
    {
        "model": "keys.ManagementToken",
        "exclude_fields": ["last_used_at"],
        "mask_fields": ["secret_hash"],
        "mask_callable": _SECRET,
    },
    # billing: prices, budgets, accounts (the balance is the movements' to record), code
    # batches, and each movement saved one by one (top-ups, redemptions, refunds, adjustments:
    # the flush's usage charges are bulk-inserted, one row per request, and are the ledger)
    "billing.Price",
    "billing.Budget",
    {
        "model": "billing.BillingAccount",
        "exclude_fields": ["balance", "version", "updated_at"],
        # Written by a queryset update today, which the log does not see; a save never logs it.
        "mask_fields": ["webhook_secret"],
        "mask_callable": _SECRET,
    },
    "billing.BalanceMovement",
    "billing.RedemptionBatch",
    # hardware
    "hardware.HardwareProfile",
    {"model": "hardware.NodeToken", "mask_fields": ["secret_hash"], "mask_callable": _SECRET},
    {"model": "hardware.Node", "exclude_fields": _NODE_LIVE_FIELDS},
    # models; a tokenizer is uploaded by a worker and can only be deleted in the admin: its
    # entries name it, without its (megabytes of) JSON
    "models.LlmModel",
    "models.ModelVersion",
    {"model": "models.Tokenizer", "exclude_fields": ["tokenizer_json", "chat_template"]},
    # routing; the admin saves canaries and breakers through proxies of versions and nodes, and
    # signals name the proxy, so they are registered too (their entries are the concrete row's)
    {"model": "routing.RoutingRule", "exclude_fields": ["updated_at"]},
    "routing.WeightRecomputation",
    {
        "model": "routing.ScalingPolicy",
        "exclude_fields": ["consecutive_breaches", "consecutive_calm", "last_scaled_at"],
    },
    "routing.Canary",
    {"model": "routing.NodeBreaker", "exclude_fields": _NODE_LIVE_FIELDS},
    # gateway
    {"model": "gateway.SensitiveTerm", "exclude_fields": ["updated_at"]},
    # the console's people and roles
    {
        "model": "auth.User",
        "exclude_fields": ["last_login"],
        "mask_fields": ["password"],
        "mask_callable": _SECRET,
        "m2m_fields": ["groups", "user_permissions"],
    },
    {"model": "auth.Group", "m2m_fields": ["permissions"]},
)
# Values keep their JSON types (numbers stay numbers, lists stay lists) in `changes`.
AUDITLOG_STORE_JSON_CHANGES = True
# Fixtures loaded with loaddata are nobody's change.
AUDITLOG_DISABLE_ON_RAW_SAVE = True
