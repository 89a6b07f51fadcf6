"""The management REST API (/api/v1/): DRF, its schema and its pagination."""

REST_FRAMEWORK = {
    "EXCEPTION_HANDLER": "dmxplatform.errors.drf_exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    # Each API names its own: node tokens for the internal one, management tokens and the
    # browser session for the management one (DMX_MANAGEMENT_API below).
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
}

# Who calls the management API (dmxplatform.api, every app's /api/v1 views): the identity app's
# management tokens or the portal's session, and a tenant's members unless a view says otherwise.
DMX_MANAGEMENT_API = {
    "AUTHENTICATION_CLASSES": [
        "apps.keys.api.auth.ManagementTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "MEMBER_PERMISSION_CLASSES": ["apps.keys.api.auth.TenantMember"],
    # For apps below the identity app (dmxplatform.api.TenantScopedApiMixin): who may change a
    # tenant's things, and the id of the tenant a member's call acts in.
    "OWNER_PERMISSION_CLASSES": ["apps.keys.api.auth.TenantOwner"],
    "TENANT_OF": "apps.keys.api.auth.request_tenant_id",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "DMX management API",
    "DESCRIPTION": (
        "Keys, usage, quotas, members, prices, billing (balance, movements, budgets, "
        "statements, redemption codes) and (for operators) tenants, plans, top-ups, code "
        "batches, nodes and routing rules. Authenticate with a management token "
        "(`Authorization: Bearer dmx-mgmt-...`) or the portal's session. Errors have OpenAI's "
        'shape: `{"error": {"message", "type", "param", "code"}}`. Amounts of money are decimal '
        "strings with six places, in the platform's currency."
    ),
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The schema is the management API's; the internal node and alert APIs are not in it.
    "PREPROCESSING_HOOKS": ["dmxplatform.api.schema.management_endpoints_only"],
    "ENUM_NAME_OVERRIDES": {
        "QuotaPeriodEnum": "apps.keys.choices.QuotaPeriod",
        "TokenScopeEnum": "apps.keys.choices.TokenScope",
        "QuotaScopeEnum": "apps.keys.api.serializers.QUOTA_SCOPES",
        "BudgetPeriodEnum": "apps.billing.choices.BudgetPeriod",
        "BillingModeEnum": "apps.billing.choices.BillingMode",
        "MovementKindEnum": "apps.billing.choices.MovementKind",
        # A key's priority and a routing rule's tier are the same tiers.
        "PriorityTierEnum": "apps.keys.choices.PriorityTier",
    },
}
