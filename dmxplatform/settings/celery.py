"""Celery: broker, queues and the beat schedule."""

from celery.schedules import crontab

from dmxplatform.env import env_float, env_int, env_str
from dmxplatform.settings.batches import DMX_BATCH_TICK_SECONDS
from dmxplatform.settings.redis import REDIS_URL

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None  # tasks report through the database, never through results
CELERY_TASK_ACKS_LATE = True  # a task lost with its worker is redelivered
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"

# How often the usage buffer (a Redis stream) is drained into PostgreSQL, in seconds.
DMX_USAGE_FLUSH_SECONDS = env_float("DMX_USAGE_FLUSH_SECONDS", 2.0, minimum=0.2)
# How often nodes without fresh heartbeats are marked down and the Node rows catch up with the
# live state heartbeats write to Redis, in seconds.
DMX_NODE_STALE_CHECK_SECONDS = env_float("DMX_NODE_STALE_CHECK_SECONDS", 2.0, minimum=0.5)

# Raw usage records older than this are deleted nightly; daily totals are kept.
DMX_USAGE_RETENTION_DAYS = env_int("DMX_USAGE_RETENTION_DAYS", 90, minimum=1)

# How often each model's SLO and queue are evaluated for autoscaling, seconds.
DMX_SLO_EVALUATION_SECONDS = env_float("DMX_SLO_EVALUATION_SECONDS", 60.0, minimum=1.0)

# When the routing table's weights are recomputed from the day's usage, UTC.
DMX_ROUTING_WEIGHTS_HOUR_UTC = env_int("DMX_ROUTING_WEIGHTS_HOUR_UTC", 2, minimum=0)
# How often the ledger's figures per model, intent and key (completion tokens, first token,
# latency) are recomputed for the router's predictions, seconds.
DMX_WORK_PROFILES_SECONDS = env_float("DMX_WORK_PROFILES_SECONDS", 300.0, minimum=10.0)
# How often canaries are judged, and routing decisions moved to the database, seconds.
DMX_CANARY_EVALUATION_SECONDS = env_float("DMX_CANARY_EVALUATION_SECONDS", 60.0, minimum=1.0)

# How often budgets and balances are checked for alerts (and the alerts sent), seconds.
DMX_BILLING_ALERTS_SECONDS = env_float("DMX_BILLING_ALERTS_SECONDS", 30.0, minimum=1.0)
# How often every prepaid balance is compared with the sum of its movements, seconds (the
# DmxBalanceLedgerCheckStale alert expects the default: it fires after three missed checks).
DMX_BALANCE_LEDGER_CHECK_SECONDS = env_float(
    "DMX_BALANCE_LEDGER_CHECK_SECONDS", 300.0, minimum=10.0
)

CELERY_BEAT_SCHEDULE = {
    "routing-weights": {
        "task": "apps.routing.tasks.weights_recompute_task",
        "schedule": crontab(hour=DMX_ROUTING_WEIGHTS_HOUR_UTC, minute=0),
    },
    "work-profiles": {
        "task": "apps.routing.tasks.work_profiles_recompute_task",
        "schedule": DMX_WORK_PROFILES_SECONDS,
    },
    "canaries-evaluate": {
        "task": "apps.routing.tasks.canaries_evaluate_task",
        "schedule": DMX_CANARY_EVALUATION_SECONDS,
    },
    "decisions-flush": {
        "task": "apps.routing.tasks.decisions_flush_task",
        "schedule": DMX_USAGE_FLUSH_SECONDS,
    },
    "decisions-prune": {
        "task": "apps.routing.tasks.decisions_prune_task",
        "schedule": crontab(hour=3, minute=45),
    },
    "slo-evaluate": {
        "task": "apps.routing.scaling.tasks.slo_evaluate_task",
        "schedule": DMX_SLO_EVALUATION_SECONDS,
    },
    "usage-prune": {
        "task": "apps.billing.tasks.usage_prune_task",
        "schedule": crontab(hour=3, minute=30),
    },
    "usage-flush": {
        "task": "apps.billing.tasks.usage_flush_task",
        "schedule": DMX_USAGE_FLUSH_SECONDS,
    },
    "stored-responses-flush": {
        "task": "apps.gateway.tasks.stored_responses_flush_task",
        "schedule": DMX_USAGE_FLUSH_SECONDS,
    },
    "stored-responses-purge": {
        "task": "apps.gateway.tasks.stored_responses_purge_task",
        "schedule": crontab(hour=3, minute=50),
    },
    "nodes-sync": {
        "task": "apps.hardware.tasks.nodes_sync_task",
        "schedule": DMX_NODE_STALE_CHECK_SECONDS,
    },
    "billing-alerts": {
        "task": "apps.billing.tasks.billing_alerts_task",
        "schedule": DMX_BILLING_ALERTS_SECONDS,
    },
    "batches-work": {
        "task": "apps.batches.tasks.batches_work_task",
        "schedule": DMX_BATCH_TICK_SECONDS,
    },
    "batch-files-purge": {
        "task": "apps.batches.tasks.batch_files_purge_task",
        "schedule": crontab(hour=3, minute=55),
    },
    "billing-ledger-check": {
        "task": "apps.billing.tasks.billing_ledger_check_task",
        "schedule": DMX_BALANCE_LEDGER_CHECK_SECONDS,
    },
}
