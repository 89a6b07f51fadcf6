from django.urls import path

from apps.portal import views

app_name = "portal"

urlpatterns = [
    path("", views.home, name="home"),
    path("tenant/", views.tenant_switch, name="tenant_switch"),
    path("keys/", views.keys, name="keys"),
    path("keys/new/", views.key_create, name="key_create"),
    path("keys/<str:key_id>/rotate/", views.key_rotate, name="key_rotate"),
    path("keys/<str:key_id>/revoke/", views.key_revoke, name="key_revoke"),
    path("usage/", views.usage, name="usage"),
    path("usage/export.csv", views.usage_export, name="usage_export"),
    path("batches/", views.batches, name="batches"),
    path("batches/files/<str:file_id>", views.batch_file, name="batch_file"),
    path("billing/", views.billing, name="billing"),
    path("billing/redeem/", views.redeem, name="billing_redeem"),
    path("billing/budgets/", views.budget_set, name="billing_budget_set"),
    path(
        "billing/budgets/<int:budget_id>/delete/",
        views.budget_delete,
        name="billing_budget_delete",
    ),
    path("billing/alerts/", views.billing_alerts, name="billing_alerts"),
    path("billing/statement/", views.statement, name="billing_statement"),
    path("billing/statement.csv", views.statement_export, name="billing_statement_export"),
    path("prices/", views.prices, name="prices"),
    path("members/", views.members, name="members"),
    path("members/<int:membership_id>/role/", views.member_role, name="member_role"),
    path("members/<int:membership_id>/remove/", views.member_remove, name="member_remove"),
    path(
        "invitations/<int:invitation_id>/withdraw/",
        views.invitation_withdraw,
        name="invitation_withdraw",
    ),
    path("invitations/<str:token>/", views.invitation_accept, name="invitation_accept"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<str:token_id>/revoke/", views.token_revoke, name="token_revoke"),
    path("docs/", views.docs, name="docs"),
    path("playground/", views.playground, name="playground"),
]
